"""Judge backends for stages A-C behind one interface, chosen by a spec string."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stepgap.registry import Registry

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

# The teacher's judges; the student's (`student:PATH`) are added by `stepgap.student`, a layer
# above, as it is imported; a plug-in declares its own under `stepgap.judges`.
JUDGES: Registry[JudgeBackend] = Registry(
    "judge",
    "stepgap.judges",
    builtin={
        "openai": "stepgap.teacher.judges.openai_api:OpenAIJudge",
        "hf": "stepgap.teacher.judges.hf:HFJudge",
        "replay": "stepgap.teacher.judges.replay:ReplayJudge.from_file",
    },
    interface=JudgeBackend,
    bare="openai:{spec} (a model behind an OpenAI-compatible API) or hf:{spec} (a local model)",
)


def register_judge(kind: str, factory: str | Callable[..., JudgeBackend]) -> None:
    """Make `kind:ARG` specs build a backend with `factory(ARG, **options)` in this process (a
    callable, or its import path `"module:name"`); installed packages use the entry point."""
    JUDGES.register(kind, factory)


def load_judge(spec: str, **options: Any) -> JudgeBackend:
    """Build a judge from `KIND:ARG`: `openai:gpt-4.1-mini`, `hf:PATH_OR_ID`, `replay:FILE`,
    `student:PATH` (once `stepgap.student` is imported), or an installed plug-in's kind. An option the backend does not take is an
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
    "ReplayJudge",
    "close_judge",
    "judge_json_schema",
    "load_judge",
    "parse_judge",
    "register_judge",
    "response_format",
]
