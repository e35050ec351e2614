"""Export: the trained checker as one offline bundle (merged student + ONNX NLI), and the Hub."""

from __future__ import annotations

from .bundle import BundleError, export_bundle, probe_pairs, summarize_eval_report, verify_bundle
from .onnx_nli import ExportError, check_parity, export_onnx
from .push import push_bundle

__all__ = [
    "BundleError",
    "ExportError",
    "check_parity",
    "export_bundle",
    "export_onnx",
    "probe_pairs",
    "push_bundle",
    "summarize_eval_report",
    "verify_bundle",
]
