"""Commands of the evaluation: `eval` (score checkers against gold labels), `baseline` (the
paper's baseline checkers as verdict files) and `view` (an HTML page to look at verdicts)."""

from __future__ import annotations

import argparse
import sys

from stepgap.cli import Command
from stepgap.cli.options import (
    add_errors_option,
    add_judge_options,
    add_tree_options,
    checker_config,
    finish,
    positive_int,
    tree_config,
)


def _named_files(specs: list[str]) -> dict[str, str]:
    files: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--pred must look like NAME=FILE, got {spec!r}")
        if name in files:
            raise ValueError(f"--pred name {name!r} given twice")
        files[name] = path
    return files


def evaluate(args: argparse.Namespace) -> int:
    from stepgap.eval import evaluate as run_evaluation
    from stepgap.io import ErrorReport

    report = ErrorReport()
    plots = not args.no_plots
    if plots:
        try:
            import matplotlib  # noqa: F401  (the `plots` extra)
        except ImportError:
            print(
                "stepgap eval: no PNG plots: matplotlib is not installed "
                "(pip install 'stepgap[plots]'); the report is written without them",
                file=sys.stderr,
            )
            plots = False
    result = run_evaluation(
        args.gold,
        _named_files(args.pred),
        args.output,
        resamples=args.resamples,
        seed=args.seed,
        unit=args.unit,
        silver=args.silver,
        plots=plots,
        report=report,
    )
    for name, c in result.report["checkers"].items():
        if not c["scored"]:
            print(f"stepgap: {name}: {c['note']}; its row holds counts only", file=sys.stderr)
        if c["missing_steps"] or c["error_steps"]:
            print(
                f"stepgap: {name}: {c['missing_steps']} gold step(s) missing from the "
                f"predictions, {c['error_steps']} with a failed check; not scored",
                file=sys.stderr,
            )
    names = ", ".join(p.name for p in result.files)
    return finish(args, report, len(result.files), f"files to {args.output}: {names}")


def evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gold",
        required=True,
        action="append",
        metavar="FILE",
        help="gold step labels and trace correctness (one file or two; repeatable)",
    )
    p.add_argument(
        "--pred",
        required=True,
        action="append",
        metavar="NAME=FILE",
        help="a checker's verdicts (repeatable)",
    )
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="report folder")
    p.add_argument("--resamples", type=positive_int, default=2000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--unit", choices=["step", "trace"], default="step", help="bootstrap unit")
    p.add_argument("--silver", metavar="NAME", help="a --pred checker to use as silver reference")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    add_errors_option(p)


def baseline(args: argparse.Namespace) -> int:
    from stepgap.eval.baselines import run_baseline
    from stepgap.io import ErrorReport, require_input

    require_input(args.input)  # before the models load
    report = ErrorReport()
    n = run_baseline(
        args.kind,
        args.input,
        args.output,
        nli=args.nli,
        judge=args.judge,
        tree=tree_config(args),
        device=args.device,
        judge_options=checker_config(args).judge_options(),
        chunk_words=args.chunk_words,
        report=report,
    )
    return finish(args, report, n, f"{args.kind} verdicts to {args.output}")


def baseline_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "kind",
        help="nli-only: NLI on (all evidence, claim); minicheck: NLI on sentence chunks of the "
        "evidence, best chunk decides; ner-quote: spaCy NER + token overlap instead of stage C; "
        "llm-strict / llm-only: the judge does all five stages, flagging on any stage signal / "
        "on an overall gap confidence >= 0.5; flag-everything: every step a gap; or an installed "
        "plug-in's (entry-point group stepgap.baselines)",
    )
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument("-o", "--output", required=True, help="verdicts (JSONL)")
    add_errors_option(p)
    p.add_argument(
        "--judge",
        metavar="SPEC",
        help="ner-quote: judge for stages A and B; llm-strict, llm-only: the judge of every stage "
        "(openai:MODEL, hf:PATH, student:PATH; not replay)",
    )
    p.add_argument("--nli", metavar="SPEC", help="nli-only, minicheck, ner-quote: NLI model")
    p.add_argument(
        "--chunk-words",
        type=positive_int,
        metavar="N",
        help="minicheck: words per chunk of whole sentences (default 400)",
    )
    p.add_argument("--device", default=None, help="NLI device")
    add_tree_options(p)
    add_judge_options(p, required=False)


def view(args: argparse.Namespace) -> int:
    from stepgap.eval.view import parse_named_files, write_view
    from stepgap.io import ErrorReport

    report = ErrorReport()
    result = write_view(
        args.input,
        parse_named_files(args.verdicts),
        args.output,
        rewards=args.reward,
        gold=args.gold,
        title=args.title,
        page_size=args.page_size,
        resamples=args.resamples,
        report=report,
    )
    print(result.path)
    for name, n in result.unmatched.items():
        if n:
            print(f"stepgap: {name}: {n} verdict(s) for no step of {args.input}", file=sys.stderr)
    return finish(
        args,
        report,
        result.traces,
        f"trace(s), {result.steps} step(s) to {result.path} ({result.bytes / 1e6:.1f} MB); "
        "open it in a browser",
    )


def view_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument(
        "--verdicts",
        required=True,
        action="append",
        metavar="[NAME=]FILE",
        help="a checker's verdicts (repeatable: the checkers are shown side by side)",
    )
    p.add_argument("--reward", metavar="FILE", help="rewards written by `stepgap reward`")
    p.add_argument(
        "--gold",
        action="append",
        metavar="FILE",
        help="gold step labels and trace correctness (one file or two; repeatable)",
    )
    p.add_argument("-o", "--output", required=True, help="the HTML page, overwritten")
    p.add_argument("--title", help="page title (default: the traces file name)")
    p.add_argument("--page-size", type=positive_int, default=25, help="traces per page")
    p.add_argument(
        "--resamples", type=positive_int, default=2000, help="bootstrap resamples (with --gold)"
    )
    add_errors_option(p)


COMMANDS = [
    Command(
        "baseline",
        "run a baseline checker: nli-only, minicheck, ner-quote, llm-strict, llm-only or "
        "flag-everything",
        baseline_arguments,
        baseline,
    ),
    Command(
        "eval",
        "score checkers against gold labels: report.json, report.md and PNG plots",
        evaluate_arguments,
        evaluate,
    ),
    Command(
        "view",
        "one offline HTML page of traces and verdicts: paths, quotes, NLI, rewards, gold",
        view_arguments,
        view,
    ),
]
