"""Judge backends for stages A-C behind one interface, chosen by a spec string."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stepgap.registry import resolve
from stepgap.tree import JudgeResult

from .base import (
    JudgeBackend,
    JudgeConfigError,
    JudgeParseError,
    JudgeRequest,
    judge_json_schema,
    parse_judge,
    response_format,
)
from .cache import JudgeCache, default_cache_path
from .cost import PRICES, CostMeter
from .replay import ReplayJudge


def _openai(model: str, **options: Any) -> JudgeBackend:
    from .openai_api import load_openai_judge

    return load_openai_judge(model, **options)


def _hf(model: str, **options: Any) -> JudgeBackend:
    from .hf import load_hf_judge

    return load_hf_judge(model, **options)


# The student's backends live a layer above (stepgap.student): entered by import path
# (stepgap.registry), imported when a `student:` spec is first built.
_REGISTRY: dict[str, str | Callable[..., JudgeBackend]] = {
    "replay": lambda arg, **kw: ReplayJudge.from_file(arg),
    "openai": _openai,
    "hf": _hf,
    "student": "stepgap.student.judge:load_student_judge",
    # what `--bundle B --judge openai:NAME` builds
    "openai-student": "stepgap.student.judge:load_served_student_judge",
}


def register_judge(kind: str, factory: str | Callable[..., JudgeBackend]) -> None:
    """Make `kind:ARG` specs build a backend with `factory(ARG, **options)` (a callable, or
    its import path `"module:name"`)."""
    _REGISTRY[kind] = factory


def load_judge(spec: str, **kwargs: Any) -> JudgeBackend:
    """Build a judge from `KIND:ARG`: `openai:gpt-4.1-mini`, `hf:PATH_OR_ID`, `student:PATH`,
    `replay:FILE`.

    Options a backend does not take (e.g. `concurrency` for replay) are ignored.
    """
    kind, sep, arg = spec.partition(":")
    if not sep or kind not in _REGISTRY:
        known = ", ".join(f"{k}:..." for k in sorted(_REGISTRY))
        raise ValueError(f"unknown judge spec {spec!r}; expected one of {known}")
    return resolve(_REGISTRY[kind])(arg, **kwargs)


__all__ = [
    "PRICES",
    "CostMeter",
    "JudgeCache",
    "default_cache_path",
    "JudgeBackend",
    "JudgeConfigError",
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
