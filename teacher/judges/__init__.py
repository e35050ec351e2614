"""Judge backends for stages A-C behind one interface, chosen by a spec string."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import (
    JudgeBackend,
    JudgeParseError,
    JudgeRequest,
    JudgeResult,
    judge_json_schema,
    parse_judge,
    response_format,
)
from .replay import ReplayJudge

_REGISTRY: dict[str, Callable[..., JudgeBackend]] = {
    "replay": lambda arg, **kw: ReplayJudge.from_file(arg),
}


def register_judge(kind: str, factory: Callable[..., JudgeBackend]) -> None:
    """Make `kind:ARG` specs build a backend with `factory(ARG, **options)`."""
    _REGISTRY[kind] = factory


def load_judge(spec: str, **kwargs: Any) -> JudgeBackend:
    """Build a judge from `KIND:ARG`, e.g. `replay:judges.jsonl`."""
    kind, sep, arg = spec.partition(":")
    if not sep or kind not in _REGISTRY:
        known = ", ".join(f"{k}:..." for k in sorted(_REGISTRY))
        raise ValueError(f"unknown judge spec {spec!r}; expected one of {known}")
    return _REGISTRY[kind](arg, **kwargs)


__all__ = [
    "JudgeBackend",
    "JudgeParseError",
    "JudgeRequest",
    "JudgeResult",
    "ReplayJudge",
    "judge_json_schema",
    "load_judge",
    "parse_judge",
    "register_judge",
    "response_format",
]
