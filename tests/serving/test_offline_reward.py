"""The reward computed by the offline checker from a bundle, in process (no API key)."""

from __future__ import annotations

import json

import pytest

from stepgap.export import OfflineChecker
from stepgap.export.bundle import export_bundle
from stepgap.reward_arithmetic import compute_reward
from stepgap.serving import StepGapReward


def test_offline_checker_scores_rewards(
    tiny_student, tiny_nli, tmp_path, example_traces, examples_dir
):
    adapter, _ = tiny_student
    bundle = export_bundle(str(adapter), str(tiny_nli), tmp_path / "bundle", merge=True)
    checker = OfflineChecker.from_bundle(bundle)
    assert checker.manifest["student"]["merged"]
    traces = example_traces[:3]
    results = StepGapReward(checker, "typed_shape", 1.0).score_traces(traces)
    verdicts = checker.check(traces)
    for trace, result, vs in zip(traces, results, verdicts, strict=True):
        assert [s.label for s in result.steps] == [v.label or "no_gap" for v in vs]
        expected = compute_reward(trace, vs, variant="typed_shape", lam=1.0)
        assert result.reward == expected.reward
    # Expected values from outside the reward code: the contract's base table (section 4)
    # over the bundle's labels, and the hand-annotated correctness of each final answer.
    base = {"no_gap": 0.20, "MB": -0.05, "IE": -0.10, "CC": 0.05, None: 0.0}
    correct = {
        json.loads(x)["trace_id"]: json.loads(x)["correct"]
        for x in (examples_dir / "gold_traces.jsonl").read_text().splitlines()
    }
    typed_base = StepGapReward(checker, "typed_base", 0.5).score_traces(traces)
    for trace, result, vs in zip(traces, typed_base, verdicts, strict=True):
        em = 1.0 if correct[trace.id] else 0.0
        assert result.reward == pytest.approx(em + 0.5 * sum(base[v.label] for v in vs))
    assert [correct[t.id] for t in traces] == [True, False, True]  # both EM outcomes are seen
