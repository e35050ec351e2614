"""The tag grammar of Search-R1 and Hermes responses, with one tolerance for every reader.

A tag is `<name>` or `</name>` for the names below, in any case and with spaces inside the
angle brackets (`< Answer >`, `</ search>`), as docs/contract.md (section 2) fixes it.
Segmentation, the rollout loop and the reward all read responses through this module, so a
response that one of them reads as a search or an answer, the others read the same way.
(The rollout loop's stop strings, sent to a model server, stay the literal `</search>` and
`</answer>`: they are what a policy is prompted to write.)
"""

from __future__ import annotations

import re

TAG_NAMES = ("think", "search", "information", "answer", "tool_call", "tool_response", "feedback")
ACTIONS = frozenset({"search", "answer", "tool_call"})  # each closes a step
EVIDENCE = frozenset({"information", "tool_response"})  # retrieval output, never model text
NOTES = frozenset({"feedback"})  # stepgap's typed notes to the policy: neither claim nor evidence
# The notes (`stepgap.feedback`): one line per gap type, what is wrong with the last step, then
# the repair. A `<feedback>` block is a note only when its text is one of these (its label in
# brackets after it); any other is the model's own text, read as the claim it is, so a policy
# cannot hide a claim from the checker in a tag of its own.
NOTE_TEXT: dict[str, str] = {
    "CC": "the last claim is contradicted by the evidence or strays from the question: retract it",
    "IE": "the evidence found is not about what the last claim needs: search again",
    "MB": "the last claim is not yet supported by the evidence: search for the bridging fact",
}
_NOTE_CONTENT = frozenset(f"{text} ({label})" for label, text in NOTE_TEXT.items())

_NAMES = "|".join(TAG_NAMES)
TAG = re.compile(rf"<\s*(/?)\s*({_NAMES})\s*>", re.IGNORECASE)
"""Any tag: group 1 is `/` for a closing one, group 2 the name as written."""
OPEN = re.compile(rf"<\s*({_NAMES})\s*>", re.IGNORECASE)
_CLOSE = {name: re.compile(rf"<\s*/\s*{name}\s*>", re.IGNORECASE) for name in TAG_NAMES}
_OPEN_ONE = {name: re.compile(rf"<\s*{name}\s*>", re.IGNORECASE) for name in TAG_NAMES}
_NOTE_OPEN = re.compile(rf"<\s*({'|'.join(sorted(NOTES))})\s*>", re.IGNORECASE)


def opening(name: str) -> re.Pattern[str]:
    """`<name>` in any case, spaces inside."""
    return _OPEN_ONE[name]


def closing(name: str) -> re.Pattern[str]:
    """`</name>` in any case, spaces inside."""
    return _CLOSE[name]


def is_note(content: str) -> bool:
    """Whether a `<feedback>` block's content is one of stepgap's notes (`NOTE_TEXT`)."""
    return content.strip() in _NOTE_CONTENT


def strip_notes(text: str) -> str:
    """`text` without its notes (`is_note`): a note inside a retrieval block is not evidence;
    another `<feedback>` block stays as it is."""
    parts: list[str] = []
    pos = 0
    while (opened := _NOTE_OPEN.search(text, pos)) is not None:
        closed = _CLOSE[opened.group(1).lower()].search(text, opened.end())
        if closed is not None and is_note(text[opened.end() : closed.start()]):
            parts.append(text[pos : opened.start()])
            pos = closed.end()
        else:
            parts.append(text[pos : opened.end()])
            pos = opened.end()
    return "".join(parts) + text[pos:]


def first_block(text: str, names: tuple[str, ...]) -> tuple[str, str] | None:
    """(name in lower case, content) of the first complete `<name>...</name>` block of one of
    `names` in `text`, or None: what a rollout turn did (its first search or answer)."""
    best: tuple[int, str, str] | None = None
    for name in names:
        opened = _OPEN_ONE[name].search(text)
        if opened is None or (best is not None and opened.start() >= best[0]):
            continue
        closed = _CLOSE[name].search(text, opened.end())
        if closed is not None:
            best = (opened.start(), name, text[opened.end() : closed.start()])
    return None if best is None else (best[1], best[2])


def last_block(text: str, name: str) -> str | None:
    """The content of the last `<name>` block of `text` (an unclosed one runs to the end), or
    None when there is none: the final answer of a response."""
    opens = list(_OPEN_ONE[name].finditer(text))
    if not opens:
        return None
    close = _CLOSE[name].search(text, opens[-1].end())
    return text[opens[-1].end() : close.start() if close else len(text)]
