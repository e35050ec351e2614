"""Rewards inside training never raise: checker faults and unreadable rollouts have a fallback.

The fallback (RELIABILITY.md): a step whose check failed earns bracket 0 and its rollout has no
reward (None, and why) unless `on_failed_check="zero"` scores it; a rollout that cannot be
segmented earns EM alone; both are logged, counted in `StepGapReward.failures`, and reported in
the scalars every framework logs.
"""

from __future__ import annotations

import logging

import pytest

from stepgap.serving import StepGapReward
from stepgap.serving.trl import stepgap_reward_func
from stepgap.teacher.checker import StepChecker

BROKEN = "<think>look</think><tool_call>{not json</tool_call><answer>Paris</answer>"


class FlakyChecker(StepChecker):
    """Wraps a real checker: raises on chosen calls, or turns one trace's steps into errors."""

    def __init__(
        self, checker, *, raise_on_call: set[int] = frozenset(), drop_trace: int | None = None
    ):
        self.checker = checker
        self.raise_on_call = raise_on_call
        self.drop_trace = drop_trace
        self.calls = 0

    @property
    def provenance(self):
        return self.checker.provenance

    def check(self, traces):
        self.calls += 1
        if self.calls in self.raise_on_call:
            raise ConnectionError("judge server went away")
        out = self.checker.check(traces)
        if self.drop_trace is not None:
            out[self.drop_trace] = out[self.drop_trace][:-1]  # the checker forgot a step
        return out


def _inputs(traces):
    return (
        [t.response for t in traces],
        [t.question for t in traces],
        [t.golden_answers for t in traces],
    )


def test_a_checker_exception_gives_bracket_0_for_its_batch_and_is_logged(
    reward, example_traces, expected_rewards, caplog
):
    flaky = StepGapReward(FlakyChecker(reward.checker, raise_on_call={1}))
    responses, questions, golden = _inputs(example_traces)
    with caplog.at_level(logging.WARNING, logger="stepgap.serving.reward_function"):
        failed = flaky.score(responses, questions, golden)
    for t, r in zip(example_traces, failed, strict=True):
        assert [s.bracket for s in r.steps] == [0.0] * len(t.steps)
        assert r.failed_checks == len(t.steps) and r.reward is None
        assert r.unavailable == (
            f"{len(t.steps)} of {len(t.steps)} step check(s) failed "
            "(first: checker failed: ConnectionError('judge server went away'))"
        )
        assert r.scalars()["failed_checks"] == len(t.steps) and "score" not in r.scalars()
    assert flaky.failures["no_reward"] == len(example_traces)
    assert flaky.failures["failed_checks"] == sum(len(t.steps) for t in example_traces)
    assert "judge server went away" in caplog.text
    # The next batch is scored normally: the fault did not stick.
    again = flaky.score(responses, questions, golden)
    assert [r.reward for r in again] == pytest.approx(
        [expected_rewards[t.id] for t in example_traces]
    )
    assert all(r.failed_checks == 0 for r in again)


def test_on_failed_check_zero_scores_a_failed_step_0_em_alone_when_all_failed(
    reward, example_traces
):
    """The old reading, as an explicit choice: a number, each failed step's bracket 0."""
    flaky = StepGapReward(FlakyChecker(reward.checker, raise_on_call={1}), on_failed_check="zero")
    for t, r in zip(example_traces, flaky.score(*_inputs(example_traces)), strict=True):
        assert r.failed_checks == len(t.steps) and r.unavailable is None
        assert r.reward == r.em and r.scalars()["score"] == r.em
    assert flaky.failures["no_reward"] == 0


def test_a_step_the_checker_left_out_earns_0_and_the_rest_of_the_batch_is_scored(
    reward, example_traces, expected_rewards
):
    flaky = StepGapReward(FlakyChecker(reward.checker, drop_trace=0))
    results = flaky.score(*_inputs(example_traces))
    first = results[0]
    assert (
        first.failed_checks == 1
        and first.steps[-1].bracket == 0.0
        and first.steps[-1].label is None
    )
    assert first.reward is None
    assert first.unavailable.endswith("(first: checker gave no verdict for this step)")
    assert [r.reward for r in results[1:]] == pytest.approx(
        [expected_rewards[t.id] for t in example_traces[1:]]
    )


