"""Commands of the teacher: `check` (label traces), `label` (at scale, resumable), `merge` (join
shard outputs) and `relabel` (re-decide stored verdicts without calling a model)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from stepgap.cli import Command
from stepgap.cli.options import (
    EXIT_NOTHING,
    add_checker_options,
    add_errors_option,
    add_judge_options,
    add_nli_options,
    add_ray_options,
    add_tree_options,
    checker,
    finish,
    positive_int,
    tree_overrides,
)

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


def _close(judged_by: StepChecker) -> None:
    """A local judge's engine shut down here, not killed at exit (vLLM then warns that its
    engine "exited unexpectedly"); a Ray pool's actors end with the job."""
    judged_by.close()


def _print_meter(judged_by: StepChecker) -> None:
    """The judge's API calls, cache hits, tokens and cost, when it keeps a meter."""
    meter = judged_by.judge.meter if judged_by.judge is not None else None
    if meter is not None:
        print(f"stepgap: {meter.summary()}", file=sys.stderr)


def check(args: argparse.Namespace) -> int:
    from stepgap.io import ErrorReport, require_input
    from stepgap.teacher.label import check_file

    require_input(args.input)  # before the models load
    report = ErrorReport()
    judged_by = checker(args)
    try:
        counts = check_file(
            args.input,
            judged_by,
            args.output,
            report,
            # a Ray pool takes every trace in one stream (--batch-size is then per actor call)
            batch_size=args.batch_size if args.ray is None else sys.maxsize,
            progress=not args.no_progress,
        )
    finally:
        _close(judged_by)
    print(f"stepgap: {counts.describe()}", file=sys.stderr)
    _print_meter(judged_by)
    if counts.all_failed:  # check_file kept the earlier output
        return _all_failed(counts, kept=args.output)
    return finish(args, report, counts.verdicts, f"verdicts to {args.output}")


def check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument("-o", "--output", required=True, help="verdicts (JSONL), overwritten")
    p.add_argument("--batch-size", type=positive_int, default=64, help="traces per judge+NLI batch")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_errors_option(p)
    add_checker_options(p)
    add_ray_options(p)


def label(args: argparse.Namespace) -> int:
    from stepgap.io import ErrorReport, require_input
    from stepgap.teacher.label import label_file, parse_shard

    shard = parse_shard(args.shard)
    require_input(args.input)  # before the models load
    report = ErrorReport()
    judged_by = checker(args)
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
        _close(judged_by)
    _print_meter(judged_by)
    retried = f", {summary.retried} failed step(s) asked again" if summary.retried else ""
    print(
        f"stepgap: {summary.traces} trace(s) in shard {args.shard}, {summary.skipped_traces} "
        f"already done{retried}; {summary.describe()}",
        file=sys.stderr,
    )
    status = finish(args, report, summary.verdicts, f"new verdicts to {args.output}")
    return _all_failed(summary) if summary.all_failed else status


def label_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument(
        "-o", "--output", required=True, help="verdicts (JSONL); appended to, rerun to resume"
    )
    p.add_argument("--shard", default="0/1", metavar="I/N", help="label only shard I of N")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="at most N traces")
    p.add_argument(
        "--batch-size", type=positive_int, default=16, help="finished traces per NLI batch"
    )
    p.add_argument("--fsync", action="store_true", help="fsync after every verdict")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--summary", metavar="FILE", help="write counts and cost as JSON")
    p.add_argument(
        "--keep-errors",
        action="store_true",
        help="on a rerun, keep the failed verdicts of earlier runs instead of asking again",
    )
    add_errors_option(p)
    add_judge_options(p)
    add_nli_options(p)
    add_ray_options(p)


def merge(args: argparse.Namespace) -> int:
    from stepgap.io import ErrorReport
    from stepgap.teacher.label import merge_verdicts

    report = ErrorReport()
    counts = merge_verdicts(args.inputs, args.output, traces=args.traces, report=report)
    print(f"stepgap: {counts.describe()}", file=sys.stderr)
    return finish(args, report, counts.verdicts, f"merged verdicts to {args.output}")


def merge_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="verdict files of `stepgap label --shard I/N` runs")
    p.add_argument("-o", "--output", required=True, help="the joined verdicts (JSONL)")
    p.add_argument(
        "--traces",
        metavar="FILE",
        help="the labelled traces: every step of each of them must have one verdict",
    )
    add_errors_option(p)


def relabel(args: argparse.Namespace) -> int:
    from stepgap.io import ErrorReport
    from stepgap.teacher.relabel import relabel_file

    report = ErrorReport()
    n = relabel_file(args.input, args.output, report=report, **tree_overrides(args))
    return finish(args, report, n, f"relabelled verdicts to {args.output}")


def relabel_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="verdicts written by `stepgap check` or `stepgap label`")
    p.add_argument("-o", "--output", required=True)
    add_errors_option(p)
    add_tree_options(p, recorded=True)


COMMANDS = [
    Command("check", "label every step of traces with a typed gap verdict", check_arguments, check),
    Command(
        "label",
        "label traces at scale: concurrent judge, cache, cost, --shard, resume after a crash",
        label_arguments,
        label,
    ),
    Command(
        "merge",
        "join the verdicts of `label --shard I/N` runs; refuses duplicate and missing steps",
        merge_arguments,
        merge,
    ),
    Command(
        "relabel",
        "re-decide stored verdicts (ablation, thresholds) without calling a model",
        relabel_arguments,
        relabel,
    ),
]
