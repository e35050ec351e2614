"""NLI backends for stages D and E, chosen by a spec string (`replay:FILE`, `hf:ID`, or an id)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepgap.options import Options
from stepgap.registry import Registry

from .base import NLI_GROUP, NLIBackend, NLIOptions
from .hf import DEFAULT_NLI_MODEL, HFNLI
from .replay import ReplayNLI

NLI_BACKENDS: Registry[NLIBackend] = Registry(
    "NLI",
    "stepgap.nli",
    NLIBackend,
    builtin={
        "hf": "stepgap.teacher.nli.hf:HFNLI",
        "onnx": "stepgap.teacher.nli.onnx:ONNXNLI",
        "replay": "stepgap.teacher.nli.replay:ReplayNLI",
    },
    default="hf",
)


def load_nli(
    spec: str, options: Options | Mapping[str, Any] | None = None, **values: Any
) -> NLIBackend:
    """An NLI backend from `replay:FILE`, `hf:ID_OR_PATH`, `onnx:PATH` (an exported folder), a
    bare hub id / local path (hf), or an installed plug-in's `KIND:ARG`. Its options are an
    instance of its `options_class` or their fields by name (`load_nli(spec, device="cpu")`);
    one the backend does not have is an error naming it."""
    if values:
        if options is not None:
            raise TypeError("give the NLI model's options as one object or as keywords, not both")
        options = values
    return NLI_BACKENDS.build(spec, options)


__all__ = [
    "DEFAULT_NLI_MODEL",
    "HFNLI",
    "NLI_BACKENDS",
    "NLI_GROUP",
    "NLIBackend",
    "NLIOptions",
    "ReplayNLI",
    "load_nli",
]
