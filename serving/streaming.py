"""Check each step while the rollout runs: a step goes to the judge as soon as its evidence
arrives, and the rollout's reward at its end reuses every answer already made.

The method checks steps during the rollout ("the checker is invoked once per emitted step s_i,
returning tau_i, which is cached with the step's token span"; docs/contract.md section 4 computes
the return from those labels when the trajectory ends). A search agent's step is complete when
the search tool's answer comes back; the next turn takes seconds to generate, and the judge works
on the step meanwhile. At the end only what is still missing is checked (the conclusion step, or a
step whose text changed), so the reward comes sooner than a check of the whole finished trace.

`StreamingReward.submit(trace_id, question, step)` returns at once: the step's judge request (the
prompt a post-hoc check of the finished trace would send for it, which sees only the steps before
it) goes to a pool of workers on the checker's own judge, with its cache and concurrency limits.
`finalize(trace)` builds the finished trace's requests, takes the answer of each one already
asked (the same prompt, so the same answer), asks the rest, and decides the whole trace with the
NLI stages and the tree as `Checker.check` does. The reward is the post-hoc
one (tests/serving/test_streaming.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from stepgap.clock import TraceDeadline
from stepgap.feedback import Told, note_for
from stepgap.reward_arithmetic import RewardResult
from stepgap.schema import Step, Trace, Verdict
from stepgap.segment import SegmentationError, segment_trace
from stepgap.teacher.checker import Checker, StepChecker
from stepgap.teacher.judges.base import JudgeRequest
from stepgap.tree import JudgeResult

from .reward_function import StepGapReward, _complete, default_inflight, failed_verdicts

log = logging.getLogger(__name__)


def _prompt_key(request: JudgeRequest) -> tuple[Any, ...]:
    """What decides a judge's answer to a request: its messages and its answer schema."""
    return (request.step_type, request.answer, *(m["content"] for m in request.messages))


@dataclass
class _Asked:
    """One submitted step: its judge request and the answer to come."""

    step: Step
    key: tuple[Any, ...]
    request: JudgeRequest
    answer: Future[JudgeResult] = field(default_factory=Future)


@dataclass
class _Rollout:
    question: str
    steps: list[_Asked] = field(default_factory=list)
    touched: float = field(default_factory=time.monotonic)


