"""Checker metrics of docs/contract.md section 5 (positive class = gap).

Step metrics are computed from confusion counts with numpy, so a 2000-resample bootstrap is a
few array operations; `tests/test_metrics.py` holds them equal to scikit-learn's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from stepgap.schema import GAP_TYPES, LABELS

IE_DEGENERATE = 0.70  # IE above this share of steps marks a collapsed checker


def _div(num: float, den: float) -> float:
    return float(num) / float(den) if den else 0.0


def _nan_div(num: float, den: float) -> float:
    return float(num) / float(den) if den else float("nan")


def binary_counts(gold_gap: np.ndarray, pred_gap: np.ndarray) -> tuple[int, int, int, int]:
    """(TP, FP, FN, TN) with gap as the positive class."""
    tp = int(np.sum(gold_gap & pred_gap))
    fp = int(np.sum(~gold_gap & pred_gap))
    fn = int(np.sum(gold_gap & ~pred_gap))
    tn = int(np.sum(~gold_gap & ~pred_gap))
    return tp, fp, fn, tn


def kappa_from_counts(tp: float, fp: float, fn: float, tn: float) -> float:
    """Cohen's kappa of a 2x2 table; nan where it is undefined (both raters constant and equal)."""
    n = tp + fp + fn + tn
    po = (tp + tn) / n
    pe = ((tp + fn) * (tp + fp) + (tn + fp) * (tn + fn)) / (n * n)
    return float("nan") if pe == 1 else (po - pe) / (1 - pe)


def balanced_accuracy_from_counts(tp: float, fp: float, fn: float, tn: float) -> float:
    """BA = (TPR + TNR) / 2, as the contract writes it. A rate whose gold class is absent (0/0)
    counts as 0 (scikit-learn would average over the present class only); `ba_undefined` names
    it so the report can say so."""
    return (_div(tp, tp + fn) + _div(tn, tn + fp)) / 2


def ba_undefined(tp: float, fp: float, fn: float, tn: float) -> str | None:
    """Which half of BA has no gold steps (`"TPR"`: no gold gap, `"TNR"`: no gold no_gap)."""
    if not tp + fn and not tn + fp:
        return "TPR and TNR"
    if not tp + fn:
        return "TPR"
    if not tn + fp:
        return "TNR"
    return None


def step_metrics(gold: Sequence[str], pred: Sequence[str]) -> dict[str, float]:
    """sP, sR, sF1, BA and kappa on has-gap, plus kappa per gap type (one against the rest)."""
    g = np.asarray(gold, dtype=object)
    p = np.asarray(pred, dtype=object)
    if g.shape != p.shape or g.size == 0:
        raise ValueError("gold and predicted labels must be non-empty and of equal length")
    tp, fp, fn, tn = binary_counts(g != "no_gap", p != "no_gap")
    precision, recall = _div(tp, tp + fp), _div(tp, tp + fn)
    return {
        "sP": precision,
        "sR": recall,
        "sF1": _div(2 * tp, 2 * tp + fp + fn),
        "BA": balanced_accuracy_from_counts(tp, fp, fn, tn),
        "BA_undefined": ba_undefined(tp, fp, fn, tn),
        "kappa": kappa_from_counts(tp, fp, fn, tn),
        "kappa_per_type": {t: kappa_from_counts(*binary_counts(g == t, p == t)) for t in GAP_TYPES},
    }


def answer_gap_table(correct: Mapping[str, bool], flagged: Mapping[str, bool]) -> dict[str, int]:
    """Answer correctness by gap detected, per trace: TP = wrong and flagged, and so on."""
    table = {"TP": 0, "FN": 0, "FP": 0, "TN": 0}
    for trace_id, ok in correct.items():
        hit = flagged.get(trace_id, False)
        key = ("FP" if hit else "TN") if ok else ("TP" if hit else "FN")
        table[key] += 1
    return table


def q_f1(table: Mapping[str, int]) -> float:
    """Question-level F1: gold positive = wrong final answer, predicted = any step flagged."""
    return _div(2 * table["TP"], 2 * table["TP"] + table["FP"] + table["FN"])


def flag_everything_q_f1(wrong_rate: float) -> float:
    """The Q-F1 a checker that flags every step gets at wrong-answer rate w: 2w / (1 + w)."""
    return 2 * wrong_rate / (1 + wrong_rate)


def distribution(labels: Sequence[str | None]) -> dict[str, float]:
    """Share of each label among labelled steps."""
    counts = Counter(lab for lab in labels if lab is not None)
    total = sum(counts.values())
    return {lab: _div(counts.get(lab, 0), total) for lab in LABELS}


