"""The two tag formats of a rollout: Search-R1's (one growing assistant turn, `<search>` and
`<information>`) and Hermes' (a `search` tool, `<tool_call>` / `<tool_response>`). Each gives
the first messages of a rollout and turns what the policy wrote into the rollout's next state
(`step`: a query to search, an answer, or an invalid turn); the prompts are the originals'.
The state of a rollout in progress (`Rollout`) and a policy's turn (`Generation`) live here too:
the formats read and write them, the policies and the run loop pass them along.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepgap.feedback import Told, feedback_counts
from stepgap.tags import first_block

from .qa import QAItem

# Search-R1's prompt, verbatim (make_prefix, template_type="base").
SEARCH_R1_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between "
    "<information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)
# execute_predictions: what Search-R1 appends after a turn with no valid action.
INVALID_ACTION = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
INFORMATION = "\n\n<information>{}</information>\n\n"

HERMES_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning first every time you get new information. "
    "If you lack some knowledge, call the search tool; it returns the top searched results. "
    "You can search as many times as you want. "
    "If you find no further external knowledge needed, provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the corpus and return the top documents for a query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "the search query"}},
            "required": ["query"],
        },
    },
}


def hermes_tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The Hermes tool block, as Qwen2.5's chat template writes it into the system message."""
    specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{specs}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def tool_call_text(name: Any, arguments: Any) -> str:
    """A tool call in Hermes text form, as Qwen2.5's chat template writes it."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def tool_response_text(body: str) -> str:
    """A tool's answer as Hermes / Qwen2.5 chat templates render a tool message."""
    return f"<tool_response>\n{body}\n</tool_response>"


FORMATS = ("search-r1", "hermes")


def question_text(question: str) -> str:
    """Search-R1's normalisation: stripped, with a final `?` added when missing."""
    question = question.strip()
    return question if question.endswith("?") else question + "?"


# --------------------------------------------------------------------------- state


@dataclass
class Generation:
    """What the policy wrote in one turn, and why it stopped."""

    text: str
    stop: str  # the stop string that ended it, "eos" or "length"
    tool_call: dict[str, Any] | None = None  # an API's native tool call (Hermes format)


@dataclass
class Rollout:
    """One rollout in progress: the conversation the policy continues and the trace text."""

    item: QAItem
    sample: int
    trace_id: str
    messages: list[dict[str, Any]]
    response: str = ""  # the raw trace text (what `segment` reads)
    prefix: str = ""  # assistant text the policy continues (Search-R1 format)
    turns: int = 0
    searches: int = 0
    invalid_turns: int = 0
    finish: str | None = None
    pending_query: str | None = None
    tool_call: dict[str, Any] | None = None
    told: list[Told] | None = None  # typed feedback, one per retrieval (None: feedback off)

    def record(self, policy: str, retriever: str, fmt: str, topk: int) -> dict[str, Any]:
        return {
            "id": self.trace_id,
            "question": self.item.question,
            "golden_answers": self.item.golden_answers,
            "data_source": self.item.data_source,
            "response": self.response,
            "question_id": self.item.id,
            "sample": self.sample,
            "rollout": {
                "policy": policy,
                "retriever": retriever,
                "format": fmt,
                "topk": topk,
                "turns": self.turns,
                "searches": self.searches,
                "finish": self.finish,
                "invalid_turns": self.invalid_turns,
                # What the policy wrote and was shown, Search-R1's invalid-action notes
                # included (only when it differs from `response`).
                **({"transcript": self.prefix} if self.invalid_turns else {}),
                **({"feedback": feedback_counts(self.told)} if self.told is not None else {}),
            },
        }


