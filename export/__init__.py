"""Export: the trained checker as one offline bundle (merged student + ONNX NLI), and the Hub."""

from __future__ import annotations

from .bundle import BundleError, export_bundle, verify_bundle
from .onnx_nli import ExportError, check_parity, export_onnx

__all__ = [
    "BundleError",
    "ExportError",
    "check_parity",
    "export_bundle",
    "export_onnx",
    "verify_bundle",
]
