"""Split a search-interleaved response into steps (docs/contract.md, section 2).

Every action (`<search>`, a Hermes `<tool_call>` to `search`, or `<answer>`) closes one step.
The step's claim is the model's own text since the previous step, its evidence the retrieval
block(s) after the action. Tags are read as `stepgap.tags` reads them (any case, spaces
inside); an unclosed tag runs to the end of the response. Only a malformed action (a tool call
that is not a search call in JSON) makes a response unusable, and that raises
`SegmentationError` with a reason, never anything else.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepgap.io import (
    PARQUET_SUFFIXES,
    ErrorReport,
    JsonlWriter,
    UnreadableFileError,
    check_output,
    read_models,
    write_parquet,
)
from stepgap.schema import Snippet, Step, Trace
from stepgap.tags import ACTIONS, EVIDENCE, NOTES, OPEN, TAG, closing, is_note, strip_notes

log = logging.getLogger(__name__)

_DOC_HEAD = re.compile(r"Doc\s*\d+\s*\(\s*Title\s*:\s*", re.IGNORECASE)


class SegmentationError(ValueError):
    """A response that cannot be split into steps; the message says why."""


def collapse_ws(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class _Block:
    name: str
    start: int  # position of '<' of the opening tag
    content_start: int
    content_end: int
    end: int  # position after the closing tag (or len(text) when unclosed)


def _block(text: str, m: re.Match[str]) -> _Block:
    """The block opened by `m`. A retrieval block ends at its *last* closing tag before the next
    opening tag: retrieved text that contains a literal `</information>` (a page about HTML,
    or an injection that fakes the end of the evidence) stays evidence, never model text."""
    name = m.group(2).lower()
    close = closing(name).search(text, m.end())
    if close is not None and name in EVIDENCE:
        nxt = OPEN.search(text, m.end())
        while nxt is not None and nxt.group(1).lower() in NOTES:  # a note may sit inside
            nxt = OPEN.search(text, nxt.end())
        limit = nxt.start() if nxt else len(text)
        for later in closing(name).finditer(text, close.end(), limit):
            close = later
    if close is None:
        return _Block(name, m.start(), m.end(), len(text), len(text))
    return _Block(name, m.start(), m.end(), close.start(), close.end())


def parse_snippets(block: str) -> list[Snippet]:
    """Split a retrieval block into `Doc N(Title: T) text` snippets.

    Titles may be quoted or bare and may contain balanced parentheses. A block without that
    pattern is one snippet with an empty title (an empty block: one snippet with empty text);
    text before the first `Doc N(...)` item is not a document and is ignored.
    """
    heads = list(_DOC_HEAD.finditer(block))
    if not heads:
        return [Snippet(title="", text=block.strip())]
    snippets: list[Snippet] = []
    for i, head in enumerate(heads):
        stop = heads[i + 1].start() if i + 1 < len(heads) else len(block)
        title, body_start = _read_title(block, head.end(), stop)
        snippets.append(Snippet(title=title, text=block[body_start:stop].strip()))
    return snippets


def _read_title(block: str, pos: int, stop: int) -> tuple[str, int]:
    """Read the title after `Title:` up to its closing parenthesis; return (title, body start)."""
    if block.startswith('"', pos):
        close = block.find('")', pos + 1, stop)
        if close >= 0:
            return block[pos + 1 : close], close + 2
    depth = 0
    for j in range(pos, stop):
        ch = block[j]
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return block[pos:j].strip().strip('"'), j + 1
            depth -= 1
    # No closing parenthesis: the title runs to the end of the line.
    eol = block.find("\n", pos, stop)
    eol = stop if eol < 0 else eol
    return block[pos:eol].strip().strip('"'), eol


def _tool_call_query(payload: str, ordinal: int) -> str:
    """The query of a Hermes `<tool_call>` to the search tool."""
    try:
        call = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise SegmentationError(f"tool_call {ordinal} is not valid JSON: {exc.msg}") from None
    if not isinstance(call, dict):
        raise SegmentationError(f"tool_call {ordinal} must be a JSON object")
    name = call.get("name")
    if not isinstance(name, str) or name.lower() != "search":
        raise SegmentationError(f"tool_call {ordinal} calls {name!r}; only 'search' is supported")
    args = call.get("arguments", {})
    if isinstance(args, str):  # OpenAI-style calls carry arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise SegmentationError(f"tool_call {ordinal} arguments are not valid JSON") from None
    query = args.get("query") if isinstance(args, dict) else None
    if isinstance(query, list) and all(isinstance(q, str) for q in query):
        query = "; ".join(query)
    if not isinstance(query, str):
        raise SegmentationError(f"tool_call {ordinal} has no string 'arguments.query'")
    return query.strip()


def segment_response(response: str) -> list[Step]:
    """Split one raw response into steps with character spans (docs/contract.md, section 2)."""
    if not isinstance(response, str):
        raise SegmentationError(f"response must be a string, got {type(response).__name__}")
    steps: list[Step] = []
    claim_parts: list[str] = []  # the model's own text since the previous step
    step_start = 0
    pos = 0
    tool_calls = 0
    while True:
        m = TAG.search(response, pos)
        if m is None:
            break
        claim_parts.append(response[pos : m.start()])
        closing, name = m.group(1), m.group(2).lower()
        if closing or name == "think":
            pos = m.end()  # think tags are dropped, their content is the claim
            continue
        block = _block(response, m)
        content = response[block.content_start : block.content_end]
        if name in NOTES and not is_note(content):  # the model's own tag: its text is claim
            pos = m.end()
            continue
        if name in EVIDENCE or name in NOTES:  # retrieval with no action before it, a note
            pos = block.end
            continue
        claim = collapse_ws("".join(claim_parts))
        if name == "answer":
            steps.append(
                Step(
                    index=len(steps),
                    type="conclusion",
                    claim=claim,
                    answer=content.strip(),
                    span=(step_start, block.end),
                )
            )
            return steps  # steps after the first answer are ignored
        if name == "tool_call":
            tool_calls += 1
            query = _tool_call_query(content, tool_calls)
        else:
            query = content.strip()
        evidence, step_end = _collect_evidence(response, block.end)
        steps.append(
            Step(
                index=len(steps),
                type="inference",
                claim=claim,
                query=query,
                evidence=evidence,
                span=(step_start, step_end),
            )
        )
        claim_parts = []
        step_start = pos = step_end
    claim_parts.append(response[pos:])
    trailing = collapse_ws("".join(claim_parts))
    if trailing:
        steps.append(
            Step(
                index=len(steps), type="inference", claim=trailing, span=(step_start, len(response))
            )
        )
    return steps


def _collect_evidence(response: str, pos: int) -> tuple[list[Snippet], int]:
    """Snippets of the retrieval blocks between an action and the next action; and where they end."""
    evidence: list[Snippet] = []
    end = pos
    while True:
        m = TAG.search(response, pos)
        if m is None:
            return evidence, end
        name = m.group(2).lower()
        if m.group(1) or name == "think":
            pos = m.end()
            continue
        if name in ACTIONS:
            return evidence, end
        block = _block(response, m)
        if name in NOTES and not is_note(response[block.content_start : block.content_end]):
            return evidence, end  # the model's own text: the next step's claim starts here
        if name not in NOTES:  # a note after the evidence belongs to the step, not its evidence
            content = strip_notes(response[block.content_start : block.content_end])
            evidence.extend(parse_snippets(content))
        pos = end = block.end


def accumulated_evidence(steps: list[Step], index: int) -> list[Snippet]:
    """The evidence of steps 0..index, in order: what step `index` may rely on."""
    return [s for step in steps[: index + 1] for s in step.evidence]


def segment_trace(trace: Trace) -> Trace:
    """Return `trace` with `steps` filled from `response` (already segmented traces pass through)."""
    if trace.steps is not None:
        steps = trace.steps
    else:
        steps = segment_response(trace.response or "")
    if not steps:
        raise SegmentationError("response has no steps (no action and no text)")
    return trace.model_copy(update={"steps": steps})


def normalize_rollout(record: dict[str, Any]) -> dict[str, Any]:
    """Map Search-R1 parquet/rollout columns onto the Trace contract (id, question, answers)."""
    out = dict(record)
    if "id" not in out:
        extra = out.get("extra_info") or {}
        if isinstance(extra, dict) and "index" in extra:
            split = extra.get("split")
            out["id"] = f"{split}-{extra['index']}" if split else extra["index"]
    if "golden_answers" not in out:
        gt = (out.get("reward_model") or {}).get("ground_truth")
        if isinstance(gt, dict) and "target" in gt:
            out["golden_answers"] = gt["target"]
        elif gt is not None:
            out["golden_answers"] = gt
    return out


_NO_TAGS = (
    "has no tags (no <search>, <information>, <think> or <answer>): its whole response was "
    "read as one inference step"
)


def iter_traces(
    path: str | Path, report: ErrorReport | None = None, *, segment: bool = True
) -> Iterator[Trace]:
    """Read traces from a file, segmenting raw ones; bad records are reported and skipped (a
    file of another format, or of which no trace can be read or segmented, is an error). A raw
    response without a single tag is one inference step, which is logged: the first such trace
    by its id, then how many there were at the end of the file."""
    report = report if report is not None else ErrorReport()
    before, read, kept, untagged = len(report), 0, 0, 0
    for lineno, trace in read_models(path, Trace, report, prepare=normalize_rollout):
        read += 1
        if not segment:
            yield trace
            continue
        try:
            segmented = segment_trace(trace)
        except SegmentationError as exc:
            report.add(path, lineno, f"trace {trace.id!r}: {exc}", field="response")
            continue
        if trace.steps is None and TAG.search(trace.response or "") is None:
            untagged += 1
            if untagged == 1:  # the first at once, the others counted at the end of the file
                log.warning("%s:%d: trace %r %s", path, lineno, trace.id, _NO_TAGS)
        kept += 1
        yield segmented
    if untagged > 1:
        log.warning("%s: %d traces in all have no tags, each read as one inference step",
                    path, untagged)  # fmt: skip
    if segment and read and not kept:
        raise UnreadableFileError(
            f"{path}: none of its {read} trace(s) has steps; the first: {report.errors[before]}"
        )


def segment_file(
    input_path: str | Path, output: str | Path, report: ErrorReport | None = None
) -> int:
    """Segment every trace of `input_path` into `output` (JSONL, or Parquet for a `.parquet`
    name); returns the traces written.

    Bad records go to `report` (file, line, field, reason) and never stop the rest of the file.
    """
    if Path(output).suffix.lower() in PARQUET_SUFFIXES:
        check_output(output, input_path)
        return write_parquet(output, iter_traces(input_path, report), input_path)
    n = 0
    with JsonlWriter(output, input_path) as out:
        for trace in iter_traces(input_path, report):
            out.write(trace)
            n += 1
    return n
