"""The hybrid checker: judge (stages A-C) + NLI (stages D-E) + the decision tree, over traces.

Each verdict carries what it was decided from (the question, the step, the judge object, every
NLI call, and the NLI calls the `-A`/`-E` ablations would need), so `relabel` can re-decide any
file of verdicts under another ablation or threshold without calling a model.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from stepgap.data_builders.io import ErrorReport, JsonlWriter, read_models
from stepgap.data_builders.schema import NLICall, NLIProbs, Step, Trace, Verdict

from .judges.base import JudgeBackend, JudgeResult
from .judges.replay import ReplayJudge
from .nli.base import NLIBackend, NLIError, Pair
from .nli.replay import ReplayNLI
from .prompt import PROMPT_VERSION, build_requests
from .tree import TreeConfig, ablation_configs, decide_trace, hypothesis_for, nli_pairs_needed

log = logging.getLogger(__name__)


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


def provenance(backend: object) -> dict[str, str | None]:
    """`{"spec", "note"}` of a judge or NLI backend (see `Verdict.checker`)."""
    found = getattr(backend, "provenance", None)
    return dict(found) if found else {"spec": type(backend).__name__, "note": None}


def _decide_batch(
    items: Sequence[tuple[str, str, Sequence[Step], Sequence[JudgeResult]]],
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


class Checker:
    """Labels every step of segmented traces with a typed gap verdict.

    A judge with `nli_features = True` (a student trained with them) gets each step's NLI
    features in its prompt, computed with the checker's own NLI backend.
    """

    def __init__(
        self, judge: JudgeBackend, nli: NLIBackend, config: TreeConfig | None = None
    ) -> None:
        self.judge = judge
        self.nli = nli
        self.config = config or TreeConfig()

    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        """Verdicts per trace, per step; traces must be segmented (`steps` set)."""
        items = [
            (t.id, t.question, t.steps, judged)
            for t, judged in zip(traces, self.judge_traces(traces), strict=True)
        ]
        return _decide_batch(items, self.nli, self.config, PROMPT_VERSION, self.provenance)  # type: ignore[arg-type]

    @property
    def provenance(self) -> dict[str, object]:
        """What every verdict of this checker records about the models that decided it."""
        return {"judge": provenance(self.judge), "nli": provenance(self.nli)}

    def judge_traces(self, traces: Sequence[Trace]) -> list[list[JudgeResult]]:
        """Stages A-C for every step of every trace, in one call to the judge backend."""
        requests = []
        with_features = getattr(self.judge, "nli_features", False)
        for t in traces:
            if t.steps is None:
                raise ValueError(f"trace {t.id!r} is not segmented; run segment_trace first")
            features = (
                step_nli_features(t.question, t.steps, self.nli, self.config)
                if with_features
                else None
            )
            requests.extend(build_requests(t.id, t.question, t.steps, features))
        results = iter(self.judge.judge(requests))
        return [[next(results) for _ in t.steps] for t in traces]  # type: ignore[union-attr]

    def check_trace(self, trace: Trace) -> list[Verdict]:
        return self.check([trace])[0]


def group_by_trace(verdicts: Iterable[Verdict]) -> dict[str, list[Verdict]]:
    """Verdicts per trace id, in step order."""
    groups: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        groups[v.trace_id].append(v)
    return {k: sorted(vs, key=lambda v: v.step) for k, vs in groups.items()}


class RelabelError(ValueError):
    pass


def relabel(verdicts: Sequence[Verdict], config: TreeConfig | None = None) -> Iterator[Verdict]:
    """Re-decide stored verdicts under another config from their stored judge and NLI outputs."""
    config = config or TreeConfig()
    nli = ReplayNLI.from_verdicts(verdicts)
    judge = ReplayJudge.from_verdicts(verdicts)
    for trace_id, group in group_by_trace(verdicts).items():
        question = group[0].question
        steps = [v.step_data for v in group]
        if question is None or any(s is None for s in steps):
            raise RelabelError(
                f"trace {trace_id!r}: verdicts lack 'question'/'step_data'; "
                "relabel needs verdicts written by stepgap check or label"
            )
        judged = [
            judge.table.get((trace_id, v.step)) or JudgeResult.failed(v.error or "no judge output")
            for v in group
        ]
        (new,) = _decide_batch([(trace_id, question, steps, judged)], nli, config, None)  # type: ignore[list-item]
        for old, v in zip(group, new, strict=True):
            v.prompt_version = old.prompt_version
            v.checker = old.checker  # the stored answers came from the original models
            yield v


def relabel_file(
    input_path: str | Path,
    output: str | Path,
    config: TreeConfig | None = None,
    report: ErrorReport | None = None,
) -> int:
    """`relabel` over a verdicts file (`stepgap relabel`); returns the verdicts written."""
    verdicts = [v for _, v in read_models(input_path, Verdict, report)]
    n = 0
    with JsonlWriter(output) as out:
        for v in relabel(verdicts, config):
            out.write(v)
            n += 1
    return n
