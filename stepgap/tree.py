"""The checker's decision tree (docs/contract.md, section 3), one trace at a time, steps in order.

Stages A-C read the judge object, D and E ask the NLI model. The first stage that fires decides
the label; every stage visited appends a path token. Which NLI pairs a step needs depends on the
judge object alone (never on an earlier NLI answer), which lets the checker collect all pairs of a
batch in a dry run and score them in one batched call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel

from stepgap.options import Options, one_of, option
from stepgap.schema import REPAIRS, Judge, NLICall, NLILabel, NLIProbs, Snippet, Step, Verdict

# What the tree reads: a judge's answer (stages A-C) and NLI probabilities (D-E). The judge and
# NLI backends (`stepgap.teacher`) produce them; the tree itself asks no model.


@dataclass
class JudgeResult:
    """A judge object, or the reason there is none; `confidences` maps stage letter to prob.
    For a request with an `answer` schema, `judge` holds an instance of that model."""

    judge: Judge | BaseModel | None
    confidences: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # beyond the judge: a student's path, label

    @classmethod
    def failed(cls, error: str, usage: dict[str, int] | None = None) -> JudgeResult:
        return cls(judge=None, error=error, usage=usage or {})


Pair = tuple[str, str]  # (premise, hypothesis)
NLIFn = Callable[[Sequence[Pair]], list[NLIProbs]]


class NLIError(RuntimeError):
    """The NLI stage could not score a pair (missing replay entry, model failure)."""


def nli_label(
    probs: NLIProbs, entail_threshold: float = 0.5, contradict_threshold: float = 0.5
) -> NLILabel:
    """docs/contract.md section 3: entailment if p_ent >= t_e, contradiction if p_con >= t_c, else
    neutral. Backends return probabilities only, so thresholds can be swept over stored ones."""
    if probs.entailment >= entail_threshold:
        return "entailment"
    if probs.contradiction >= contradict_threshold:
        return "contradiction"
    return "neutral"


HypothesisMode = Literal["answer_statement", "answer", "claim"]
Ablation = Literal["A", "E"]


TREE_GROUP = "the decision tree"


@dataclass(frozen=True)
class TreeConfig(Options):
    """What can change a label without asking any model again. Every verdict records the one
    that decided it (`Verdict.tree`); its fields are the tree's flags and configuration keys."""

    ablate: Ablation | None = option(
        None, "remove a stage (docs/contract.md, section 3)", group=TREE_GROUP
    )
    entail_threshold: float = option(
        0.5, "stages D and E: entailment at or above this", group=TREE_GROUP
    )
    contradict_threshold: float = option(
        0.5, "stage D: contradiction at or above this", group=TREE_GROUP
    )
    hypothesis: HypothesisMode = option(
        "answer_statement", "the NLI hypothesis of a conclusion step", group=TREE_GROUP
    )

    def __post_init__(self) -> None:
        if self.ablate not in (None, "A", "E"):
            raise ValueError(f"ablate must be 'A', 'E' or None, got {self.ablate!r}")
        for name in ("entail_threshold", "contradict_threshold"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        one_of("hypothesis", self.hypothesis, ("answer_statement", "answer", "claim"))
        super().__post_init__()


# Every token a verdict path can hold, in stage order (the student is held to this vocabulary).
PATH_TOKENS: tuple[str, ...] = (
    "stageA:on_target",
    "stageA:off_target:entity_drift",
    "stageA:off_target:relation_drift",
    "stageA:off_target:scope_drift",
    "stageA:off_target:none",
    "stageB:grounded_abstention",
    "stageB:wrong_abstention",
    "stageB:not_abstention",
    "stageC:entity_mismatch",
    "stageC:quote",
    "stageC:quote_not_verbatim",
    "stageC:no_quote",
    "stageD:entailment",
    "stageD:neutral",
    "stageD:contradiction",
    "stageE:no_premises",
    "stageE:entailed",
    "stageE:not_entailed",
)


def hypothesis_for(step: Step, question: str, mode: HypothesisMode = "answer_statement") -> str:
    """The NLI hypothesis: an inference step's claim, a conclusion's answer statement."""
    if step.type == "inference" or mode == "claim":
        return step.claim
    answer = step.answer or ""
    if mode == "answer":
        return answer
    return f'The answer to "{question}" is {answer}.'


def normalise_quote(text: str) -> str:
    """Stage C's comparison of a quote with the evidence: whitespace collapsed, case folded."""
    return " ".join(text.split()).casefold()


def normalise_quote_with_origin(text: str) -> tuple[str, list[int]]:
    """`normalise_quote(text)` and, for each of its characters, the index in `text` it came
    from: the same comparison with a way back to the original text (to show where a quote is)."""
    chars: list[str] = []
    origin: list[int] = []
    space_at = -1
    for i, ch in enumerate(text):
        if ch.isspace():
            if chars and space_at < 0:
                space_at = i
            continue
        if space_at >= 0:
            chars.append(" ")
            origin.append(space_at)
            space_at = -1
        for folded in ch.casefold():
            chars.append(folded)
            origin.append(i)
    return "".join(chars), origin


class AccumulatedEvidence:
    """The evidence of steps 0..i, each snippet normalised once for the verbatim quote check
    (so checking every step of a long trace does not re-normalise all earlier snippets)."""

    def __init__(self, snippets: Sequence[Snippet] = ()) -> None:
        self._texts: list[str] = []
        self.extend(snippets)

    def extend(self, snippets: Sequence[Snippet]) -> None:
        self._texts.extend(normalise_quote(s.text) for s in snippets)

    def contains(self, quote: str) -> bool:
        """Whether the quote occurs (whitespace collapsed, case folded) inside one snippet's
        text: not across two snippets, not in a title."""
        q = normalise_quote(quote)
        return bool(q) and any(q in t for t in self._texts)


def quote_in_evidence(quote: str, evidence: Sequence[Snippet]) -> bool:
    """Whether the quote occurs verbatim (whitespace collapsed, case folded) in one snippet."""
    return AccumulatedEvidence(evidence).contains(quote)


@dataclass
class _Walk:
    """One step's walk through the tree: what it has visited and what it has asked."""

    step: Step
    question: str
    evidence: AccumulatedEvidence  # of steps 0..i
    premise_pool: list[Snippet]  # stage E premises: entity-matched earlier snippets
    judge: Judge
    judge_conf: dict[str, float]
    nli: NLIFn
    config: TreeConfig
    path: list[str] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    calls: list[NLICall] = field(default_factory=list)
    reached_c_with_entity: bool = False

    def visit(self, stage: str, token: str, reason: str = "") -> None:
        self.path.append(token)
        if stage in self.judge_conf:
            self.confidences.append(self.judge_conf[stage])
        if reason:
            self.reasons.append(f"{stage}: {reason}")

    def ask(self, stage: Literal["D", "E"], premises: Sequence[str]) -> list[NLICall]:
        hypothesis = hypothesis_for(self.step, self.question, self.config.hypothesis)
        probs = self.nli([(p, hypothesis) for p in premises])
        calls = [
            NLICall(
                stage=stage,
                premise=p,
                hypothesis=hypothesis,
                probs=pr,
                label=nli_label(pr, self.config.entail_threshold, self.config.contradict_threshold),
            )
            for p, pr in zip(premises, probs, strict=True)
        ]
        self.calls.extend(calls)
        return calls


def stage_a(w: _Walk) -> str | None:
    """A, alignment: a step that targets the wrong entity or relation is a contradicted claim."""
    if w.config.ablate == "A":
        return None
    a = w.judge.step_minus1_alignment
    if a.is_off_target:
        w.visit("A", f"stageA:off_target:{a.drift_type}", a.alignment_reasoning)
        return "CC"
    w.visit("A", "stageA:on_target")
    return None


def stage_b(w: _Walk) -> str | None:
    """B, abstention: grounded abstention is fine, an unjustified one contradicts the evidence."""
    b = w.judge.step_0_abstention_check
    if b.is_abstention_step and b.abstention_is_accurate:
        w.visit("B", "stageB:grounded_abstention", b.abstention_reasoning)
        return "no_gap"
    if b.is_abstention_step:
        w.visit("B", "stageB:wrong_abstention", b.abstention_reasoning)
        return "CC"
    w.visit("B", "stageB:not_abstention")
    return None


def stage_c(w: _Walk) -> str | None:
    """C, entity and quote: off-entity evidence is irrelevant; a verified quote goes to D.

    Without a verified quote an inference step is no-gap (a query is no NLI hypothesis) and a
    conclusion goes to E, or is IE at once under the `-E` ablation.
    """
    c = w.judge.step_1_quote_search
    if not c.entity_match:
        w.visit("C", "stageC:entity_mismatch", c.entity_match_reasoning)
        return "IE"
    w.reached_c_with_entity = True
    quote = c.evidence_quote
    if c.found_quote and quote.strip() and w.evidence.contains(quote):
        w.visit("C", "stageC:quote")
        return stage_d(w)
    if c.found_quote and quote.strip():
        w.visit("C", "stageC:quote_not_verbatim", "the claimed quote is not in the evidence")
    else:
        w.visit("C", "stageC:no_quote", c.quote_search_reasoning)
    if w.step.type == "inference":
        return "no_gap"
    if w.config.ablate == "E":
        return "IE"
    return stage_e(w)


_D_LABELS = {"entailment": "no_gap", "neutral": "MB", "contradiction": "CC"}


def stage_d(w: _Walk) -> str:
    """D, local entailment of the claim by the quote: entailed, missing bridge or contradicted."""
    (call,) = w.ask("D", [w.judge.step_1_quote_search.evidence_quote])
    w.confidences.append(getattr(call.probs, call.label))
    w.visit(
        "D", f"stageD:{call.label}", f"NLI({call.label}, p={getattr(call.probs, call.label):.2f})"
    )
    return _D_LABELS[call.label]


def stage_e(w: _Walk) -> str:
    """E, cross-step: does any entity-matched earlier snippet entail the conclusion?"""
    if not w.premise_pool:
        w.visit("E", "stageE:no_premises", "no entity-matched evidence from earlier steps")
        return "IE"
    calls = w.ask("E", [s.text for s in w.premise_pool])
    entailing = [c for c in calls if c.label == "entailment"]
    if entailing:
        w.confidences.append(entailing[0].probs.entailment)
        w.visit("E", "stageE:entailed", f"entailed by {entailing[0].premise[:80]!r}")
        return "no_gap"
    w.confidences.append(1.0 - max(c.probs.entailment for c in calls))
    w.visit("E", "stageE:not_entailed", f"none of {len(calls)} earlier snippets entails it")
    return "IE"


def _geometric_mean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    if min(values) <= 0.0:
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def decide_trace(
    trace_id: str,
    question: str,
    steps: Sequence[Step],
    judged: Sequence[JudgeResult],
    nli: NLIFn,
    config: TreeConfig = TreeConfig(),
) -> list[Verdict]:
    """Walk every step of one trace through stages A-E; one verdict per step, in order."""
    if len(judged) != len(steps):
        raise ValueError(f"trace {trace_id}: {len(steps)} steps but {len(judged)} judge results")
    verdicts: list[Verdict] = []
    pool: list[Snippet] = []
    evidence = AccumulatedEvidence()
    for step, result in zip(steps, judged, strict=True):
        # Shared and growing: each walk reads them before the next step appends (no copies,
        # so checking a trace stays linear in its length).
        evidence.extend(step.evidence)
        base = {
            "trace_id": trace_id,
            "step": step.index,
            "type": step.type,
            "judge": result.judge,
            "judge_confidences": result.confidences or None,
        }
        if result.judge is None:
            verdicts.append(Verdict(**base, label=None, repair=None, error=result.error))
            continue
        w = _Walk(step, question, evidence, pool, result.judge, result.confidences, nli, config)
        try:
            label = stage_a(w) or stage_b(w) or stage_c(w)
            error = None
        except NLIError as exc:
            label, error = None, f"NLI stage failed: {exc}"
        if w.reached_c_with_entity:
            pool.extend(step.evidence)
        verdicts.append(
            Verdict(
                **base,
                label=label,
                repair=REPAIRS[label] if label else None,
                path=w.path,
                confidence=_geometric_mean(w.confidences) if label else None,
                rationale="; ".join(w.reasons) if label else "",
                nli=w.calls,
                error=error,
            )
        )
    return verdicts


def nli_pairs_needed(
    trace_id: str,
    question: str,
    steps: Sequence[Step],
    judged: Sequence[JudgeResult],
    config: TreeConfig,
) -> list[list[NLICall]]:
    """The NLI calls each step would make under `config`, found by a dry run of the same tree."""
    neutral = NLIProbs(entailment=1 / 3, neutral=1 / 3, contradiction=1 / 3)
    verdicts = decide_trace(
        trace_id, question, steps, judged, lambda pairs: [neutral] * len(pairs), config
    )
    return [v.nli for v in verdicts]


def ablation_configs(config: TreeConfig) -> list[TreeConfig]:
    """The given config plus each ablation: whose NLI calls a run stores for later relabels."""
    return [config] + [replace(config, ablate=a) for a in (None, "A", "E") if a != config.ablate]
