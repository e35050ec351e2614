"""The checker's own measures (`teacher/checker.py`): what checking a trace costs its judge, in
the unit the judge's limit measures, so that a reward server paces by prompt length."""

from __future__ import annotations

from stepgap.teacher import Checker, ReplayJudge, ReplayNLI
from stepgap.teacher.checker import StepChecker


def test_request_sizes_are_the_prompts_the_judge_is_sent(examples_dir, example_traces):
    checker = Checker(
        ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )
    for trace in example_traces:
        sent = [r.size for r in checker.judge_requests(trace)]
        assert checker.request_sizes(trace) == sent
        assert all(size > 500 for size in sent)  # the prompt, not a count of steps
    sizes = [sum(checker.request_sizes(t)) for t in example_traces]
    assert max(sizes) > 2 * min(sizes)  # traces differ by several times: steps alone would not say


def test_a_checker_without_its_own_judge_counts_steps(example_traces):
    class Elsewhere(StepChecker):
        def check(self, traces):
            return [[] for _ in traces]

        @property
        def provenance(self):
            return {}

    trace = example_traces[0]
    assert Elsewhere().request_sizes(trace) == [1.0] * len(trace.steps)
