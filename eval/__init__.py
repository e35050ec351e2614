"""Checker evaluation: the metrics of the method contract, the report, baselines and plots."""

from .report import Evaluation, build_report, evaluate

__all__ = ["Evaluation", "build_report", "evaluate"]
