"""Judge backends for stages A-C behind one interface, chosen by a spec string."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stepgap.registry import Registry
from stepgap.tree import JudgeResult

from .base import (
    JudgeBackend,
    JudgeConfigError,
    JudgeParseError,
    JudgeRequest,
    close_judge,
    judge_json_schema,
    parse_judge,
    response_format,
)
from .cache import JudgeCache, default_cache_path
from .cost import PRICES, CostMeter
from .replay import ReplayJudge

# Judges are the entry points of `stepgap.judges` (stepgap's own in its pyproject.toml: openai,
# hf, replay, and the student's, which live a layer above); a plug-in registers its own there.
JUDGES: Registry[JudgeBackend] = Registry(
    "judge",
    "stepgap.judges",
    bare="openai:{spec} (a model behind an OpenAI-compatible API) or hf:{spec} (a local model)",
)


def register_judge(kind: str, factory: str | Callable[..., JudgeBackend]) -> None:
    """Make `kind:ARG` specs build a backend with `factory(ARG, **options)` in this process (a
    callable, or its import path `"module:name"`); installed packages use the entry point."""
    JUDGES.register(kind, factory)


def load_judge(spec: str, **options: Any) -> JudgeBackend:
    """Build a judge from `KIND:ARG`: `openai:gpt-4.1-mini`, `hf:PATH_OR_ID`, `student:PATH`,
    `replay:FILE`, or an installed plug-in's kind. An option the backend does not take is an
    error naming it (`stepgap.registry`)."""
    return JUDGES.build(spec, **options)


__all__ = [
    "PRICES",
    "CostMeter",
    "JudgeCache",
    "default_cache_path",
    "JudgeBackend",
    "JudgeConfigError",
    "JudgeParseError",
    "JudgeRequest",
    "JUDGES",
    "JudgeResult",
    "ReplayJudge",
    "close_judge",
    "judge_json_schema",
    "load_judge",
    "parse_judge",
    "register_judge",
    "response_format",
]
