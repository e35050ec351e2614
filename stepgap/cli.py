"""The `stepgap` command line: one subcommand per stage of the life cycle.

Each subcommand is a thin wrapper over the library; heavy imports happen inside the command so
`stepgap --help` stays instant. Records that cannot be read are reported (file, line, field) on
stderr, optionally to `--errors FILE`, and never stop the rest of the file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from stepgap import __version__


def _finish(report, errors_path: str | None, done: int, what: str) -> int:
    """Print the error report; exit 1 when nothing at all could be processed."""
    if report:
        print(f"stepgap: skipped {len(report)} bad record(s):\n{report.summary()}", file=sys.stderr)
        if errors_path:
            report.write(errors_path)
    print(f"stepgap: wrote {done} {what}", file=sys.stderr)
    return 0 if done or not report else 1


def _tree_config(args: argparse.Namespace):
    from stepgap.teacher.tree import TreeConfig

    return TreeConfig(
        ablate=getattr(args, "ablate", None),
        entail_threshold=args.entail_threshold,
        contradict_threshold=args.contradict_threshold,
        hypothesis=getattr(args, "hypothesis", "answer_statement"),
    )


def _add_tree_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ablate", choices=["A", "E"], help="remove a stage (SPEC section 3)")
    p.add_argument("--entail-threshold", type=float, default=0.5, metavar="X")
    p.add_argument("--contradict-threshold", type=float, default=0.5, metavar="X")


# --------------------------------------------------------------------------- segment
def _segment(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport, JsonlWriter, iter_traces

    report = ErrorReport()
    n = 0
    with JsonlWriter(args.output) as out:
        for trace in iter_traces(args.input, report):
            out.write(trace)
            n += 1
    return _finish(report, args.errors, n, f"segmented traces to {args.output}")


def _segment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces: JSONL, JSON array, Parquet or a datasets folder")
    p.add_argument("-o", "--output", required=True, help="segmented traces (JSONL)")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")


# --------------------------------------------------------------------------- check
def _check(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport, JsonlWriter, iter_traces
    from stepgap.teacher import Checker, load_judge, load_nli

    report = ErrorReport()
    checker = Checker(
        load_judge(args.judge),
        load_nli(args.nli, device=args.device),
        _tree_config(args),
    )
    traces = list(iter_traces(args.input, report))
    n = 0
    with JsonlWriter(args.output) as out:
        for start in range(0, len(traces), args.batch_size):
            for verdicts in checker.check(traces[start : start + args.batch_size]):
                for v in verdicts:
                    out.write(v)
                    n += 1
    return _finish(report, args.errors, n, f"verdicts to {args.output}")


def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument("--judge", required=True, metavar="SPEC", help="judge backend, e.g. replay:FILE")
    p.add_argument(
        "--nli", required=True, metavar="SPEC", help="replay:FILE, hf:ID_OR_PATH or a hub id/path"
    )
    p.add_argument("-o", "--output", required=True, help="verdicts (JSONL)")
    p.add_argument("--device", default=None, help="NLI device (cpu, cuda, cuda:1; default auto)")
    p.add_argument("--batch-size", type=int, default=64, help="traces per judge+NLI batch")
    p.add_argument(
        "--hypothesis",
        choices=["answer_statement", "answer", "claim"],
        default="answer_statement",
        help="NLI hypothesis of a conclusion step",
    )
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")
    _add_tree_options(p)


# --------------------------------------------------------------------------- relabel
def _relabel(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport, JsonlWriter, Verdict, read_models
    from stepgap.teacher import relabel

    report = ErrorReport()
    verdicts = [v for _, v in read_models(args.input, Verdict, report)]
    n = 0
    with JsonlWriter(args.output) as out:
        for v in relabel(verdicts, _tree_config(args)):
            out.write(v)
            n += 1
    return _finish(report, args.errors, n, f"relabelled verdicts to {args.output}")


def _relabel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="verdicts written by `stepgap check` or `stepgap label`")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")
    _add_tree_options(p)


# name -> (help, add arguments, run); later issues add label, reward, eval, train, ...
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[..., int]]] = {
    "segment": ("split raw responses into steps (SPEC section 2)", _segment_args, _segment),
    "check": ("label every step of traces with a typed gap verdict", _check_args, _check),
    "relabel": (
        "re-decide stored verdicts (ablation, thresholds) without calling a model",
        _relabel_args,
        _relabel,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepgap",
        description="Step-level evidence-gap checking (CC / IE / MB) for search agents.",
    )
    parser.add_argument("--version", action="version", version=f"stepgap {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, configure, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        configure(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args._run(args) or 0)
    except (FileNotFoundError, ValueError) as exc:
        print(f"stepgap {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
