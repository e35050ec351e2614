"""Property tests: the metrics and the whole report never raise an unhandled exception.

Any gold set and any prediction file (missing steps, failed checks, extra steps, confidences,
traces without correctness) gives a report whose figures lie in their ranges, that serialises
as strict JSON and renders as Markdown. A checker with no scored step is reported as such while
the others keep their figures (docs/contract.md, section 6); the one refusal is a clear ValueError when a
step is predicted twice (`load_predictions` reports such lines and keeps the first).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepgap.eval.markdown import render_markdown
from stepgap.eval.report import Gold, PredStep, build_report, load_predictions
from stepgap.io import ErrorReport
from stepgap.metrics import (
    answer_gap_table,
    bootstrap_ci,
    distribution,
    first_gap_types,
    q_f1,
    step_metrics,
    typed_macro_f1,
)

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


def _key(p: PredStep) -> tuple[str, int]:
    return (p.trace_id, p.step)


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


PREDS = st.lists(PRED, max_size=20, unique_by=_key)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(KEY, LABEL, min_size=1, max_size=15),
    st.dictionaries(st.sampled_from(["t0", "t1", "t2", "t3", "t9"]), st.booleans(), max_size=5),
    PREDS,
    PREDS,
    st.sampled_from(["step", "trace"]),
)
def test_the_report_never_raises_and_keeps_every_checker(gold_steps, correct, a, b, unit):
    gold = Gold(steps=dict(gold_steps), correct=dict(correct))
    report = build_report(gold, {"a": a, "b": b}, resamples=20, unit=unit, teacher="b")
    json.dumps(report, allow_nan=False)  # strict JSON: no NaN left in report.json
    assert set(report["checkers"]) == {"a", "b"}
    agreement = report["teacher_agreement"]["checkers"]
    assert set(agreement) == {"a"}  # the teacher has no row of agreement with itself
    figures = agreement["a"]
    assert figures["n_scored"] + figures["missing_steps"] + figures["error_steps"] <= len(b)
    for low, high in (ci for ci in figures["ci"].values() if None not in ci):
        assert low <= high
    md = render_markdown(report)
    for name, preds in (("a", a), ("b", b)):
        figures = report["checkers"][name]
        scored = any(p.label is not None and _key(p) in gold_steps for p in preds)
        assert figures["scored"] is scored and name in md
        assert figures["n_scored"] + figures["missing_steps"] + figures["error_steps"] == len(
            gold_steps
        )
        if not scored:
            assert figures["sF1"] is None and figures["n_scored"] == 0
            continue
        assert all(_in_unit(figures[k]) for k in ("sP", "sR", "sF1", "BA", "QF1"))
        for low, high in (ci for ci in figures["ci"].values() if None not in ci):
            assert low <= high


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(KEY, LABEL, min_size=1, max_size=8), st.lists(PRED, min_size=1, max_size=8))
def test_a_step_predicted_twice_is_refused_by_name(gold_steps, preds):
    twice = [*preds, preds[0].model_copy(update={"label": None, "error": "judge failed"})]
    with pytest.raises(ValueError, match="predicted twice"):
        build_report(Gold(steps=dict(gold_steps), correct={}), {"a": twice}, resamples=5)


def test_load_predictions_reports_the_second_line_and_keeps_the_first(tmp_path):
    path = tmp_path / "pred.jsonl"
    first = {"trace_id": "t0", "step": 1, "label": "CC"}
    again = {"trace_id": "t0", "step": 1, "label": None, "error": "judge API error"}
    other = {"trace_id": "t0", "step": 2, "label": "no_gap"}
    path.write_text("".join(json.dumps(r) + "\n" for r in (first, again, other)))
    report = ErrorReport()
    preds = load_predictions(path, report)
    assert [(p.step, p.label) for p in preds] == [(1, "CC"), (2, "no_gap")]
    (err,) = report.errors
    assert (err.line, err.field) == (2, "step") and "first at line 1" in err.reason
