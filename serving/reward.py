"""docs/contract.md section 4, exactly: per-step base and shaping rewards, EM, five variants, dense form.

A step whose check failed (label null) earns nothing and is treated as no_gap when the next
step's shaping looks back at it: a checker fault must never be paid or punished as a gap.
Inside training the reward never raises (`StepGapReward`): a checker that fails on a batch gives
error verdicts (bracket 0 for each step), a response that cannot be segmented is scored on EM
alone; both are logged and counted in `StepGapReward.failures` and in each result's scalars.
"""

from __future__ import annotations

import bisect
import logging
import re
import string
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from stepgap.data_builders.io import ErrorReport, check_output
from stepgap.data_builders.schema import Step, Trace, Verdict
from stepgap.data_builders.segment import SegmentationError, segment_trace
from stepgap.tags import last_block

log = logging.getLogger(__name__)

Variant = Literal["search_only", "binary_gap", "typed_base", "typed_shape", "untyped_dense"]
VARIANTS: tuple[str, ...] = (
    "search_only",
    "binary_gap",
    "typed_base",
    "typed_shape",
    "untyped_dense",
)
BASE = {"no_gap": 0.20, "MB": -0.05, "IE": -0.10, "CC": 0.05}
SHAPE_RESEARCH, SHAPE_RETRACT, SHAPE_IGNORED, SHAPE_LAZY = 0.10, 0.15, -0.15, -0.05
# Token F1 strictly above 7/10: a near-duplicate query, or too close to the previous claim to be
# a retraction. Compared as exact fractions so that F1 = 0.7 is never a duplicate by rounding.
DUPLICATE_F1 = Fraction(7, 10)
RETRACTION_CUES = re.compile(r"\b(actually|wait|correction|i was wrong)\b", re.IGNORECASE)


# ------------------------------------------------------------------ text helpers (SQuAD)
def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1_exact(a: str, b: str) -> Fraction:
    """SQuAD token F1 after normalisation, as an exact fraction: 2 * common / (|a| + |b|)."""
    ta, tb = normalize_answer(a).split(), normalize_answer(b).split()
    common = sum((Counter(ta) & Counter(tb)).values())
    return Fraction(2 * common, len(ta) + len(tb)) if common else Fraction(0)


def token_f1(a: str, b: str) -> float:
    """SQuAD token F1 of two strings after normalisation."""
    return float(token_f1_exact(a, b))


def is_near_duplicate(query: str, earlier: Sequence[str]) -> bool:
    return any(token_f1_exact(query, q) > DUPLICATE_F1 for q in earlier)


def is_retraction(claim: str, previous_claim: str) -> bool:
    return (
        bool(RETRACTION_CUES.search(claim))
        and token_f1_exact(claim, previous_claim) <= DUPLICATE_F1
    )


def final_answer(response: str | None, steps: Sequence[Step]) -> str | None:
    """The last `<answer>` of the response, tags in any case (an unclosed one runs to the end);
    without a response, the last conclusion step's answer."""
    if response and (answer := last_block(response, "answer")) is not None:
        return answer
    answers = [s.answer for s in steps if s.answer is not None]
    return answers[-1] if answers else None


def exact_match(answer: str | None, golden: Sequence[str]) -> float:
    if answer is None:
        return 0.0
    norm = normalize_answer(answer)
    return 1.0 if any(norm == normalize_answer(g) for g in golden) else 0.0


# ------------------------------------------------------------------ the reward
@dataclass
class StepReward:
    step: int
    label: str | None
    base: float
    shape: float
    bracket: float
    span: list[int] | None
    token_span: list[int] | None = None
    shape_case: int = 5  # which shaping case of the contract fired (5 = none)


@dataclass
class RewardResult:
    trace_id: str
    variant: str
    lam: float
    em: float
    reward: float
    steps: list[StepReward] = field(default_factory=list)
    em_token: int | None = None  # dense form: EM sits on the last response token
    failed_checks: int = 0  # steps whose check failed (an error verdict): each earned bracket 0
    unsegmented: bool = False  # the response could not be segmented: EM alone, no step brackets

    def scalars(self) -> dict[str, float]:
        """Score, EM and per-label step rates: what RL frameworks log per sample."""
        counts = Counter(s.label for s in self.steps)
        n = len(self.steps)
        out = {
            "score": self.reward,
            "em": self.em,
            "dense": self.reward - self.em,
            "n_steps": float(n),
            "failed_checks": float(self.failed_checks),
            "unsegmented": float(self.unsegmented),
        }
        for lab in ("no_gap", "CC", "IE", "MB"):
            out[f"rate_{lab}"] = counts.get(lab, 0) / n if n else 0.0
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for s in d["steps"]:
            s.pop("shape_case")
        return d


