"""The reward inside training: responses in, rewards out (segment, check every step with the
checker, then `stepgap.reward_arithmetic`'s arithmetic, docs/contract.md section 4).

Scoring never raises (`StepGapReward`): a checker that fails on a batch gives error verdicts, a
response that cannot be segmented is scored on EM alone; both are logged and counted in
`StepGapReward.failures` and in each result's scalars. A trace with a failed check gets no
reward by default (`on_failed_check="no_reward"`: `RewardResult.unavailable` says why, and each
adapter gives its trainer's own "no reward": `None` for TRL, a non-200 answer for OpenRLHF, an
exception for veRL); `on_failed_check="zero"` scores it instead, a failed step earning 0 (EM
alone when every check failed), as an explicit choice.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepgap.clock import TraceDeadline
from stepgap.io import ErrorReport, check_output
from stepgap.options import Options, one_of, option
from stepgap.reward_arithmetic import (
    ON_FAILED_CHECK,
    VARIANTS,
    OnFailedCheck,
    RewardResult,
    Variant,
    compute_reward,
)
from stepgap.schema import Step, Trace, Verdict
from stepgap.segment import SegmentationError, segment_trace
from stepgap.teacher.checker import StepChecker

log = logging.getLogger(__name__)

REWARD_GROUP = "the reward"


@dataclass(frozen=True)
class RewardFormula(Options):
    """How verdicts become a number (docs/contract.md, section 4): the variant and lambda of
    `RewardOptions`."""

    variant: Variant = option(
        "typed_shape", "the reward variant (docs/contract.md, section 4)", group=REWARD_GROUP
    )
    lam: float = option(1.0, "weight of the step rewards", group=REWARD_GROUP)

    def __post_init__(self) -> None:
        one_of("variant", self.variant, VARIANTS)
        if isinstance(self.lam, bool) or not isinstance(self.lam, int | float):
            raise ValueError(f"lam must be a number, got {self.lam!r}")
        super().__post_init__()


@dataclass(frozen=True)
class FailedCheckOptions(Options):
    """What a trace with a failed step check gets: the one option of `stepgap view` about the
    reward, and part of `RewardOptions`."""

    on_failed_check: OnFailedCheck = option(
        "no_reward",
        "a trace with a failed step check (a judge that was down, an answer that could not be "
        "parsed) has no reward (no_reward: in training TRL's None, OpenRLHF a 503, veRL an "
        "exception), or is scored with that step at 0 (zero: EM alone when every check failed)",
        group=REWARD_GROUP,
    )

    def __post_init__(self) -> None:
        one_of("on_failed_check", self.on_failed_check, ON_FAILED_CHECK)
        super().__post_init__()


@dataclass(frozen=True)
class RewardOptions(FailedCheckOptions, RewardFormula):
    """How verdicts become the reward: one set of options for `stepgap reward`'s and `stepgap
    serve`'s flags, a reward JSON file's keys (veRL, OpenRLHF, Ray Serve) and veRL's
    `reward_kwargs`."""

    def reward(self, checker: StepChecker, tokenizer: Any = None) -> StepGapReward:
        return StepGapReward(
            checker, self.variant, self.lam, tokenizer, on_failed_check=self.on_failed_check
        )


class RewardUnavailable(RuntimeError):
    """A rollout that has no reward (`RewardResult.unavailable`), raised where a trainer has no
    other way to leave a sample unrewarded (veRL's `compute_score`, OpenRLHF's `reward_func`)."""


def available(result: RewardResult) -> float:
    """The reward, or `RewardUnavailable` naming why there is none."""
    if result.reward is None:
        raise RewardUnavailable(f"no reward for rollout {result.trace_id}: {result.unavailable}")
    return result.reward


def failed_verdicts(trace_id: str, steps: Sequence[Step], reason: str) -> list[Verdict]:
    """One error verdict per step: what a checker fault turns into (never a label)."""
    return [
        Verdict(trace_id=trace_id, step=s.index, type=s.type, label=None, repair=None, error=reason)
        for s in steps
    ]


def _complete(trace: Trace, verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The verdicts plus an error verdict for each step the checker left out."""
    have = {v.step for v in verdicts}
    missing = [s for s in trace.steps or [] if s.index not in have]
    return [*verdicts, *failed_verdicts(trace.id, missing, "checker gave no verdict for this step")]


class StepGapReward:
    """Response in, reward out: segment, check every step, apply docs/contract.md section 4.

    `checker` is a `StepChecker` (the teacher's `Checker`, an offline bundle's checker, or a
    remote one). Scoring never raises on a checker fault or an
    unreadable response (see the module docstring); `failures` counts both kinds.
    `on_failed_check`: a trace with a failed step check gets no reward (`no_reward`) or is
    scored with that step at 0 (`zero`).
    """

    def __init__(
        self,
        checker: StepChecker,
        variant: str = "typed_shape",
        lam: float = 1.0,
        tokenizer: Any = None,
        on_failed_check: str = "no_reward",
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(
                f"unknown reward variant {variant!r}; choose one of {', '.join(VARIANTS)}"
            )
        if on_failed_check not in ON_FAILED_CHECK:
            raise ValueError(
                f"on_failed_check must be one of {', '.join(ON_FAILED_CHECK)}, got "
                f"{on_failed_check!r}"
            )
        self.on_failed_check = on_failed_check
        self.checker = checker
        self.variant = variant
        self.lam = lam
        self.tokenizer = tokenizer
        self.failures: Counter[str] = Counter()
        self._warned_all_failed = False

    def trace(
        self, response: str, question: str, golden_answers: Sequence[str] | str, trace_id: str = ""
    ) -> Trace:
        """The segmented rollout; one that cannot be segmented gets no steps (EM alone)."""
        golden = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
        raw = Trace(
            id=trace_id or "rollout", question=question, golden_answers=golden, response=response
        )
        try:
            return segment_trace(raw)
        except SegmentationError as exc:
            self.failures["unsegmented"] += 1
            log.warning("rollout %s cannot be segmented (%s): scored on EM alone", raw.id, exc)
            return raw.model_copy(update={"steps": []})

    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        """The checker's verdicts; if it fails, error verdicts for every step (logged, counted)."""
        try:
            verdicts = self.checker.check(list(traces))
            if len(verdicts) != len(traces):
                raise RuntimeError(f"checker answered {len(verdicts)} of {len(traces)} traces")
        except Exception as exc:  # a reward inside training must not raise
            log.exception("checker failed on %d traces; their steps earn bracket 0", len(traces))
            verdicts = [
                failed_verdicts(t.id, t.steps or [], f"checker failed: {exc!r}") for t in traces
            ]
        verdicts = [_complete(t, vs) for t, vs in zip(traces, verdicts, strict=True)]
        self._count_failures(verdicts)
        return verdicts

    def check_stream(
        self,
        traces: Sequence[Trace],
        *,
        stop: threading.Event | None = None,
        deadlines: Sequence[TraceDeadline | None] | None = None,
    ) -> Iterator[tuple[int, list[Verdict]]]:
        """(position in `traces`, its verdicts), each trace as soon as its own steps are checked
        (the checker's `check_stream`; one `check` call for a checker whose judges live
        elsewhere: replicas behind a URL, which stream on their own side). Faults are
        handled as in `check`: the traces left when the checker fails get error verdicts.
        `stop`, set from another thread, ends the stream early (nothing more is yielded);
        `deadlines` (one per trace) go with the traces' judge requests."""
        traces = list(traces)
        if self.checker.judge is None:
            yield from enumerate(self.check(traces))
            return
        stream = self.checker.check_stream
        options: dict[str, Any] = {"batch_size": 8, "stop": stop}
        if deadlines is not None:
            options["deadlines"] = deadlines
        position = {id(t): i for i, t in enumerate(traces)}
        left = set(range(len(traces)))
        seen: list[list[Verdict]] = []  # counted once the stream ends, as `check` counts a call
        try:
            try:
                for trace, verdicts in stream(traces, **options):
                    i = position[id(trace)]
                    left.discard(i)
                    seen.append(_complete(trace, verdicts))
                    yield i, seen[-1]
            except Exception as exc:  # a reward inside training must not raise
                log.exception("checker failed on %d traces; their steps earn bracket 0", len(left))
                for i in sorted(left):
                    t = traces[i]
                    seen.append(failed_verdicts(t.id, t.steps or [], f"checker failed: {exc!r}"))
                    yield i, seen[-1]
        finally:
            self._count_failures(seen)

    def _count_failures(self, verdicts: Sequence[Sequence[Verdict]]) -> None:
        """Count failed checks; the first time every check of a call fails, say so loudly: a
        reward that silently fell to EM alone (a judge that cannot be reached, say) looks
        like a working one in a training log."""
        steps = [v for vs in verdicts for v in vs]
        failed = [v for v in steps if v.label is None]
        if not failed:
            if steps:
                self._warned_all_failed = True  # the checker works; later faults are counted
            return
        self.failures["failed_checks"] += len(failed)
        if len(failed) == len(steps) and not self._warned_all_failed:
            self._warned_all_failed = True
            outcome = (
                "these rollouts get no reward"
                if self.on_failed_check == "no_reward"
                else "the reward is EM alone (on_failed_check=zero)"
            )
            log.warning(
                "every step check failed (%d of %d): %s until the checker works. First error: %s",
                len(failed),
                len(steps),
                outcome,
                failed[0].error,
            )
        else:
            log.warning(
                "%d step check(s) failed in this batch: bracket 0 each. First error: %s",
                len(failed),
                failed[0].error,
            )

    def score_traces(self, traces: Sequence[Trace]) -> list[RewardResult]:
        """Rewards for many rollouts with one checker call (the checker batches judge and NLI)."""
        if self.variant == "search_only":  # EM alone: the checker is not called
            verdicts: list[list[Verdict]] = [[] for _ in traces]
        else:
            verdicts = self.check(traces)
        return [self.result(t, vs) for t, vs in zip(traces, verdicts, strict=True)]

    def result(self, trace: Trace, verdicts: Sequence[Verdict]) -> RewardResult:
        """docs/contract.md section 4 for one checked trace, with this reward's variant, lambda,
        tokenizer; with a failed check and `on_failed_check="no_reward"`, no reward (`reward`
        None, `unavailable` says why)."""
        result = compute_reward(
            trace,
            verdicts,
            variant=self.variant,
            lam=self.lam,
            tokenizer=self.tokenizer,
            on_failed_check=self.on_failed_check,
        )
        if result.reward is None:
            self.failures["no_reward"] += 1
        return result

    def score(
        self,
        responses: Sequence[str],
        questions: Sequence[str],
        golden_answers: Sequence[Sequence[str] | str],
    ) -> list[RewardResult]:
        traces = [
            self.trace(r, q, g, f"rollout-{i}")
            for i, (r, q, g) in enumerate(zip(responses, questions, golden_answers, strict=True))
        ]
        return self.score_traces(traces)

    def __call__(
        self, response: str, question: str, golden_answers: Sequence[str] | str
    ) -> float | None:
        """One rollout's reward; None when it has none (a failed check, see `on_failed_check`)."""
        return self.score([response], [question], [golden_answers])[0].reward


def default_inflight(reward: StepGapReward) -> int:
    """Checker calls in flight by default: 8 when the judge is a server (an OpenAI-compatible
    engine, or `stepgap serve` replicas) or vLLM's async engine in this process, whose own
    batching does the work across calls; 1 for a model decoded batch by batch in this process,
    which a second call would only slow down and double in memory."""
    judge = reward.checker.judge
    if judge is None or judge.base_url is not None:
        return 8
    return 8 if judge.online else 1


def reward_file(
    input_path: str | Path,
    verdicts_path: str | Path,
    output: str | Path,
    *,
    variant: str = "typed_shape",
    lam: float = 1.0,
    tokenizer: str | Any = None,
    on_failed_check: str = "no_reward",
    report: ErrorReport | None = None,
) -> int:
    """Rewards for stored traces and their verdicts, one line per trace (`stepgap reward`);
    returns the lines written. `tokenizer` (hub id, path or tokenizer) adds token spans. A trace
    with a failed step check has no reward (`"reward": null`, `unavailable` says why) unless
    `on_failed_check="zero"`, as in training."""
    from stepgap.io import JsonlWriter, read_models
    from stepgap.segment import iter_traces

    RewardOptions(variant=variant, lam=lam, on_failed_check=on_failed_check)  # checked at once
    check_output(output, input_path, verdicts_path)
    report = report if report is not None else ErrorReport()
    by_trace: dict[str, list[Verdict]] = {}
    for _, v in read_models(verdicts_path, Verdict, report):
        by_trace.setdefault(v.trace_id, []).append(v)
    if isinstance(tokenizer, str):
        from stepgap.models import check_model_ref, explain_load_errors, load_tokenizer

        with explain_load_errors(tokenizer, "tokenizer"):
            tokenizer = load_tokenizer(check_model_ref(tokenizer))
    n = 0
    with JsonlWriter(output, input_path, verdicts_path) as out:
        for trace in iter_traces(input_path, report):
            try:
                result = compute_reward(
                    trace,
                    by_trace.get(trace.id, []),
                    variant=variant,
                    lam=lam,
                    tokenizer=tokenizer,
                    on_failed_check=on_failed_check,
                )
            except ValueError as exc:
                report.add(verdicts_path, 0, str(exc), field="step")
                continue
            out.write(result.as_dict())
            n += 1
    return n
