"""NLI backends for stages D and E, chosen by a spec string (`replay:FILE`, `hf:ID`, or an id)."""

from __future__ import annotations

from typing import Any

from stepgap.registry import Registry

from .base import NLIBackend
from .hf import DEFAULT_NLI_MODEL, HFNLI
from .replay import ReplayNLI

NLI_BACKENDS: Registry[NLIBackend] = Registry(
    "NLI",
    "stepgap.nli",
    builtin={
        "hf": "stepgap.teacher.nli.hf:HFNLI",
        "onnx": "stepgap.teacher.nli.onnx:ONNXNLI",
        "replay": "stepgap.teacher.nli.replay:ReplayNLI.from_file",
    },
    interface=NLIBackend,
    default="hf",
)


def load_nli(spec: str, **options: Any) -> NLIBackend:
    """Build an NLI backend from `replay:FILE`, `hf:ID_OR_PATH`, `onnx:PATH` (an exported
    folder), a bare hub id / local path (hf), or an installed plug-in's `KIND:ARG`. An option
    the backend does not take is an error naming it (`stepgap.registry`)."""
    return NLI_BACKENDS.build(spec, **options)


__all__ = [
    "DEFAULT_NLI_MODEL",
    "HFNLI",
    "NLI_BACKENDS",
    "NLIBackend",
    "ReplayNLI",
    "load_nli",
]
