"""Property tests: the metrics and the whole report never raise an unhandled exception.

Any gold set and any prediction file (missing steps, failed checks, extra steps, confidences,
traces without correctness) gives a report whose figures lie in their ranges, that serialises
as strict JSON and renders as Markdown; the one refusal is a clear ValueError when no gold step
has a predicted label.
"""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stepgap.eval.markdown import render_markdown
from stepgap.eval.metrics import (
    answer_gap_table,
    bootstrap_ci,
    distribution,
    first_gap_types,
    q_f1,
    step_metrics,
    typed_macro_f1,
)
from stepgap.eval.report import Gold, PredStep, build_report

LABEL = st.sampled_from(["no_gap", "CC", "IE", "MB"])
MAYBE_LABEL = st.one_of(st.none(), LABEL)
KEY = st.tuples(st.sampled_from(["t0", "t1", "t2", "t3"]), st.integers(0, 4))


def _in_unit(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x)) or -1e-12 <= x <= 1 + 1e-12


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(LABEL, LABEL), min_size=1, max_size=40))
def test_step_metrics_lie_in_their_ranges(pairs):
    gold, pred = zip(*pairs, strict=True)
    m = step_metrics(list(gold), list(pred))
    assert all(_in_unit(m[k]) for k in ("sP", "sR", "sF1", "BA"))
    kappas = [m["kappa"], *m["kappa_per_type"].values()]
    assert all(math.isnan(k) or -1 - 1e-12 <= k <= 1 + 1e-12 for k in kappas)
    assert 0 <= typed_macro_f1(list(gold), list(pred)) <= 1


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=3), st.booleans(), max_size=6),
    st.dictionaries(st.text(max_size=3), st.booleans(), max_size=6),
    st.dictionaries(st.text(max_size=3), st.lists(MAYBE_LABEL, max_size=4), max_size=6),
)
def test_question_level_metrics_take_any_tables(correct, flagged, steps_by_trace):
    table = answer_gap_table(correct, flagged)
    assert sum(table.values()) == len(correct) and 0 <= q_f1(table) <= 1
    shares = first_gap_types(steps_by_trace, {t for t, ok in correct.items() if not ok})
    assert all(0 <= v <= 1 for v in shares.values())
    dist = distribution([lab for labs in steps_by_trace.values() for lab in labs])
    assert all(0 <= v <= 1 for v in dist.values())


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 30), st.integers(0, 5))
def test_bootstrap_ci_is_ordered_or_nan(n, seed):
    values = np.random.default_rng(seed).random(n)
    low, high = bootstrap_ci(lambda idx: float(values[idx].mean()), n, resamples=50, seed=seed)
    assert low <= high and values.min() - 1e-12 <= low and high <= values.max() + 1e-12
    nan = bootstrap_ci(lambda idx: float("nan"), n, resamples=10)
    assert all(math.isnan(x) for x in nan)


PRED = st.builds(
    lambda key, label, conf: PredStep(
        trace_id=key[0],
        step=key[1],
        label=label,
        confidence=conf,
        error=None if label else "judge failed",
    ),
    KEY,
    MAYBE_LABEL,
    st.one_of(st.none(), st.floats(0, 1)),
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(KEY, LABEL, min_size=1, max_size=15),
    st.dictionaries(st.sampled_from(["t0", "t1", "t2", "t3", "t9"]), st.booleans(), max_size=5),
    st.lists(PRED, max_size=20),
    st.lists(PRED, max_size=20),
    st.sampled_from(["step", "trace"]),
)
def test_the_report_never_raises_anything_but_a_clear_refusal(gold_steps, correct, a, b, unit):
    gold = Gold(steps=dict(gold_steps), correct=dict(correct))
    scored = any(p.label is not None and (p.trace_id, p.step) in gold_steps for p in a + b)
    try:
        report = build_report(gold, {"a": a, "b": b}, resamples=20, unit=unit, silver="b")
    except ValueError as exc:
        assert "no gold step has a predicted label" in str(exc)
        assert not all(
            any(p.label is not None and (p.trace_id, p.step) in gold_steps for p in preds)
            for preds in (a, b)
        )
        return
    assert scored
    json.dumps(report, allow_nan=False)  # strict JSON: no NaN left in report.json
    for name, figures in report["checkers"].items():
        assert all(_in_unit(figures[k]) for k in ("sP", "sR", "sF1", "BA", "QF1"))
        for low, high in (ci for ci in figures["ci"].values() if None not in ci):
            assert low <= high
        assert figures["n_scored"] + figures["missing_steps"] + figures["error_steps"] == len(
            gold_steps
        )
        assert name in render_markdown(report)
