"""The evaluation report of docs/contract.md section 1 from gold and predicted verdict files.

Predictions are joined to gold on (trace id, step). A gold step absent from a prediction file is
counted in `missing_steps`, a step whose check failed (label null) in `error_steps`; both are
reported and left out of the step metrics, never silently scored as no_gap.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from stepgap.io import ErrorReport, read_models, read_steps_once, replacing
from stepgap.metrics import (
    answer_gap_table,
    balanced_accuracy_from_counts,
    binary_counts,
    binary_statistics,
    bootstrap_ci,
    bootstrap_cis,
    bootstrap_units,
    distribution,
    first_gap_types,
    flag_everything_q_f1,
    health_issues,
    is_healthy,
    q_f1,
    step_metrics,
    typed_macro_f1,
)
from stepgap.schema import GAP_TYPES, GapLabel

from .agreement import agreement_with

REPORT_JSON = "report.json"  # marks an evaluation folder, which a rerun replaces
SWEEP_THRESHOLDS = tuple(round(0.3 + 0.05 * i, 2) for i in range(13))  # 0.30 .. 0.90


class PredStep(BaseModel):
    """The part of a verdict the report reads."""

    model_config = ConfigDict(extra="ignore")

    trace_id: str
    step: int
    label: GapLabel | None = None
    confidence: float | None = None
    error: str | None = None
    checker: dict[str, Any] | None = None  # which models decided it (Verdict.checker)
    path: list[str] | None = None  # the tree's decision path; a PRM's is its firing stage alone


@dataclass
class Gold:
    steps: dict[tuple[str, int], str]  # (trace id, step) -> label
    correct: dict[str, bool]  # trace id -> final answer correct


class _GoldLine(BaseModel):
    """A line of a gold file: a step's label (`GoldStep`) or a trace's correctness
    (`GoldTrace`); the two may share a file."""

    model_config = ConfigDict(extra="allow")

    trace_id: str
    step: int | None = None
    label: GapLabel | None = None
    correct: bool | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> _GoldLine:
        if self.correct is None and (self.step is None or self.label is None):
            raise ValueError("needs step and label (a step's label) or correct (a trace's)")
        return self


def load_gold(paths: Sequence[str | Path], report: ErrorReport | None = None) -> Gold:
    """Gold step labels and trace correctness, in one file or several (docs/contract.md, section 1)."""
    report = report if report is not None else ErrorReport()
    steps: dict[tuple[str, int], str] = {}
    correct: dict[str, bool] = {}
    for path in paths:
        for _, rec in read_models(path, _GoldLine, report, what="gold labels"):
            if rec.step is not None and rec.label is not None:
                steps[(rec.trace_id, rec.step)] = rec.label
            else:
                correct[rec.trace_id] = bool(rec.correct)
    if not steps:
        raise ValueError(f"no gold step labels found in {', '.join(map(str, paths))}")
    return Gold(steps, correct)


def load_predictions(path: str | Path, report: ErrorReport | None = None) -> list[PredStep]:
    """A checker's verdicts; a step predicted twice is an input error (reported, first kept)."""
    report = report if report is not None else ErrorReport()
    return read_steps_once(
        path, PredStep, report, "is predicted twice (first at line {line})", what="verdicts"
    )


def _unique_by_step(preds: Iterable[PredStep]) -> dict[tuple[str, int], PredStep]:
    by_key: dict[tuple[str, int], PredStep] = {}
    for p in preds:
        key = (p.trace_id, p.step)
        if key in by_key:
            raise ValueError(
                f"trace {p.trace_id!r} step {p.step} is predicted twice; give one verdict per "
                "step (load_predictions reports and skips the later line)"
            )
        by_key[key] = p
    return by_key


def _ci(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values]


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_nan_to_none(v) for v in obj]
    return obj


def provenance_of(preds: Iterable[PredStep]) -> list[dict[str, Any]]:
    """The distinct `checker` records of a prediction file, in first-seen order."""
    seen: dict[str, dict[str, Any]] = {}
    for p in preds:
        if p.checker is not None:
            seen.setdefault(json.dumps(p.checker, sort_keys=True), p.checker)
    return list(seen.values())


def provenance_notes(records: Sequence[dict[str, Any]]) -> list[str]:
    """Why figures from these verdicts do not measure a real checker (stand-ins, replays)."""
    notes = []
    for rec in records:
        for part in ("judge", "nli", "prm"):
            note = (rec.get(part) or {}).get("note")
            if note:
                notes.append(f"{part} {rec[part]['spec']}: {note}")
    return list(dict.fromkeys(notes))


