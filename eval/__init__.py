"""Checker evaluation: the report, baselines, plots and the HTML view (the metrics are `stepgap.metrics`)."""

from .report import Evaluation, build_report, evaluate

__all__ = ["Evaluation", "build_report", "evaluate"]