def _searches(step: Step) -> bool:
    return step.type == "inference" and bool(step.query)


def _answers(step: Step) -> bool:
    return step.type == "conclusion"


def shape_for(
    prev_label: str, step: Step, prev_claim: str, earlier_queries: Sequence[str]
) -> tuple[float, int]:
    """(shaping reward, case number): the first shaping case (docs/contract.md, section 4) that holds."""
    if (
        prev_label in ("IE", "MB")
        and _searches(step)
        and not is_near_duplicate(step.query or "", earlier_queries)
    ):
        return SHAPE_RESEARCH, 1
    if prev_label == "CC" and is_retraction(step.claim, prev_claim):
        return SHAPE_RETRACT, 2
    if prev_label in ("IE", "MB", "CC") and _answers(step):
        return SHAPE_IGNORED, 3
    if prev_label in ("IE", "MB") and _searches(step):
        return SHAPE_LAZY, 4
    return 0.0, 5


def _base(label: str | None, variant: str) -> float:
    if label is None or variant == "search_only":
        return 0.0
    if variant == "binary_gap":
        return 0.20 if label == "no_gap" else 0.0
    if variant == "untyped_dense":
        return 0.20 if label == "no_gap" else -0.10
    return BASE[label]


def compute_reward(
    trace: Trace,
    verdicts: Sequence[Verdict],
    *,
    variant: str = "typed_shape",
    lam: float = 1.0,
    tokenizer: Any = None,
) -> RewardResult:
    """The reward of one segmented trace given its verdicts (one per step, any order)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown reward variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    steps = trace.steps or []
    by_step = {v.step: v for v in verdicts}
    missing = [s.index for s in steps if s.index not in by_step]
    if missing and variant != "search_only":  # search_only needs no checker
        raise ValueError(f"trace {trace.id!r}: no verdict for step(s) {missing}")
    em = exact_match(final_answer(trace.response, steps), trace.golden_answers or [])
    offsets = (
        _token_offsets(trace.response, tokenizer)
        if tokenizer is not None and trace.response
        else None
    )
    rows: list[StepReward] = []
    prev_label, prev_claim, queries = "no_gap", "", []
    for step in steps:
        label = by_step[step.index].label if step.index in by_step else None
        base = _base(label, variant)
        shape, case = (0.0, 5)
        if variant == "typed_shape" and label is not None:
            shape, case = shape_for(prev_label, step, prev_claim, queries)
        span = list(step.span) if step.span else None
        rows.append(
            StepReward(
                step=step.index,
                label=label,
                base=base,
                shape=shape,
                bracket=round(base + shape, 10),
                span=span,
                token_span=_token_span(offsets, span) if offsets is not None and span else None,
                shape_case=case,
            )
        )
        prev_label = label or "no_gap"
        prev_claim = step.claim
        if _searches(step):
            queries.append(step.query or "")
    dense = 0.0 if variant == "search_only" else sum(r.bracket for r in rows)
    return RewardResult(
        failed_checks=sum(1 for v in by_step.values() if v.label is None),
        unsegmented=trace.steps == [],
        trace_id=trace.id,
        variant=variant,
        lam=lam,
        em=em,
        reward=em + lam * dense,
        steps=rows,
        em_token=len(offsets) - 1 if offsets else None,
    )


def _token_offsets(text: str, tokenizer: Any) -> list[tuple[int, int]]:
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    return [tuple(o) for o in enc["offset_mapping"]]


def _token_span(offsets: list[tuple[int, int]], span: list[int]) -> list[int] | None:
    """[first, last + 1) of the tokens overlapping the character range [start, end).

    Token offsets run left to right, so both ends are binary searches: a 10,000-step response
    costs steps x log(tokens), not steps x tokens.
    """
    start, end = span
    # The first token that ends after `start`, and the first that starts at or after `end`.
    first = bisect.bisect_right(offsets, start, key=lambda o: o[1])
    stop = bisect.bisect_left(offsets, end, key=lambda o: o[0])
    return [first, stop] if first < stop else None


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

    `checker` is anything with `check(traces) -> list[list[Verdict]]` (the teacher `Checker`,
    an offline bundle's checker, or a remote one). Scoring never raises on a checker fault or an
    unreadable response (see the module docstring); `failures` counts both kinds.
    """

    def __init__(
        self, checker: Any, variant: str = "typed_shape", lam: float = 1.0, tokenizer: Any = None
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(
                f"unknown reward variant {variant!r}; choose one of {', '.join(VARIANTS)}"
            )
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
        self, traces: Sequence[Trace], *, stop: threading.Event | None = None
    ) -> Iterator[tuple[int, list[Verdict]]]:
        """(position in `traces`, its verdicts), each trace as soon as its own steps are checked
        (the checker's `check_stream`; one `check` call for a checker without it). Faults are
        handled as in `check`: the traces left when the checker fails get error verdicts.
        `stop`, set from another thread, ends the stream early (nothing more is yielded)."""
        traces = list(traces)
        stream = getattr(self.checker, "check_stream", None)
        if stream is None:
            yield from enumerate(self.check(traces))
            return
        position = {id(t): i for i, t in enumerate(traces)}
        left = set(range(len(traces)))
        seen: list[list[Verdict]] = []  # counted once the stream ends, as `check` counts a call
        try:
            try:
                for trace, verdicts in stream(traces, batch_size=8, stop=stop):
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
            log.warning(
                "every step check failed (%d of %d): the reward is EM alone until the checker "
                "works. First error: %s",
                len(failed),
                len(steps),
                failed[0].error,
            )
        else:
            log.warning("%d step check(s) failed in this batch: bracket 0 each", len(failed))

    def score_traces(self, traces: Sequence[Trace]) -> list[RewardResult]:
        """Rewards for many rollouts with one checker call (the checker batches judge and NLI)."""
        if self.variant == "search_only":  # EM alone: the checker is not called
            verdicts: list[list[Verdict]] = [[] for _ in traces]
        else:
            verdicts = self.check(traces)
        return [self.result(t, vs) for t, vs in zip(traces, verdicts, strict=True)]

    def result(self, trace: Trace, verdicts: Sequence[Verdict]) -> RewardResult:
        """docs/contract.md section 4 for one checked trace, with this reward's variant, lambda, tokenizer."""
        return compute_reward(
            trace, verdicts, variant=self.variant, lam=self.lam, tokenizer=self.tokenizer
        )

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

    def __call__(self, response: str, question: str, golden_answers: Sequence[str] | str) -> float:
        return self.score([response], [question], [golden_answers])[0].reward