def test_an_unsegmentable_rollout_earns_em_alone_and_the_others_are_scored(
    reward, example_traces, expected_rewards
):
    responses, questions, golden = _inputs(example_traces[:2])
    results = reward.score([responses[0], BROKEN, responses[1]], [questions[0], "q?", questions[1]],
                           [golden[0], ["Paris"], golden[1]])  # fmt: skip
    assert results[1].unsegmented and results[1].steps == [] and results[1].reward == 1.0
    assert results[1].scalars()["unsegmented"] == 1.0
    assert reward.failures["unsegmented"] == 1
    assert [results[0].reward, results[2].reward] == pytest.approx(
        [expected_rewards[t.id] for t in example_traces[:2]]
    )


def test_trl_logs_the_failure_rates(reward, example_traces):
    func = stepgap_reward_func(StepGapReward(FlakyChecker(reward.checker, raise_on_call={1})))
    responses, questions, golden = _inputs(example_traces)
    logged: dict[str, float] = {}
    out = func(
        prompts=[f"Question: {q}" for q in questions] + ["Question: q?"],
        completions=responses + [BROKEN],
        golden_answers=golden + [["Rome"]],
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )
    assert len(out) == len(responses) + 1 and out[-1] == 0.0
    assert logged["stepgap/failed_checks"] == 1.0
    assert logged["stepgap/unsegmented"] == pytest.approx(1 / (len(responses) + 1))
    unrewarded = sum(o is None for o in out)
    assert unrewarded and logged["stepgap/no_reward"] == pytest.approx(unrewarded / len(out))


@pytest.mark.parametrize("route", ["score", "check_stream"])
def test_a_checker_that_fails_every_step_warns_once_at_the_first_batch_with_its_error(
    fake_openai, examples_dir, example_traces, caplog, route
):
    """A judge that cannot be reached (every request 401): the reward quietly falling to EM
    alone would look like a working reward in a training log. The first batch logs one warning
    that every check failed, with the first error; later batches only count."""
    from stepgap.teacher import Checker, ReplayNLI, build_judge

    fake_openai.always = "401"
    judge = build_judge(
        "openai:gpt-4.1-mini", base_url=fake_openai.base_url, max_retries=0, no_cache=True
    )
    dead = StepGapReward(Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl")))
    responses, questions, golden = _inputs(example_traces[:3])
    traces = [dead.trace(r, q, g) for r, q, g in zip(responses, questions, golden, strict=True)]
    with caplog.at_level(logging.WARNING, logger="stepgap.serving.reward_function"):
        for _ in range(3):  # three batches
            if route == "score":
                results = dead.score(responses, questions, golden)
                assert all(r.reward is None and r.unavailable for r in results)
            else:
                assert sorted(i for i, _ in dead.check_stream(traces)) == [0, 1, 2]
    loud = [r.getMessage() for r in caplog.records if "every step check failed" in r.getMessage()]
    assert len(loud) == 1
    assert "Incorrect API key" in loud[0] or "401" in loud[0]
    assert dead.failures["failed_checks"] == 3 * sum(len(t.steps) for t in traces)


def test_no_all_failed_warning_once_the_checker_has_worked(
    reward, fake_openai, example_traces, caplog
):
    responses, questions, golden = _inputs(example_traces[:2])
    reward.score(responses, questions, golden)  # works
    fake_openai.always = "drop"  # then the server hangs up on every request
    with caplog.at_level(logging.WARNING, logger="stepgap.serving.reward_function"):
        reward.score(responses, questions, golden)
    assert reward.failures["failed_checks"] > 0
    assert not [r for r in caplog.records if "every step check failed" in r.getMessage()]
