"""Export: the trained checker as one offline bundle (merged student + ONNX NLI), the Hub, and the
bundle's offline checker (`OfflineChecker`; `load_checker` chooses it or the hybrid checker)."""

from __future__ import annotations

from .bundle import BundleError, export_bundle, probe_pairs, summarize_eval_report, verify_bundle
from .offline import OfflineChecker, load_checker
from .onnx_nli import ExportError, check_parity, export_onnx
from .push import push_bundle

__all__ = [
    "BundleError",
    "ExportError",
    "OfflineChecker",
    "check_parity",
    "export_bundle",
    "export_onnx",
    "load_checker",
    "probe_pairs",
    "push_bundle",
    "summarize_eval_report",
    "verify_bundle",
]
