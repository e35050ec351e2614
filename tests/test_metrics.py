"""docs/contract.md section 5 metrics against scikit-learn and the paper's reported figures."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.metrics import (
    balanced_accuracy_score,
    cohen_kappa_score,
    f1_score,
    precision_score,
    recall_score,
)

from stepgap.metrics import (
    answer_gap_table,
    binary_counts,
    bootstrap_ci,
    distribution,
    first_gap_types,
    flag_everything_q_f1,
    is_healthy,
    q_f1,
    step_metrics,
    typed_macro_f1,
)

LABELS = np.array(["no_gap", "CC", "IE", "MB"], dtype=object)


def _sk_kappa(a, b):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cohen_kappa_score(a, b)


def _same(x, y):
    return (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-9


def test_step_metrics_equal_scikit_learn_on_200_random_sets():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(5, 300))
        weights = rng.dirichlet(np.ones(4))
        gold = rng.choice(LABELS, n, p=weights)
        pred = np.where(rng.random(n) < rng.random(), gold, rng.choice(LABELS, n))
        m = step_metrics(list(gold), list(pred))
        g, p = gold != "no_gap", pred != "no_gap"
        kw = {"zero_division": 0}
        assert _same(m["sP"], precision_score(g, p, **kw))
        assert _same(m["sR"], recall_score(g, p, **kw))
        assert _same(m["sF1"], f1_score(g, p, **kw))
        if len(set(g)) == 2:
            assert _same(m["BA"], balanced_accuracy_score(g, p))
            assert m["BA_undefined"] is None
        assert _same(m["kappa"], _sk_kappa(g, p))
        for t in ("CC", "IE", "MB"):
            assert _same(m["kappa_per_type"][t], _sk_kappa(gold == t, pred == t))


def test_paper_answer_gap_table_gives_q_f1_0_8175():
    table = {"TP": 56, "FN": 13, "FP": 12, "TN": 1}
    assert round(q_f1(table), 4) == 0.8175


@pytest.mark.parametrize("w", [0.50, 0.65, 0.84])
def test_flag_everything_lands_near_2w_over_1_plus_w(w):
    rng = np.random.default_rng(int(w * 100))
    n_traces = 400
    correct = {f"t{i}": bool(rng.random() >= w) for i in range(n_traces)}
    flagged = dict.fromkeys(correct, True)  # every trace has at least one flagged step
    empirical = q_f1(answer_gap_table(correct, flagged))
    w_hat = sum(not c for c in correct.values()) / n_traces
    assert abs(empirical - flag_everything_q_f1(w)) <= 0.02
    assert abs(empirical - flag_everything_q_f1(w_hat)) < 1e-12


def test_bootstrap_is_reproducible_and_contains_the_point():
    rng = np.random.default_rng(0)
    gold = rng.choice(LABELS, 181)
    pred = np.where(rng.random(181) < 0.7, gold, rng.choice(LABELS, 181))

    def sf1(idx):
        return step_metrics(list(gold[idx]), list(pred[idx]))["sF1"]

    a = bootstrap_ci(sf1, 181, seed=3)
    b = bootstrap_ci(sf1, 181, seed=3)
    c = bootstrap_ci(sf1, 181, seed=4)
    point = sf1(np.arange(181))
    assert a == b and a != c
    assert a[0] <= point <= a[1] and a[1] - a[0] > 0.01


def test_distribution_health_and_first_gap():
    dist = distribution(["IE"] * 8 + ["CC", "MB", None])
    assert dist["IE"] == 0.8 and not is_healthy(dist)
    assert is_healthy(distribution(["IE", "CC", "MB", "no_gap"]))
    assert not is_healthy(distribution(["IE", "MB", "no_gap"]))  # CC never fires
    fg = first_gap_types(
        {"a": ["no_gap", "MB", "IE"], "b": ["IE"], "c": ["no_gap"]}, {"a", "b", "c"}
    )
    assert fg == pytest.approx({"CC": 0, "IE": 1 / 3, "MB": 1 / 3, "none": 1 / 3})


def test_typed_macro_f1_and_counts():
    assert binary_counts(np.array([1, 1, 0, 0], bool), np.array([1, 0, 1, 0], bool)) == (1, 1, 1, 1)
    gold = ["CC", "IE", "MB", "IE", "no_gap"]
    pred = ["CC", "IE", "IE", "IE", "no_gap"]
    expected = f1_score(gold, pred, labels=["CC", "IE", "MB"], average="macro", zero_division=0)
    assert abs(typed_macro_f1(gold, pred) - expected) < 1e-12
    with pytest.raises(ValueError):
        step_metrics([], [])


def test_ba_is_the_contract_formula_also_with_one_gold_class():
    """(TPR + TNR) / 2 with the absent class's rate counted as 0 and named; scikit-learn's
    balanced accuracy would report the present class's recall alone (1.0 here)."""
    gold, pred = ["CC", "IE", "MB", "IE"], ["CC", "no_gap", "MB", "IE"]  # no gold no_gap
    m = step_metrics(gold, pred)
    assert m["BA"] == pytest.approx((3 / 4 + 0) / 2) and m["BA_undefined"] == "TNR"
    m = step_metrics(["no_gap", "no_gap"], ["no_gap", "IE"])
    assert m["BA"] == pytest.approx((0 + 1 / 2) / 2) and m["BA_undefined"] == "TPR"
    m = step_metrics(["CC", "no_gap"], ["CC", "CC"])
    assert m["BA"] == pytest.approx((1 + 0) / 2) and m["BA_undefined"] is None