def evaluate_checker(
    gold: Gold,
    preds: Iterable[PredStep],
    *,
    resamples: int = 2000,
    seed: int = 0,
    unit: Literal["step", "trace"] = "step",
) -> dict[str, Any]:
    """Every figure of the report for one checker (its counts alone when nothing is scored)."""
    by_key = _unique_by_step(preds)
    keys = sorted(gold.steps)
    missing = [k for k in keys if k not in by_key]
    errored = [k for k in keys if k in by_key and by_key[k].label is None]
    scored = [k for k in keys if k in by_key and by_key[k].label is not None]
    if not scored:
        return _unscored(by_key, gold, missing, errored)
    g = np.array([gold.steps[k] for k in scored], dtype=object)
    p = np.array([by_key[k].label for k in scored], dtype=object)
    out: dict[str, Any] = {"scored": True, **step_metrics(list(g), list(p))}
    # Beside the binary (gap vs no gap) figures: how often the type itself is right.
    out["typed_accuracy"] = float(np.mean(g == p))
    out["typed_macro_f1"] = typed_macro_f1(list(g), list(p))

    pred_by_trace: dict[str, list[str | None]] = defaultdict(list)
    for k in keys:
        pred_by_trace[k[0]].append(by_key[k].label if k in by_key else None)
    flagged = {
        t: any(lab not in (None, "no_gap") for lab in labs) for t, labs in pred_by_trace.items()
    }
    correct = {t: c for t, c in gold.correct.items() if t in pred_by_trace}
    table = answer_gap_table(correct, flagged)
    out["QF1"] = q_f1(table) if correct else float("nan")
    out["answer_gap"] = table
    wrong_rate = sum(not c for c in correct.values()) / len(correct) if correct else float("nan")
    out["wrong_rate"] = wrong_rate
    out["QF1_flag_everything"] = flag_everything_q_f1(wrong_rate) if correct else float("nan")

    # Bootstrap: step metrics over steps (or whole traces), Q-F1 always over traces.
    n_units, rows = bootstrap_units([k[0] for k in scored], unit)
    ci = bootstrap_cis(
        binary_statistics(g != "no_gap", p != "no_gap", rows), n_units, resamples, seed
    )
    if correct:
        tids = sorted(correct)

        def qf1_stat(idx: np.ndarray) -> float:
            t = {"TP": 0, "FN": 0, "FP": 0, "TN": 0}
            for i in idx:
                ok, hit = correct[tids[i]], flagged.get(tids[i], False)
                t[("FP" if hit else "TN") if ok else ("TP" if hit else "FN")] += 1
            return q_f1(t)

        ci["QF1"] = _ci(bootstrap_ci(qf1_stat, len(tids), resamples=resamples, seed=seed))
    out["ci"] = ci

    all_pred = [by_key[k].label for k in keys if k in by_key]
    dist = distribution(all_pred)
    out["distribution"] = dist
    out["healthy"] = is_healthy(dist)
    out["health_issues"] = health_issues(dist)
    wrong = {t for t, c in correct.items() if not c}
    out["first_gap"] = first_gap_types(pred_by_trace, wrong)
    out["missing_steps"] = len(missing)
    out["error_steps"] = len(errored)
    out["extra_steps"] = len(set(by_key) - set(gold.steps))
    out["n_scored"] = len(scored)
    out["provenance"] = provenance_of(by_key.values())
    out["threshold_sweep"] = threshold_sweep(g, [by_key[k] for k in scored])
    return out


def _unscored(
    by_key: Mapping[tuple[str, int], PredStep],
    gold: Gold,
    missing: Sequence[tuple[str, int]],
    errored: Sequence[tuple[str, int]],
) -> dict[str, Any]:
    """The row of a checker with no scored step (docs/contract.md, section 6): counts, no figures."""
    empty: dict[str, Any] = dict.fromkeys(
        (
            "sP",
            "sR",
            "sF1",
            "BA",
            "BA_undefined",
            "QF1",
            "kappa",
            "typed_accuracy",
            "typed_macro_f1",
        )
    )
    return {
        **empty,
        "scored": False,
        "note": "no gold step has a predicted label; nothing to score",
        "kappa_per_type": dict.fromkeys(GAP_TYPES),
        "ci": {},
        "distribution": distribution([p.label for k, p in by_key.items() if k in gold.steps]),
        "healthy": None,
        "health_issues": [],
        "first_gap": None,
        "answer_gap": None,
        "wrong_rate": None,
        "QF1_flag_everything": None,
        "missing_steps": len(missing),
        "error_steps": len(errored),
        "extra_steps": len(set(by_key) - set(gold.steps)),
        "n_scored": 0,
        "provenance": provenance_of(by_key.values()),
        "threshold_sweep": [],
    }


