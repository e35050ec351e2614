"""Pulling the question, the response and the golden answers out of each framework's inputs."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from stepgap.data_builders.qa import question_line
from stepgap.data_builders.rollout_formats import tool_call_text, tool_response_text
from stepgap.schema import to_plain

log = logging.getLogger(__name__)


def _content(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # multimodal content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _tool_call(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):  # OpenAI's wire form: a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return tool_call_text(function.get("name"), arguments)


def text_of(message_or_text: Any) -> str:
    """Plain text, or a completion's chat messages as one response text. A tool-calling
    completion (TRL's, with `tools` or an environment) is written as Qwen2.5's chat template
    writes it, without the role headers: each assistant turn's text and its `<tool_call>`s,
    each tool message inside `<tool_response>`; so every search is a step. Otherwise the last
    message's content."""
    if isinstance(message_or_text, str):
        return message_or_text
    messages = message_or_text
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        if not any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            return _content(messages[-1])
        parts = []
        for m in messages:
            if m.get("role") == "tool":
                parts.append(tool_response_text(_content(m)))
            else:  # TRL's parser moves a Qwen turn's <think> block into reasoning_content
                think = m.get("reasoning_content")
                think = f"<think>{think}</think>" if think else ""
                calls = [_tool_call(c) for c in m.get("tool_calls") or []]
                parts.append("\n".join(p for p in (think, _content(m), *calls) if p))
        return "\n".join(parts)
    raise ValueError(
        f"expected a string or a list of chat messages, got {type(message_or_text).__name__}"
    )


def question_from_prompt(prompt: Any) -> str:
    """The question of a prompt: after `Question:` (Search-R1's template), else the user turn,
    with a warning (once a process): the judge's "question" is then the whole turn, whatever
    else it holds."""
    global _WARNED_NO_QUESTION_LINE
    if isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = text_of(users[-1:] or prompt)
    found = question_line(prompt)
    if found:
        return found
    if not _WARNED_NO_QUESTION_LINE:
        _WARNED_NO_QUESTION_LINE = True
        shown = " ".join(prompt.split())[:80]
        log.warning(
            "a prompt has no `Question:` line (Search-R1's template): its user turn is taken as "
            "the question (%r...). Give the question itself where the turn holds more: a "
            "`question` column (TRL), extra_info.question (veRL, `stepgap prepare-verl-data`), "
            "or the template's line",
            shown,
        )
    return prompt.strip()


_WARNED_NO_QUESTION_LINE = False


def golden_list(value: Any) -> list[str]:
    """Golden answers as a list: a string, a list, or veRL's `{"target": [...]}`."""
    if isinstance(value, dict):
        for key in ("target", "golden_answers", "answers", "ground_truth"):
            if key in value:
                return golden_list(value[key])
        raise ValueError(
            f"golden answers dict has none of target/golden_answers/answers: {sorted(value)}"
        )
    if isinstance(value, str):
        return [value]
    value = to_plain(value)
    if isinstance(value, Sequence):
        return [str(x) for x in value]
    raise ValueError(f"cannot read golden answers from {type(value).__name__}")
