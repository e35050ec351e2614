"""Re-deciding stored verdicts (`stepgap relabel`): under another ablation or threshold, from
the judge objects and NLI probabilities each verdict recorded, without calling a model."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from stepgap.io import ErrorReport, JsonlWriter, check_output, read_models
from stepgap.schema import Verdict
from stepgap.tree import JudgeResult, TreeConfig

from .decide import decide_batch
from .judges.replay import ReplayJudge
from .nli.replay import ReplayNLI


def group_by_trace(verdicts: Iterable[Verdict]) -> dict[str, list[Verdict]]:
    """Verdicts per trace id, in step order."""
    groups: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        groups[v.trace_id].append(v)
    return {k: sorted(vs, key=lambda v: v.step) for k, vs in groups.items()}


class RelabelError(ValueError):
    pass


def recorded_config(verdicts: Sequence[Verdict], **overrides: Any) -> TreeConfig:
    """The tree config the verdicts of one trace were decided with (`Verdict.tree`; the
    defaults for verdicts written before it was recorded), with `overrides` applied."""
    names = {f.name for f in fields(TreeConfig)}
    recorded = {k: v for k, v in (verdicts[0].tree or {}).items() if k in names}
    return TreeConfig(**{**recorded, **overrides})


def relabel(
    verdicts: Sequence[Verdict], config: TreeConfig | None = None, **overrides: Any
) -> Iterator[Verdict]:
    """Re-decide stored verdicts from their stored judge and NLI outputs: under `config` when
    given, else under the config each trace recorded with `overrides` applied (no overrides:
    the same verdicts again)."""
    nli = ReplayNLI.from_verdicts(verdicts)
    judge = ReplayJudge.from_verdicts(verdicts)
    for trace_id, group in group_by_trace(verdicts).items():
        cfg = config or recorded_config(group, **overrides)
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
        (new,) = decide_batch([(trace_id, question, steps, judged)], nli, cfg, None)  # type: ignore[list-item]
        for old, v in zip(group, new, strict=True):
            v.prompt_version = old.prompt_version
            v.checker = old.checker  # the stored answers came from the original models
            yield v


def relabel_file(
    input_path: str | Path,
    output: str | Path,
    config: TreeConfig | None = None,
    report: ErrorReport | None = None,
    **overrides: Any,
) -> int:
    """`relabel` over a verdicts file (`stepgap relabel`); returns the verdicts written."""
    check_output(output, input_path)
    verdicts = [v for _, v in read_models(input_path, Verdict, report)]
    n = 0
    with JsonlWriter(output, input_path) as out:
        for v in relabel(verdicts, config, **overrides):
            out.write(v)
            n += 1
    return n