def cut_turn(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """Search-R1's `_postprocess_responses`: keep the turn up to the first `</search>` (else the
    first `</answer>`); also says which one ended it."""
    for stop in stops:
        if stop in text:
            return text.split(stop)[0] + stop, stop
    return text, None


class SearchR1Format:
    """Search-R1's own loop: one growing assistant turn with `<search>` / `<information>`."""

    name = "search-r1"
    stops = ("</search>", "</answer>")

    def start(self, item: QAItem) -> list[dict[str, Any]]:
        if item.prompt:
            return [dict(m) for m in item.prompt]  # a Search-R1 parquet's own prompt
        prompt = SEARCH_R1_TEMPLATE.format(question=question_text(item.question))
        return [{"role": "user", "content": prompt}]

    def step(self, r: Rollout, gen: Generation, last: bool) -> None:
        """Apply one turn: set `r.finish` or `r.pending_query`, extend the texts. On the last
        turn Search-R1 appends nothing after the model's text (`do_search=False`)."""
        text, _ = cut_turn(gen.text, self.stops)
        action = first_block(text, ("search", "answer"))
        r.response += text
        r.prefix += text
        if action is None and not last:
            # The note is the environment's, like an <information> block, but unwrapped: its
            # literal `<search> and </search>` would read as a search (and `<answer> and
            # </answer>` as an answer) to `segment` and `reward`. The policy sees it; the
            # trace keeps it in `rollout.transcript` only.
            r.prefix += INVALID_ACTION
            r.invalid_turns += 1
        if action and action[0] == "answer":
            r.finish = "answer"
        elif action:
            r.pending_query = action[1].strip()

    def observe(self, r: Rollout, passages: str | None) -> None:
        """The retrieved block after a search (None: the last turn, searched no more)."""
        if passages is not None:
            obs = INFORMATION.format(passages.strip())
            r.response += obs
            r.prefix += obs
        r.pending_query = None

    def add_note(self, r: Rollout, note: str) -> None:
        """A typed note after the retrieved block, shown to the policy and kept in the trace
        (segmentation leaves it out of claims and evidence)."""
        r.response += note + "\n\n"
        r.prefix += note + "\n\n"


class HermesFormat:
    """A `search` tool in the Hermes format: each tool call ends an assistant turn and its
    `<tool_response>` comes back as the next message; the answer is given in `<answer>` tags.
    A turn with neither is the model's last word (`finish: no_action`)."""

    name = "hermes"
    stops = ("</tool_call>", "</answer>")

    def start(self, item: QAItem) -> list[dict[str, Any]]:
        prompt = HERMES_TEMPLATE.format(question=question_text(item.question))
        return [{"role": "user", "content": prompt}]

    def step(self, r: Rollout, gen: Generation, last: bool) -> None:
        text, _ = cut_turn(gen.text, self.stops)
        native = gen.tool_call
        if native is not None:  # an API's parsed tool call, written back in Hermes text form
            text = (text.rstrip() + "\n" if text.strip() else "") + tool_call_text(
                native["name"], native["arguments"]
            )
        r.response += text
        action = first_block(text, ("answer", "tool_call"))
        if action is None:
            r.finish = "no_action"
            return
        if action[0] == "answer":
            r.finish = "answer"
            return
        query = _tool_query(native if native is not None else action[1])
        if query is None:
            r.finish = "bad_tool_call"  # written as is: `segment` reports why
            return
        r.pending_query = query
        if native is None:
            r.messages.append({"role": "assistant", "content": text})
            r.tool_call = None
        else:
            r.tool_call = {**native, "id": native.get("id") or f"call_{uuid.uuid4().hex[:12]}"}
            r.messages.append(_assistant_with_call(text[: text.rfind("<tool_call>")], r.tool_call))

    def observe(self, r: Rollout, passages: str | None) -> None:
        if passages is not None:
            body = passages.strip()
            r.response += f"\n{tool_response_text(body)}\n"
            if r.tool_call is not None:
                tool = {"role": "tool", "tool_call_id": r.tool_call["id"], "content": body}
                r.messages.append(tool)
            else:  # what Hermes / Qwen2.5 chat templates render a tool message as
                r.messages.append({"role": "user", "content": tool_response_text(body)})
        r.pending_query = None
        r.tool_call = None

    def add_note(self, r: Rollout, note: str) -> None:
        """A typed note at the end of the tool's answer, inside its `<tool_response>` (and of
        the tool message the policy reads next)."""
        close = r.response.rfind("</tool_response>")
        r.response = r.response[:close].rstrip("\n") + f"\n{note}\n" + r.response[close:]
        message = r.messages[-1]
        content = message["content"]
        if message["role"] == "tool":
            message["content"] = f"{content}\n{note}"
        else:
            close = content.rfind("</tool_response>")
            message["content"] = content[:close].rstrip("\n") + f"\n{note}\n" + content[close:]


def _tool_query(call: Any) -> str | None:
    """The query of a `search` tool call (a parsed dict or its JSON text), else None."""
    if isinstance(call, str):
        try:
            call = json.loads(call)
        except json.JSONDecodeError:
            return None
    if not isinstance(call, dict) or str(call.get("name", "")).lower() != "search":
        return None
    args = call.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    query = args.get("query") if isinstance(args, dict) else None
    return query.strip() if isinstance(query, str) else None


def _assistant_with_call(content: str, call: dict[str, Any]) -> dict[str, Any]:
    args = call["arguments"]
    return {
        "role": "assistant",
        "content": content.strip() or None,
        "tool_calls": [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        ],
    }


def load_format(name: str) -> SearchR1Format | HermesFormat:
    if name == "search-r1":
        return SearchR1Format()
    if name == "hermes":
        return HermesFormat()
    raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {name!r}")


# --------------------------------------------------------------------------- policies
