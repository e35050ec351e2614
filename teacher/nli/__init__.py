"""NLI backends for stages D and E, chosen by a spec string (`replay:FILE`, `hf:ID`, or an id)."""

from __future__ import annotations

from typing import Any

from stepgap.tree import NLIError, Pair, nli_label

from .base import NLIBackend
from .hf import DEFAULT_NLI_MODEL, HFNLI
from .replay import ReplayNLI


def load_nli(spec: str, **kwargs: Any) -> NLIBackend:
    """Build an NLI backend from `replay:FILE`, `hf:ID_OR_PATH`, `onnx:PATH` (an exported
    folder) or a bare hub id / local path."""
    kind, sep, arg = spec.partition(":")
    if sep and kind == "replay":
        return ReplayNLI.from_file(arg)  # stored answers: device/dtype options do not apply
    if sep and kind == "hf":
        return HFNLI(arg, **kwargs)
    if sep and kind == "onnx":
        from .onnx import ONNXNLI

        options = {k: v for k, v in kwargs.items() if k in ("batch_size", "max_length")}
        return ONNXNLI(arg, **options)
    return HFNLI(spec, **kwargs)


__all__ = [
    "DEFAULT_NLI_MODEL",
    "HFNLI",
    "NLIBackend",
    "NLIError",
    "Pair",
    "ReplayNLI",
    "load_nli",
    "nli_label",
]
