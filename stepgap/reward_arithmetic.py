"""The reward's arithmetic, docs/contract.md section 4, exactly: per-step base and shaping
rewards, EM on the final answer, five variants, the dense form. Verdicts in, numbers out: no
model is called here (`stepgap.serving.reward_function.StepGapReward` checks the steps first).

A step whose check failed (label null) earns nothing and is treated as no_gap when the next
step's shaping looks back at it: a checker fault must never be paid or punished as a gap. A trace
with such a step has no reward by default (`on_failed_check="no_reward"`, as in training: the
result's `reward` is None and `unavailable` says why); `on_failed_check="zero"` gives it the
number those brackets add up to (EM alone when every check failed).
"""

from __future__ import annotations

import bisect
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Literal, get_args

from stepgap.schema import GAP_TYPES, Step, Trace, Verdict
from stepgap.tags import last_block

Variant = Literal["search_only", "binary_gap", "typed_base", "typed_shape", "untyped_dense"]
VARIANTS: tuple[str, ...] = (
    "search_only",
    "binary_gap",
    "typed_base",
    "typed_shape",
    "untyped_dense",
)
# What a trace with a failed step check gets: no reward (the default), or its failed steps 0.
OnFailedCheck = Literal["no_reward", "zero"]
ON_FAILED_CHECK: tuple[str, ...] = get_args(OnFailedCheck)
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
    reward: float | None  # None: no reward (see `unavailable`), never a number passed off as one
    steps: list[StepReward] = field(default_factory=list)
    em_token: int | None = None  # dense form: EM sits on the last response token
    failed_checks: int = 0  # steps whose check failed (an error verdict): each earned bracket 0
    unsegmented: bool = False  # the response could not be segmented: EM alone, no step brackets
    # Why the trace has no reward (a failed check, when failed checks are not scored): `reward`
    # is then None, and the adapters give the trainer's own "no reward" instead.
    unavailable: str | None = None

    def __post_init__(self) -> None:
        if (self.reward is None) != (self.unavailable is not None):
            raise ValueError(
                f"trace {self.trace_id!r}: a reward is either a number or None with the reason "
                f"in `unavailable`, got reward={self.reward!r}, unavailable={self.unavailable!r}"
            )

    def scalars(self) -> dict[str, float]:
        """Score, EM and per-label step rates: what RL frameworks log per sample (without
        `score` and `dense` when the trace has no reward)."""
        counts = Counter(s.label for s in self.steps)
        n = len(self.steps)
        reward = self.reward
        out: dict[str, float] = {} if reward is None else {"score": reward}
        out["em"] = self.em
        if reward is not None:
            out["dense"] = reward - self.em
        out["n_steps"] = float(n)
        out["failed_checks"] = float(self.failed_checks)
        out["unsegmented"] = float(self.unsegmented)
        for lab in ("no_gap", "CC", "IE", "MB"):
            out[f"rate_{lab}"] = counts.get(lab, 0) / n if n else 0.0
        chances, repaired = self.repairs()
        out["repair_chances"] = float(chances)
        out["repair_rate"] = repaired / chances if chances else 0.0
        return out

    def repairs(self) -> tuple[int, int]:
        """(steps after a gap, those that made its repair): shaping cases 1 and 2 of the
        contract, a new search after IE or MB, a retraction after CC."""
        pairs = zip(self.steps, self.steps[1:], strict=False)
        after_gap = [s for prev, s in pairs if prev.label in GAP_TYPES]
        return len(after_gap), sum(s.shape_case in (1, 2) for s in after_gap)

    def split_at(self, ends: Sequence[int]) -> list[float]:
        """The reward cut into pieces at character positions of the response (each turn's end,
        in order): piece i holds lambda * bracket of every step whose span ends at or before
        `ends[i]` and after `ends[i - 1]`, and the last piece also holds EM and the steps past
        the last end or without a span. The pieces add up to `reward`: the dense form by turn
        (SkyRL's per-turn rewards, a per-step reward)."""
        if self.reward is None:
            raise ValueError(f"trace {self.trace_id!r} has no reward: {self.unavailable}")
        if not ends:
            raise ValueError("split_at needs at least one end")
        if any(b < a for a, b in zip(ends, ends[1:], strict=False)):
            raise ValueError(f"the ends must be in order, got {list(ends)}")
        pieces = [0.0] * len(ends)
        for step in self.steps:
            end = step.span[1] if step.span else None
            at = len(ends) - 1 if end is None else min(bisect.bisect_left(ends, end), len(ends) - 1)
            pieces[at] += self.lam * step.bracket
        pieces[-1] += self.em
        return pieces

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


def no_reward_reason(
    variant: str, failed_checks: int, steps: int, first_error: str | None = None
) -> str | None:
    """Why a trace has no reward when failed checks are not scored (`on_failed_check=
    "no_reward"`): how many of its step checks failed, and the first error; None when none
    failed, or for `search_only`, which reads no check."""
    if not failed_checks or variant == "search_only":
        return None
    reason = f"{failed_checks} of {steps} step check(s) failed"
    return f"{reason} (first: {first_error})" if first_error else reason


def compute_reward(
    trace: Trace,
    verdicts: Sequence[Verdict],
    *,
    variant: str = "typed_shape",
    lam: float = 1.0,
    tokenizer: Any = None,
    on_failed_check: str = "no_reward",
) -> RewardResult:
    """The reward of one segmented trace given its verdicts (one per step, any order). With a
    failed step check it has none (`reward` None, `unavailable` says why), unless
    `on_failed_check="zero"`: that step then earns 0."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown reward variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if on_failed_check not in ON_FAILED_CHECK:
        shown = ", ".join(ON_FAILED_CHECK)
        raise ValueError(f"on_failed_check must be one of {shown}, got {on_failed_check!r}")
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
    rows = _step_rewards(steps, by_step, variant, offsets)
    dense = 0.0 if variant == "search_only" else sum(r.bracket for r in rows)
    failed = sorted((v for v in by_step.values() if v.label is None), key=lambda v: v.step)
    reason = None
    if on_failed_check == "no_reward" and failed:
        reason = no_reward_reason(variant, len(failed), len(rows), failed[0].error)
    return RewardResult(
        failed_checks=len(failed),
        unsegmented=trace.steps == [],
        trace_id=trace.id,
        variant=variant,
        lam=lam,
        em=em,
        reward=None if reason else em + lam * dense,
        steps=rows,
        em_token=len(offsets) - 1 if offsets else None,
        unavailable=reason,
    )


def _step_rewards(
    steps: Sequence[Step],
    by_step: dict[int, Verdict],
    variant: str,
    offsets: list[tuple[int, int]] | None,
) -> list[StepReward]:
    """Each step's base, shaping and bracket, in order (a failed check: 0, read as no_gap)."""
    rows: list[StepReward] = []
    prev_label, prev_claim, queries = "no_gap", "", []
    for step in steps:
        label = by_step[step.index].label if step.index in by_step else None
        base = _base(label, variant)
        shape, case = (0.0, 5)
        if label is not None:  # the case whatever the variant: repairs() counts it
            shape, case = shape_for(prev_label, step, prev_claim, queries)
            shape = shape if variant == "typed_shape" else 0.0
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
    return rows


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