def threshold_sweep(
    gold_labels: np.ndarray,
    preds: Sequence[PredStep],
    thresholds: Sequence[float] = SWEEP_THRESHOLDS,
) -> list[dict[str, float]]:
    """Flag a gap only where the stored confidence reaches tau (no confidence: always kept)."""
    rows = []
    gg = gold_labels != "no_gap"
    for tau in thresholds:
        labels = [
            p.label
            if p.label != "no_gap" and (p.confidence is None or p.confidence >= tau)
            else "no_gap"
            for p in preds
        ]
        pp = np.array(labels, dtype=object) != "no_gap"
        tp, fp, fn, tn = binary_counts(gg, pp)
        dist = distribution(labels)
        rows.append(
            {
                "threshold": tau,
                "sF1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0,
                "BA": balanced_accuracy_from_counts(tp, fp, fn, tn),
                "IE_share": dist["IE"],
                "flagged_share": float(pp.mean()),
            }
        )
    return rows


def build_report(
    gold: Gold | None,
    checkers: Mapping[str, Sequence[PredStep]],
    *,
    resamples: int = 2000,
    seed: int = 0,
    unit: Literal["step", "trace"] = "step",
    teacher: str | None = None,
) -> dict[str, Any]:
    """`report.json`: every figure for every checker against `gold`, and with `teacher` (one of
    the checkers' names) the others' agreement with it, which needs no gold: `gold` may be None
    then, and the report has no gold figures at all."""
    if gold is None and teacher is None:
        raise ValueError("give gold labels, a teacher to measure agreement with, or both")
    bootstrap: dict[str, Any] = {"resamples": resamples, "seed": seed, "unit": unit}
    # first, so a wrong teacher name fails before any gold figure is computed
    agreement = None if teacher is None else agreement_with(teacher, checkers, **bootstrap)
    report: dict[str, Any] = {}
    if gold is not None:
        report["n_steps"] = len(gold.steps)
        report["n_traces"] = len({t for t, _ in gold.steps})
    report["bootstrap"] = {**bootstrap, "level": 0.95}
    if gold is not None:
        report["checkers"] = {
            name: evaluate_checker(gold, preds, **bootstrap) for name, preds in checkers.items()
        }
    if agreement is not None:
        report["teacher_agreement"] = agreement
    return _nan_to_none(report)


@dataclass
class Evaluation:
    """What `evaluate` wrote: the report dict and the files, in writing order."""

    report: dict[str, Any]
    files: list[Path]


def evaluate(
    gold: str | Path | Sequence[str | Path] | None,
    predictions: Mapping[str, str | Path],
    output: str | Path,
    *,
    resamples: int = 2000,
    seed: int = 0,
    unit: Literal["step", "trace"] = "step",
    teacher: str | None = None,
    plots: bool = True,
    report: ErrorReport | None = None,
) -> Evaluation:
    """Score checkers against gold labels and write `report.json`, `report.md` and the plots.

    `gold`: one file or several (step labels and trace correctness), or None with `teacher`;
    `predictions`: checker name -> verdicts file; `teacher`: the name of the checker the others'
    agreement is measured against (fidelity to it, not quality). Unreadable lines of any file
    go to `report`. Without gold there are no gold figures and no plots.
    """
    from .markdown import render_markdown

    gold_files = [] if gold is None else [gold] if isinstance(gold, str | Path) else list(gold)
    gold_labels = load_gold(gold_files, report) if gold_files else None
    checkers = {name: load_predictions(path, report) for name, path in predictions.items()}
    result = build_report(
        gold_labels, checkers, resamples=resamples, seed=seed, unit=unit, teacher=teacher
    )
    # the folder is replaced whole once every file is written, so an earlier report survives a
    # failure and never mixes with this one
    sources = [*gold_files, *predictions.values()]
    with replacing(output, *sources, folder=True, owned_by=REPORT_JSON) as work:
        (work / REPORT_JSON).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        (work / "report.md").write_text(render_markdown(result), encoding="utf-8")
        names = [REPORT_JSON, "report.md"]
        if plots and gold_labels is not None:
            from .plots import write_plots

            names += [p.name for p in write_plots(result, work)]
    out = Path(output)
    return Evaluation(result, [out / name for name in names])
