"""Judge backends for stages A-C behind one interface, chosen by a spec string."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepgap.options import Options
from stepgap.registry import Registry

from .base import (
    JUDGE_GROUP,
    JudgeBackend,
    JudgeConfigError,
    JudgeParseError,
    JudgeRequest,
    StepData,
    close_judge,
    judge_json_schema,
    parse_judge,
    response_format,
)
from .cache import JudgeCache, default_cache_path
from .cost import PRICES, CostMeter
from .model_judge import ModelJudgeOptions
from .replay import ReplayJudge

# The teacher's judges are the backend modules of this package (`JUDGES.builtins()` lists them:
# a module here that defines a `JudgeBackend` with a `name` of its own is the judge of that
# kind, its options classes part of `CheckerConfig`); the student's (`student:PATH`) is added
# by `stepgap.student`, a layer above, as it is imported; a plug-in declares its own under
# `stepgap.judges`.
JUDGES: Registry[JudgeBackend] = Registry(
    "judge",
    "stepgap.judges",
    JudgeBackend,
    package=__name__,
    bare="openai:{spec} (a model behind an OpenAI-compatible API) or hf:{spec} (a local model)",
)


def register_judge(kind: str, backend: str | type[JudgeBackend]) -> None:
    """Make `kind:ARG` specs build `backend` (a `JudgeBackend` subclass, or its import path
    `"module:Class"`) in this process; installed packages use the entry point."""
    JUDGES.register(kind, backend)


def build_judge(
    spec: str,
    options: Options | Mapping[str, Any] | None = None,
    *,
    online: bool = False,
    **values: Any,
) -> JudgeBackend:
    """A judge from `KIND:ARG`: `openai:gpt-4.1-mini`, `hf:PATH_OR_ID`, `replay:FILE`,
    `student:PATH` (once `stepgap.student` is imported), or an installed plug-in's kind.

    Its options are an instance of its class's `options_class` (`OpenAIJudgeOptions`,
    `HFJudgeOptions`, ...), or their fields by name (`build_judge("openai:m",
    base_url="http://127.0.0.1:8000/v1")`); one the backend does not have is an error naming
    it. A model judge keeps the answer cache and the cost meter its options name.
    `online`: for a server (a local judge on vLLM runs its async engine)."""
    if values:
        if options is not None:
            raise TypeError("give the judge's options as one object or as keywords, not both")
        options = values
    return JUDGES.build(spec, options, online=online)


__all__ = [
    "PRICES",
    "CostMeter",
    "JudgeCache",
    "default_cache_path",
    "JUDGE_GROUP",
    "JudgeBackend",
    "JudgeConfigError",
    "JudgeParseError",
    "JudgeRequest",
    "JUDGES",
    "ReplayJudge",
    "StepData",
    "close_judge",
    "judge_json_schema",
    "build_judge",
    "ModelJudgeOptions",
    "parse_judge",
    "register_judge",
    "response_format",
]
