"""Checking each step as its evidence arrives (`serving/streaming.py`): the reward at the end is
the post-hoc one, the judge is asked about each step once, and only the end is left to ask."""

from __future__ import annotations

import re
import time

import pytest

from stepgap.reward_arithmetic import VARIANTS
from stepgap.schema import Trace
from stepgap.serving.reward_function import StepGapReward
from stepgap.serving.streaming import StreamingReward
from stepgap.teacher.checker import Checker
from stepgap.teacher.judges.base import JudgeBackend
from stepgap.teacher.judges.replay import ReplayJudge
from stepgap.teacher.nli.replay import ReplayNLI
from tests.fixtures.judges import CountingJudge


@pytest.fixture
def checker(examples_dir):
    return Checker(
        CountingJudge(ReplayJudge.from_file(examples_dir / "judge_replay.jsonl")),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )


def prefixes(response: str) -> list[str]:
    """The rollout's text as a search tool sees it: up to each search result's end."""
    return [response[: m.end()] for m in re.finditer(r"</(information|tool_response)>", response)]


@pytest.fixture(scope="module")
def tokenizer():
    """Token spans: the dense variant's per-token rewards."""
    from tests.fixtures.models import qwen_tokenizer

    return qwen_tokenizer()


@pytest.mark.parametrize("variant", VARIANTS)
def test_inline_rewards_equal_the_post_hoc_ones_for_every_variant(
    checker, example_traces, tokenizer, variant
):
    post_hoc = StepGapReward(checker, variant, lam=0.7, tokenizer=tokenizer)
    expected = post_hoc.score_traces(example_traces)
    checker.judge.asked.clear()
    with StreamingReward(StepGapReward(checker, variant, lam=0.7, tokenizer=tokenizer)) as s:
        for t in example_traces:
            for text in prefixes(t.response):
                s.submit_response(t.id, t.question, text)
        got = [
            s.finalize(Trace(id=t.id, question=t.question, golden_answers=t.golden_answers,
                             response=t.response))
            for t in example_traces
        ]  # fmt: skip
        stats = dict(s.stats)
    for g, e in zip(got, expected, strict=True):
        assert g.reward == pytest.approx(e.reward, abs=1e-9)
        assert g.as_dict() == e.as_dict()  # labels, brackets, token spans, dense rewards
    if variant == "search_only":
        return
    steps = sum(len(t.steps) for t in example_traces)
    # every step asked exactly once; all but the conclusions during the rollout
    assert sorted(checker.judge.asked) == sorted(
        (t.id, s.index) for t in example_traces for s in t.steps
    )
    conclusions = sum(s.type == "conclusion" for t in example_traces for s in t.steps)
    assert stats["reused"] == steps - conclusions and stats["asked_at_end"] == conclusions


def test_a_step_whose_text_changed_is_asked_again_at_the_end(checker, example_traces):
    t = next(t for t in example_traces if len(prefixes(t.response)) >= 2)
    reward = StepGapReward(checker)
    (expected,) = reward.score_traces([t])
    *before, last = prefixes(t.response)
    opened = last.rindex("<information>")
    other = last[:opened] + last[opened:].replace("(Title: ", "(Title: Not ", 1)  # another result
    assert other != last
    with StreamingReward(reward) as s:
        for text in [*before, other]:
            s.submit_response(t.id, t.question, text)
        got = s.finalize(t)
        assert s.stats["asked_at_end"] == 2  # the changed step and the conclusion
    assert got.reward == pytest.approx(expected.reward, abs=1e-9)


def test_steps_out_of_order_are_refused_and_a_repeat_is_ignored(checker, example_traces):
    t = next(t for t in example_traces if len(t.steps) >= 3)
    with StreamingReward(StepGapReward(checker)) as s:
        s.submit(t.id, t.question, t.steps[0])
        s.submit(t.id, t.question, t.steps[0])  # a retried tool call
        with pytest.raises(ValueError, match=rf"rollout '{t.id}': step 2 submitted after 1"):
            s.submit(t.id, t.question, t.steps[2])
        assert s.stats["submitted"] == 1