def health_issues(dist: Mapping[str, float]) -> list[str]:
    """The degeneracy rules a label distribution breaks: IE above 70% of steps, CC or MB never
    predicted. Empty for a healthy checker."""
    issues = []
    if dist["IE"] > IE_DEGENERATE:
        issues.append(f"IE is {100 * dist['IE']:.0f}% of steps (above {100 * IE_DEGENERATE:.0f}%)")
    issues += [f"{t} is never predicted" for t in ("CC", "MB") if dist[t] == 0]
    return issues


def is_healthy(dist: Mapping[str, float]) -> bool:
    """Degenerate when IE exceeds 70% of steps or CC or MB never fires."""
    return not health_issues(dist)


def first_gap_types(
    steps_by_trace: Mapping[str, Sequence[str | None]], wrong: set[str]
) -> dict[str, float]:
    """For wrong-answer traces: the type of the first flagged step (or none), as shares."""
    counts: Counter[str] = Counter()
    for trace_id in wrong:
        labels = steps_by_trace.get(trace_id, [])
        counts[next((lab for lab in labels if lab in GAP_TYPES), "none")] += 1
    total = sum(counts.values())
    return {k: _div(counts.get(k, 0), total) for k in (*GAP_TYPES, "none")}


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float],
    n_units: int,
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of `statistic(indices)` over `n_units` resampled with replacement."""
    rng = np.random.default_rng(seed)
    values = np.array(
        [statistic(rng.integers(0, n_units, n_units)) for _ in range(resamples)], dtype=float
    )
    values = values[~np.isnan(values)]
    if values.size == 0:
        return (float("nan"), float("nan"))
    alpha = (1 - level) / 2
    low, high = np.quantile(values, [alpha, 1 - alpha])
    return float(low), float(high)


def bootstrap_units(
    trace_of: Sequence[str], unit: str
) -> tuple[int, Callable[[np.ndarray], np.ndarray]]:
    """What the bootstrap resamples: `unit="step"` each scored step, `"trace"` whole traces (a
    trace's steps are not independent). Returns the number of units and the function from
    resampled unit indices to the rows (steps) they stand for."""
    if unit == "step":
        return len(trace_of), lambda idx: idx
    of = np.asarray(trace_of, dtype=object)
    traces = sorted(set(trace_of))
    rows_of = [np.flatnonzero(of == t) for t in traces]
    return len(traces), lambda idx: np.concatenate([rows_of[i] for i in idx])


def binary_statistics(
    ref_gap: np.ndarray, pred_gap: np.ndarray, rows: Callable[[np.ndarray], np.ndarray]
) -> dict[str, Callable[[np.ndarray], float]]:
    """sP, sR, sF1, BA and kappa of gap vs no gap as functions of resampled unit indices, for
    `bootstrap_ci`; a rate with no step to divide by is nan (left out of the interval)."""

    def counts(idx: np.ndarray) -> tuple[int, int, int, int]:
        r = rows(idx)
        return binary_counts(ref_gap[r], pred_gap[r])

    return {
        "sP": lambda i: (lambda tp, fp, fn, tn: _nan_div(tp, tp + fp))(*counts(i)),
        "sR": lambda i: (lambda tp, fp, fn, tn: _nan_div(tp, tp + fn))(*counts(i)),
        "sF1": lambda i: (lambda tp, fp, fn, tn: _nan_div(2 * tp, 2 * tp + fp + fn))(*counts(i)),
        "BA": lambda i: balanced_accuracy_from_counts(*counts(i)),
        "kappa": lambda i: kappa_from_counts(*counts(i)),
    }


def bootstrap_cis(
    statistics: Mapping[str, Callable[[np.ndarray], float]],
    n_units: int,
    resamples: int,
    seed: int,
) -> dict[str, list[float]]:
    """`bootstrap_ci` of each statistic, on the same seed (so the same resamples)."""
    return {
        name: [float(v) for v in bootstrap_ci(f, n_units, resamples=resamples, seed=seed)]
        for name, f in statistics.items()
    }


def binary_f1(gold: Sequence[bool], pred: Sequence[bool]) -> float:
    tp, fp, fn, _ = binary_counts(np.asarray(gold, bool), np.asarray(pred, bool))
    return _div(2 * tp, 2 * tp + fp + fn)


def typed_macro_f1(gold: Sequence[str], pred: Sequence[str]) -> float:
    """Macro F1 over CC, IE and MB (each one against the rest): whether the gap type is right."""
    g = np.asarray(gold, dtype=object)
    p = np.asarray(pred, dtype=object)
    return float(np.mean([binary_f1(g == t, p == t) for t in GAP_TYPES]))
