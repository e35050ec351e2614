"""The reward computed by the offline checker from a bundle, in process (no API key)."""

from __future__ import annotations

from stepgap.export.bundle import export_bundle
from stepgap.serving import OfflineChecker, StepGapReward, compute_reward


def test_offline_checker_scores_rewards(tiny_student, tiny_nli, tmp_path, example_traces):
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