def test_a_dropped_rollouts_unsent_steps_are_never_asked(examples_dir, example_traces):
    judge = CountingJudge(ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"), 0.3)
    checker = Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"))
    a, b = example_traces[:2]
    with StreamingReward(StepGapReward(checker), workers=1, max_batch=1) as s:
        s.submit(a.id, a.question, a.steps[0])  # the worker takes this one at once
        time.sleep(0.05)
        for step in b.steps[:-1]:
            s.submit(b.id, b.question, step)
        dropped = s.drop(b.id)
        assert s.unfinished() == 1
    assert dropped == len(b.steps) - 1
    assert all(trace_id != b.id for trace_id, _ in judge.asked)


def test_a_rollout_never_finalized_is_forgotten(checker, example_traces):
    a, b = example_traces[:2]
    with StreamingReward(StepGapReward(checker), forget_after=0.2) as s:
        s.submit(a.id, a.question, a.steps[0])
        time.sleep(0.3)
        s.submit(b.id, b.question, b.steps[0])
        assert s.unfinished() == 1  # a's was dropped when b's step came


def test_a_judge_fault_gives_no_reward_never_an_exception(examples_dir, example_traces):
    class Broken(JudgeBackend):
        name = "broken"

        def judge(self, requests, *, stop=None):
            raise RuntimeError("judge is down")

    checker = Checker(Broken(), ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"))
    t = example_traces[0]
    reward = StepGapReward(checker)
    with StreamingReward(reward) as s:
        s.submit(t.id, t.question, t.steps[0])
        result = s.finalize(t)
    assert result.unavailable is not None and "judge is down" in result.unavailable
    assert reward.failures["failed_checks"] == len(t.steps)


def _spanless(result) -> dict:
    d = result.as_dict()
    for step in d["steps"]:
        step.pop("span"), step.pop("token_span")
    return d


def _with_notes(s: StreamingReward, t: Trace, wait: float) -> tuple[str, list]:
    """The rollout's text as a tool loop with typed feedback builds it: after each search
    result, the note for that step (if any) goes back with it."""
    text, notes, done = "", [], 0
    for cut in [m.end() for m in re.finditer(r"</(information|tool_response)>", t.response)]:
        text += t.response[done:cut]
        done = cut
        note = s.tell(t.id, t.question, text, wait).note
        notes.append(note)
        text += note or ""
    return text + t.response[done:], notes


def test_a_gap_whose_verdict_is_in_time_gets_its_note_and_the_reward_is_unchanged(
    checker, example_traces
):
    """Each complete step's note is that of its post-hoc label (none for no_gap), and the
    rollout with its notes earns the reward of the rollout without them."""
    from stepgap.feedback import note_for

    reward = StepGapReward(checker)
    expected = reward.score_traces(example_traces)
    verdicts = {t.id: checker.check([t])[0] for t in example_traces}
    with StreamingReward(reward) as s:
        for t, e in zip(example_traces, expected, strict=True):
            text, notes = _with_notes(s, t, wait=60.0)
            searched = [v for v in verdicts[t.id] if v.step < len(notes)]
            assert notes == [note_for(v.label) for v in searched]
            got = s.finalize(Trace(id=t.id, question=t.question,
                                   golden_answers=t.golden_answers, response=text))  # fmt: skip
            assert _spanless(got) == _spanless(e)  # a note moves the spans, nothing else
        stats = dict(s.stats)
    assert stats["notes"] >= 1 and stats["no_gap"] >= 1 and stats["too_late"] == 0
    assert stats["notes"] + stats["no_gap"] == sum(
        len(prefixes(t.response)) for t in example_traces
    )


def test_a_verdict_not_in_time_is_not_sent_and_costs_no_wait(examples_dir, example_traces):
    """With no wait (the default), a step still at the judge gets no note; the rollout goes on
    and its reward is the post-hoc one."""
    import threading

    gate = threading.Event()
    judge = CountingJudge(ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"), gate=gate)
    checker = Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"))
    t = next(t for t in example_traces if len(prefixes(t.response)) >= 2)
    gate.set()
    (expected,) = StepGapReward(checker).score_traces([t])
    gate.clear()
    with StreamingReward(StepGapReward(checker)) as s:
        text, notes = _with_notes(s, t, wait=0.0)
        assert notes == [None] * len(prefixes(t.response))
        assert s.stats["too_late"] == len(notes) and s.stats["notes"] == 0
        assert s.stats["waited_s"] < 30  # not until the judge gave up on its closed gate (60 s)
        gate.set()
        got = s.finalize(Trace(id=t.id, question=t.question, golden_answers=t.golden_answers,
                               response=text))  # fmt: skip
    assert _spanless(got) == _spanless(expected)