def reward_file(
    input_path: str | Path,
    verdicts_path: str | Path,
    output: str | Path,
    *,
    variant: str = "typed_shape",
    lam: float = 1.0,
    tokenizer: str | Any = None,
    report: ErrorReport | None = None,
) -> int:
    """Rewards for stored traces and their verdicts, one line per trace (`stepgap reward`);
    returns the lines written. `tokenizer` (hub id, path or tokenizer) adds token spans."""
    from stepgap.data_builders.io import JsonlWriter, read_models
    from stepgap.data_builders.segment import iter_traces

    check_output(output, input_path, verdicts_path)
    report = report if report is not None else ErrorReport()
    by_trace: dict[str, list[Verdict]] = {}
    for _, v in read_models(verdicts_path, Verdict, report):
        by_trace.setdefault(v.trace_id, []).append(v)
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        from stepgap.models import check_model_ref, explain_load_errors

        with explain_load_errors(tokenizer, "tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(check_model_ref(tokenizer))
    n = 0
    with JsonlWriter(output) as out:
        for trace in iter_traces(input_path, report):
            try:
                result = compute_reward(
                    trace,
                    by_trace.get(trace.id, []),
                    variant=variant,
                    lam=lam,
                    tokenizer=tokenizer,
                )
            except ValueError as exc:
                report.add(verdicts_path, 0, str(exc), field="step")
                continue
            out.write(result.as_dict())
            n += 1
    return n
