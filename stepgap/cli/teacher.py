"""Commands of the teacher: `check` (label traces), `label` (at scale, resumable), `merge` (join
shard outputs) and `relabel` (re-decide stored verdicts without calling a model)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepgap.cli import Command
from stepgap.cli.options import (
    EXIT_NOTHING,
    ProgressOptions,
    RayDataOptions,
    RecordOptions,
    checker,
    finish,
)
from stepgap.options import at_least_one, option, overrides_of
from stepgap.teacher.build import CheckerConfig
from stepgap.tree import TreeConfig

if TYPE_CHECKING:
    from stepgap.teacher.checker import StepChecker


def _all_failed(counts, kept: str | None = None) -> int:
    """Exit 1 when not one step got a label (a dead judge server, a wrong model); the counts
    line just above gives the most common reason, so it is not repeated; `kept`: the output
    that was left as it was."""
    left = f"; {kept} was left as it was" if kept else ""
    print(
        f"stepgap: every step failed ({counts.errors} of {counts.verdicts}, the most common "
        f"reason above); nothing was labelled{left}",
        file=sys.stderr,
    )
    return EXIT_NOTHING


def _print_meter(judged_by: StepChecker) -> None:
    """The judge's API calls, cache hits, tokens and cost, when it keeps a meter."""
    meter = judged_by.judge.meter if judged_by.judge is not None else None
    if meter is not None:
        print(f"stepgap: {meter.summary()}", file=sys.stderr)


@dataclass(frozen=True, kw_only=True)
class CheckArguments(RecordOptions, ProgressOptions):
    input: str = option(help="traces (raw or segmented)", positional=True)
    output: str = option(help="verdicts (JSONL), overwritten", aliases=["-o"])
    batch_size: int = option(64, "traces per judge+NLI batch")

    def __post_init__(self) -> None:
        at_least_one("batch_size", self.batch_size)
        super().__post_init__()


def check(args: CheckArguments, config: CheckerConfig, ray: RayDataOptions) -> int:
    from stepgap.io import ErrorReport, require_input
    from stepgap.teacher.label import check_file

    require_input(args.input)  # before the models load
    report = ErrorReport()
    judged_by = checker(config, ray, batch_size=args.batch_size, progress=not args.no_progress)
    try:
        counts = check_file(
            args.input,
            judged_by,
            args.output,
            report,
            # a Ray pool takes every trace in one stream (--batch-size is then per actor call)
            batch_size=args.batch_size if ray.ray is None else sys.maxsize,
            progress=not args.no_progress,
        )
    finally:
        judged_by.close()  # a local judge's engine shut down here, not killed at exit
    print(f"stepgap: {counts.describe()}", file=sys.stderr)
    _print_meter(judged_by)
    if counts.all_failed:  # check_file kept the earlier output
        return _all_failed(counts, kept=args.output)
    return finish(args, report, counts.verdicts, f"verdicts to {args.output}")


@dataclass(frozen=True, kw_only=True)
class LabelArguments(RecordOptions, ProgressOptions):
    input: str = option(help="traces (raw or segmented)", positional=True)
    output: str = option(help="verdicts (JSONL); appended to, rerun to resume", aliases=["-o"])
    shard: str = option("0/1", "label only shard I of N", metavar="I/N")
    limit: int | None = option(None, "at most N traces", metavar="N")
    batch_size: int = option(16, "finished traces per NLI batch")
    fsync: bool = option(False, "fsync after every verdict")
    summary: str | None = option(None, "write counts and cost as JSON", metavar="FILE")
    keep_errors: bool = option(
        False, "on a rerun, keep the failed verdicts of earlier runs instead of asking again"
    )

    def __post_init__(self) -> None:
        at_least_one("limit", self.limit)
        at_least_one("batch_size", self.batch_size)
        super().__post_init__()


def label(args: LabelArguments, config: CheckerConfig, ray: RayDataOptions) -> int:
    from stepgap.io import ErrorReport, require_input
    from stepgap.teacher.label import label_file, parse_shard

    shard = parse_shard(args.shard)
    require_input(args.input)  # before the models load
    report = ErrorReport()
    judged_by = checker(config, ray, batch_size=args.batch_size, progress=not args.no_progress)
    try:
        summary = label_file(
            args.input,
            judged_by,
            args.output,
            report,
            shard=shard,
            limit=args.limit,
            batch_size=args.batch_size,
            fsync=args.fsync,
            progress=not args.no_progress,
            summary_path=args.summary,
            retry_errors=not args.keep_errors,
        )
    finally:
        judged_by.close()
    _print_meter(judged_by)
    retried = f", {summary.retried} failed step(s) asked again" if summary.retried else ""
    print(
        f"stepgap: {summary.traces} trace(s) in shard {args.shard}, {summary.skipped_traces} "
        f"already done{retried}; {summary.describe()}",
        file=sys.stderr,
    )
    status = finish(args, report, summary.verdicts, f"new verdicts to {args.output}")
    return _all_failed(summary) if summary.all_failed else status


@dataclass(frozen=True, kw_only=True)
class MergeArguments(RecordOptions):
    inputs: list[str] = option(
        help="verdict files of `stepgap label --shard I/N` runs", positional=True
    )
    output: str = option(help="the joined verdicts (JSONL)", aliases=["-o"])
    traces: str | None = option(
        None,
        "the labelled traces: every step of each of them must have one verdict",
        metavar="FILE",
    )


def merge(args: MergeArguments) -> int:
    from stepgap.io import ErrorReport
    from stepgap.teacher.label import merge_verdicts

    report = ErrorReport()
    counts = merge_verdicts(args.inputs, args.output, traces=args.traces, report=report)
    print(f"stepgap: {counts.describe()}", file=sys.stderr)
    return finish(args, report, counts.verdicts, f"merged verdicts to {args.output}")


@dataclass(frozen=True, kw_only=True)
class RelabelArguments(RecordOptions):
    input: str = option(
        help="verdicts written by `stepgap check` or `stepgap label`", positional=True
    )
    output: str = option(help="the re-decided verdicts (JSONL)", aliases=["-o"])


# The tree's options with no defaults: each verdict is re-decided under the tree it recorded,
# changed only where an option is given.
TreeOverrides = overrides_of(
    TreeConfig, "TreeOverrides", note=" (default: as each verdict recorded)"
)


def relabel(args: RelabelArguments, tree: TreeOverrides) -> int:  # type: ignore[valid-type]
    from stepgap.io import ErrorReport
    from stepgap.teacher.relabel import relabel_file

    report = ErrorReport()
    overrides = {k: v for k, v in vars(tree).items() if v is not None}
    n = relabel_file(args.input, args.output, report=report, **overrides)
    return finish(args, report, n, f"relabelled verdicts to {args.output}")


COMMANDS = [
    Command(
        "check",
        "label every step of traces with a typed gap verdict",
        (CheckArguments, CheckerConfig, RayDataOptions),
        check,
    ),
    Command(
        "label",
        "label traces at scale: concurrent judge, cache, cost, --shard, resume after a crash",
        (LabelArguments, CheckerConfig, RayDataOptions),
        label,
    ),
    Command(
        "merge",
        "join the verdicts of `label --shard I/N` runs; refuses duplicate and missing steps",
        (MergeArguments,),
        merge,
    ),
    Command(
        "relabel",
        "re-decide stored verdicts (ablation, thresholds) without calling a model",
        (RelabelArguments, TreeOverrides),
        relabel,
    ),
]
