"""The judge interface (stages A-C): chat prompts in, validated judge objects out.

A backend never guesses: an answer that is not a schema-valid judge object becomes a
`JudgeResult` with `error` set, and the tree turns that into a verdict with no label.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from stepgap.data_builders.schema import Judge, StepType

Messages = list[dict[str, str]]


@dataclass
class JudgeRequest:
    """One step to judge: who it is (for replay and caching) and the prompt to send."""

    trace_id: str
    step: int
    step_type: StepType
    messages: Messages


@dataclass
class JudgeResult:
    """A judge object, or the reason there is none; `confidences` maps stage letter to prob."""

    judge: Judge | None
    confidences: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # beyond the judge: a student's path, label

    @classmethod
    def failed(cls, error: str, usage: dict[str, int] | None = None) -> JudgeResult:
        return cls(judge=None, error=error, usage=usage or {})


@runtime_checkable
class JudgeBackend(Protocol):
    name: str

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]: ...


class JudgeConfigError(RuntimeError):
    """The judge cannot work at all (credentials, model name): stop, do not label errors."""


class JudgeParseError(ValueError):
    """The judge's text is not a schema-valid judge object."""


def parse_judge(text: str) -> Judge:
    """Parse and validate a judge answer; a fenced ```json block is accepted, nothing looser."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        raise JudgeParseError(f"judge answer is not JSON ({exc.msg} at char {exc.pos})") from None
    try:
        return Judge.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise JudgeParseError(
            f"judge answer violates the schema at {loc or '<root>'}: {first['msg']}"
            + (f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else "")
        ) from None


def judge_json_schema() -> dict[str, Any]:
    """The judge object as a JSON schema for OpenAI strict structured output.

    Strict mode wants every object closed (`additionalProperties: false`), every property
    required and no `$ref`, so the pydantic schema is inlined.
    """
    schema = Judge.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]]))
            node = {k: inline(v) for k, v in node.items() if k != "title"}
            if node.get("type") == "object":
                node["additionalProperties"] = False
                node["required"] = list(node.get("properties", {}))
            return node
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


def response_format(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `response_format` argument for chat completions with a strict schema (by default the
    teacher's judge schema)."""
    schema = schema if schema is not None else judge_json_schema()
    return {
        "type": "json_schema",
        "json_schema": {"name": "stepgap_judge", "strict": True, "schema": schema},
    }
