"""Pulling the question, the response and the golden answers out of each framework's inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepgap.data_builders.rollout_formats import question_line


def text_of(message_or_text: Any) -> str:
    """Plain text, or the content of a conversational turn list (the last message's content)."""
    if isinstance(message_or_text, str):
        return message_or_text
    if isinstance(message_or_text, list) and message_or_text:
        last = message_or_text[-1]
        if isinstance(last, dict) and "content" in last:
            content = last["content"]
            if isinstance(content, list):  # multimodal content parts
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content)
    raise ValueError(
        f"expected a string or a list of chat messages, got {type(message_or_text).__name__}"
    )


def question_from_prompt(prompt: Any) -> str:
    """The question of a prompt: after `Question:` (Search-R1's template), else the user turn."""
    if isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = text_of(users[-1:] or prompt)
    return question_line(prompt) or prompt.strip()


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
    if isinstance(value, Sequence) or hasattr(value, "tolist"):
        items = value.tolist() if hasattr(value, "tolist") else list(value)
        return [str(x) for x in items]
    raise ValueError(f"cannot read golden answers from {type(value).__name__}")