class StreamingReward:
    """Rewards for rollouts whose steps are checked as they come (see the module docstring).

    `reward`: the `StepGapReward` whose checker, variant, lambda, tokenizer and failure policy
    apply; its checker must be a `Checker` (a teacher's or an offline bundle's). `workers`:
    judge calls in flight at once (default: 8 for a judge behind a server, whose own
    concurrency does the work, 1 for a model in this process). `max_batch`: steps one judge
    call takes (those waiting when a worker frees up; a local model batches them).
    `forget_after`: seconds after which a rollout that was never finalized is dropped (a
    trajectory the trainer abandoned), its unsent steps with it.
    """

    def __init__(
        self,
        reward: StepGapReward,
        *,
        workers: int | None = None,
        max_batch: int = 32,
        forget_after: float = 1800.0,
    ) -> None:
        checker = reward.checker
        from stepgap.student.prm import PRMChecker

        if isinstance(checker, PRMChecker):
            raise TypeError(
                "a PRM checker reads whole traces in one forward pass: it checks no step while "
                "the rollout runs; score the finished rollout (/reward) instead"
            )
        if not isinstance(checker, Checker):
            raise TypeError(
                f"{type(checker).__name__} cannot check steps one by one: inline checking needs "
                "a checker with its own judge (a teacher Checker or an offline bundle's)"
            )
        if workers is None:
            workers = default_inflight(reward)
        if workers < 1 or max_batch < 1:
            raise ValueError("workers and max_batch must be at least 1")
        self.reward = reward
        self.checker = checker
        self.max_batch = max_batch
        self.forget_after = forget_after
        self.rollouts: dict[str, _Rollout] = {}
        self.lock = threading.Lock()
        self.pending: queue.Queue[_Asked | None] = queue.Queue()
        self.stats: dict[str, float] = {
            "submitted": 0, "reused": 0, "asked_at_end": 0, "dropped": 0,
            "notes": 0, "no_gap": 0, "too_late": 0, "waited_s": 0.0,
        }  # fmt: skip
        self.closed = False
        self.threads = [
            threading.Thread(target=self._work, name=f"stepgap-inline-{k}", daemon=True)
            for k in range(workers)
        ]
        for t in self.threads:
            t.start()

    @staticmethod
    def supports(checker: StepChecker) -> bool:
        """Whether `checker` can check a rollout's steps one by one (the hybrid checker, with
        its own judge in this process)."""
        return isinstance(checker, Checker)

    # ------------------------------------------------------------------ during the rollout
    def submit(self, trace_id: str, question: str, step: Step) -> None:
        """Queue step `step.index` of rollout `trace_id` for checking and return at once.

        Steps come in order (0, 1, ...); a step sent again unchanged is ignored (a tool call
        retried), one sent out of order is a ValueError naming the rollout and the indexes."""
        if self.closed:
            raise RuntimeError("this StreamingReward is closed")
        self._forget_stale()
        with self.lock:
            rollout = self.rollouts.setdefault(trace_id, _Rollout(question))
            rollout.touched = time.monotonic()
            have = len(rollout.steps)
            if step.index < have and rollout.steps[step.index].step == step:
                return
            if step.index != have:
                raise ValueError(
                    f"rollout {trace_id!r}: step {step.index} submitted after {have} step(s); "
                    "steps come in order, each once"
                )
            steps = [a.step for a in rollout.steps] + [step]
            partial = Trace(id=trace_id, question=question, steps=steps)
            request = self.checker.judge_requests(partial)[-1]
            asked = _Asked(step, _prompt_key(request), request)
            rollout.steps.append(asked)
            self.stats["submitted"] += 1
        self.pending.put(asked)

    def submit_response(self, trace_id: str, question: str, response: str) -> int:
        """Submit the steps of a rollout's text so far that are complete (their evidence has
        come back) and not yet submitted; returns how many were new. For a tool that sees the
        whole text: call it each time a search result is appended."""
        try:
            steps = segment_trace(Trace(id=trace_id, question=question, response=response)).steps
        except SegmentationError:
            return 0  # not a step yet; the end of the rollout decides
        complete = [s for s in steps or [] if s.type != "conclusion" and s.evidence]
        with self.lock:
            rollout = self.rollouts.get(trace_id)
            have = len(rollout.steps) if rollout is not None else 0
        for step in complete[have:]:
            self.submit(trace_id, question, step)
        return max(0, len(complete) - have)

    def verdict(self, trace_id: str, index: int, wait: float = 0.0) -> Verdict | None:
        """Step `index`'s verdict, if the judge's answers for steps 0..index come within `wait`
        seconds (0: only if they are in already); None if not, or if one of them failed. It is
        the verdict the end-of-rollout check gives that step: step i's request and its decision
        read only steps 0..i."""
        with self.lock:
            rollout = self.rollouts.get(trace_id)
            asked = list(rollout.steps[: index + 1]) if rollout is not None else []
            question = rollout.question if rollout is not None else ""
        if len(asked) <= index:
            return None
        until = time.monotonic() + wait
        judged: list[JudgeResult] = []
        for a in asked:
            try:
                judged.append(a.answer.result(max(0.0, until - time.monotonic())))
            except Exception:  # not in time, cancelled or failed: no verdict to tell yet
                return None
        trace = Trace(id=trace_id, question=question, steps=[a.step for a in asked])
        return self.checker.decide(trace, judged)[index]

    def tell(self, trace_id: str, question: str, response: str, wait: float = 0.0) -> Told:
        """Typed feedback (`stepgap.feedback`): submit the complete steps of the rollout's text
        so far, then, if that made a new step, its note when its verdict comes within `wait`
        seconds and is a gap. Counts what it told (`stats`: notes, no_gap, too_late,
        waited_s)."""
        new = self.submit_response(trace_id, question, response)
        if new == 0:
            return Told()  # no new step (a repeated tool call, or no search result yet)
        with self.lock:
            rollout = self.rollouts.get(trace_id)
        if rollout is None:  # dropped meanwhile
            return Told(new_steps=new)
        started = time.monotonic()
        verdict = self.verdict(trace_id, len(rollout.steps) - 1, wait)
        waited = time.monotonic() - started
        kind = "too_late" if verdict is None else "notes"
        if verdict is not None and verdict.label == "no_gap":
            kind = "no_gap"
        with self.lock:
            self.stats["waited_s"] += waited
            self.stats[kind] += 1
        note = None if verdict is None else note_for(verdict.label)
        return Told(note, verdict is None, waited, new)

    def drop(self, trace_id: str) -> int:
        """Forget a rollout that will never be finalized; its unsent steps are not sent.
        Returns the steps dropped before they were asked."""
        with self.lock:
            rollout = self.rollouts.pop(trace_id, None)
        if rollout is None:
            return 0
        cancelled = sum(a.answer.cancel() for a in rollout.steps)
        self._count("dropped", cancelled)
        return cancelled

    # ------------------------------------------------------------------ at the end
    def finalize(self, trace: Trace, deadline: TraceDeadline | None = None) -> RewardResult:
        """The rollout's reward: its steps (segmented from `trace.response` when `trace.steps`
        is unset) checked, reusing each answer already made for the same prompt. `deadline`
        goes with the requests asked now and bounds the wait for those still being asked."""
        with self.lock:
            rollout = self.rollouts.pop(trace.id, None)
        if trace.steps is None:
            trace = self.reward.trace(trace.response or "", trace.question,
                                      trace.golden_answers or [], trace.id)  # fmt: skip
        reward = self.reward
        if reward.variant == "search_only":
            return reward.result(trace, [])
        steps = trace.steps or []
        try:
            requests = self.checker.judge_requests(trace) if steps else []
            earlier = {a.key: a for a in rollout.steps} if rollout is not None else {}
            judged: list[JudgeResult | None] = [None] * len(requests)
            missing: list[int] = []
            for i, request in enumerate(requests):
                asked = earlier.get(_prompt_key(request))
                if asked is not None and not asked.answer.cancelled():
                    wait = deadline.remaining() if deadline is not None else None
                    judged[i] = asked.answer.result(wait)  # waits if it is still being checked
                    self._count("reused")
                else:
                    missing.append(i)
            if missing:
                self._count("asked_at_end", len(missing))
                for i in missing:
                    requests[i].deadline = deadline
                answers = self.checker.judge.judge([requests[i] for i in missing])
                for i, answer in zip(missing, answers, strict=True):
                    judged[i] = answer
            verdicts = self.checker.decide(trace, judged)
        except Exception as exc:  # a reward inside training must not raise (as `check`)
            log.exception("checker failed on rollout %s; its steps earn bracket 0", trace.id)
            verdicts = failed_verdicts(trace.id, steps, f"checker failed: {exc!r}")
        checked: list[Verdict] = _complete(trace, verdicts)
        reward._count_failures([checked])
        return reward.result(trace, checked)

    def score(
        self, response: str, question: str, golden_answers: list[str] | str, trace_id: str
    ) -> RewardResult:
        """`finalize` for a finished rollout's text."""
        return self.finalize(self.reward.trace(response, question, golden_answers, trace_id))

    # ------------------------------------------------------------------ the pool
    def _work(self) -> None:
        judge = self.checker.judge
        while (first := self.pending.get()) is not None:
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    more = self.pending.get_nowait()
                except queue.Empty:
                    break
                if more is None:  # closing: let the other workers see it too
                    self.pending.put(None)
                    break
                batch.append(more)
            live = [a for a in batch if a.answer.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                answers = judge.judge([a.request for a in live])
            except Exception as exc:  # finalize sees it, and the reward counts it
                for a in live:
                    a.answer.set_exception(exc)
                continue
            for a, answer in zip(live, answers, strict=True):
                a.answer.set_result(answer)

    def _forget_stale(self) -> None:
        if self.forget_after <= 0:
            return
        cutoff = time.monotonic() - self.forget_after
        with self.lock:
            stale = [k for k, r in self.rollouts.items() if r.touched < cutoff]
        for trace_id in stale:
            log.info("rollout %s not finalized in %g s: its steps are dropped", trace_id,
                     self.forget_after)  # fmt: skip
            self.drop(trace_id)

    def _count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.stats[what] += n

    def unfinished(self) -> int:
        """Rollouts submitted and not yet finalized or dropped."""
        with self.lock:
            return len(self.rollouts)

    def close(self, wait: bool = True) -> None:
        """Stop the workers once the steps already queued are asked (`wait=False`: the steps
        not yet sent are dropped, and the judge calls under way are not waited for)."""
        if self.closed:
            return
        self.closed = True
        if not wait:
            with self.lock:
                ids = list(self.rollouts)
            for trace_id in ids:
                self.drop(trace_id)
        for _ in self.threads:
            self.pending.put(None)
        if wait:
            for t in self.threads:
                t.join()

    def __enter__(self) -> StreamingReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
