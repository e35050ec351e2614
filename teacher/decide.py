"""Stages D-E and the tree over judged traces: one batched NLI call for a batch of traces, and
every verdict filled with what it was decided from (the question, the step, the judge object,
every NLI call, and the calls the `-A`/`-E` ablations would need), so `relabel` can re-decide
it under another ablation or threshold without calling a model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict

from stepgap.schema import NLICall, NLIProbs, Step, Verdict
from stepgap.tree import (
    JudgeResult,
    NLIError,
    Pair,
    TreeConfig,
    ablation_configs,
    decide_trace,
    hypothesis_for,
    nli_pairs_needed,
)

from .nli.base import NLIBackend

JudgedTrace = tuple[str, str, Sequence[Step], Sequence[JudgeResult]]
"""(trace id, question, its steps, one judge answer per step)"""


class _ScoredPairs:
    """NLI answers for a batch, scored once; a pair that failed raises when the tree asks."""

    def __init__(self, backend: NLIBackend, pairs: Iterable[Pair]) -> None:
        unique = list(dict.fromkeys(pairs))
        self.probs: dict[Pair, NLIProbs] = {}
        self.errors: dict[Pair, str] = {}
        if not unique:
            return
        try:
            self.probs = dict(zip(unique, backend.predict(unique), strict=True))
        except NLIError:
            for pair in unique:  # isolate the failing pairs; the rest still get scored
                try:
                    self.probs[pair] = backend.predict([pair])[0]
                except NLIError as exc:
                    self.errors[pair] = str(exc)

    def __call__(self, pairs: Sequence[Pair]) -> list[NLIProbs]:
        for pair in pairs:
            if pair in self.errors:
                raise NLIError(self.errors[pair])
        return [self.probs[p] for p in pairs]


def decide_batch(
    items: Sequence[JudgedTrace],
    nli: NLIBackend,
    config: TreeConfig,
    prompt_version: str | None,
    checker: dict[str, object] | None = None,
) -> list[list[Verdict]]:
    """Decide a batch of judged traces with one batched NLI call for all their pairs."""
    needed: list[list[list[NLICall]]] = []  # per trace, per config, per step
    for trace_id, question, steps, judged in items:
        per_cfg = [
            nli_pairs_needed(trace_id, question, steps, judged, cfg)
            for cfg in ablation_configs(config)
        ]
        needed.append(per_cfg)
    scored = _ScoredPairs(
        nli,
        (
            (c.premise, c.hypothesis)
            for per_cfg in needed
            for calls_by_step in per_cfg
            for calls in calls_by_step
            for c in calls
        ),
    )
    out = []
    for (trace_id, question, steps, judged), per_cfg in zip(items, needed, strict=True):
        verdicts = decide_trace(trace_id, question, steps, judged, scored, config)
        for i, v in enumerate(verdicts):
            on_path = {(c.premise, c.hypothesis) for c in v.nli}
            extra: dict[Pair, NLICall] = {}
            for calls_by_step in per_cfg[1:]:
                for c in calls_by_step[i]:
                    pair = (c.premise, c.hypothesis)
                    if pair not in on_path and pair in scored.probs and pair not in extra:
                        extra[pair] = c.model_copy(update={"probs": scored.probs[pair]})
            v.nli_extra = list(extra.values())
            v.question = question
            v.step_data = steps[i]
            v.prompt_version = prompt_version
            v.checker = checker
            v.tree = asdict(config)
        out.append(verdicts)
    return out


def step_nli_features(
    question: str, steps: Sequence[Step], nli: NLIBackend, config: TreeConfig | None = None
) -> list[list[dict[str, object]]]:
    """Per step, the NLI probabilities of each of its own snippets against its hypothesis.

    The input of the paper's "with NLI features" student; scored in one batched NLI call.
    """
    config = config or TreeConfig()
    pairs = [
        (snip.text, hypothesis_for(step, question, config.hypothesis))
        for step in steps
        for snip in step.evidence
    ]
    probs = iter(nli.predict(pairs) if pairs else [])
    out = []
    for step in steps:
        feats: list[dict[str, object]] = []
        for snip in step.evidence:
            p = next(probs)
            feats.append(
                {
                    "title": snip.title,
                    "entailment": round(p.entailment, 3),
                    "neutral": round(p.neutral, 3),
                    "contradiction": round(p.contradiction, 3),
                }
            )
        out.append(feats)
    return out
