"""Commands of the evaluation: `eval` (score checkers against gold labels), `baseline` (the
paper's baseline checkers as verdict files) and `view` (an HTML page to look at verdicts)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal

from stepgap.cli import Command
from stepgap.cli.options import ProgressOptions, RecordOptions, finish
from stepgap.options import at_least_one, option
from stepgap.serving.reward_function import FailedCheckOptions
from stepgap.teacher.build import CheckerConfig


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


@dataclass(frozen=True, kw_only=True)
class EvalArguments(RecordOptions):
    gold: list[str] | None = option(
        None,
        "gold step labels and trace correctness (one file or two; repeatable); may be left "
        "out with --teacher, and the report then has the agreement with the teacher alone",
        metavar="FILE",
    )
    pred: list[str] = option(help="a checker's verdicts (repeatable)", metavar="NAME=FILE")
    output: str = option(help="report folder", metavar="DIR", aliases=["-o"])
    resamples: int = option(2000, "bootstrap resamples")
    seed: int = option(0, "bootstrap seed")
    unit: Literal["step", "trace"] = option("step", "bootstrap unit")
    teacher: str | None = option(
        None,
        "a --pred checker: every other one's agreement with its labels, firing stages and paths "
        "(fidelity to the teacher, not quality; --silver is its older name)",
        metavar="NAME",
        aliases=["--silver"],
    )
    no_plots: bool = option(False, "skip the PNG plots")

    def __post_init__(self) -> None:
        at_least_one("resamples", self.resamples)
        super().__post_init__()


def evaluate(args: EvalArguments) -> int:
    from stepgap.eval import evaluate as run_evaluation
    from stepgap.io import ErrorReport

    if not args.gold and args.teacher is None:  # here, so --print-config works without them
        raise ValueError("give --gold FILE, --teacher NAME (agreement with it alone) or both")
    report = ErrorReport()
    plots = not args.no_plots and bool(args.gold)  # the plots draw the gold figures
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
        teacher=args.teacher,
        plots=plots,
        report=report,
    )
    for name, c in result.report.get("checkers", {}).items():
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


@dataclass(frozen=True, kw_only=True)
class BaselineArguments(RecordOptions, ProgressOptions):
    kind: str = option(
        help="nli-only: NLI on (all evidence, claim); minicheck: NLI on sentence chunks of the "
        "evidence, best chunk decides; ner-quote: spaCy NER + token overlap instead of stage C; "
        "llm-strict / llm-only: the judge does all five stages, flagging on any stage signal / "
        "on an overall gap confidence >= 0.5; flag-everything: every step a gap; or an installed "
        "plug-in's (entry-point group stepgap.baselines). --judge: ner-quote's judge of stages A "
        "and B, llm-strict's and llm-only's of every stage (not replay); --nli: nli-only's, "
        "minicheck's and ner-quote's",
        positional=True,
    )
    input: str = option(help="traces (raw or segmented)", positional=True)
    output: str = option(help="verdicts (JSONL)", aliases=["-o"])
    chunk_words: int | None = option(
        None, "minicheck: words per chunk of whole sentences (default 400)", metavar="N"
    )


def baseline(args: BaselineArguments, config: CheckerConfig) -> int:
    from stepgap.eval.baselines import run_baseline
    from stepgap.io import ErrorReport, require_input

    require_input(args.input)  # before the models load
    report = ErrorReport()
    n = run_baseline(
        args.kind,
        args.input,
        args.output,
        tree=config.tree,
        options={"chunk_words": args.chunk_words} if args.chunk_words else None,
        report=report,
        progress=not args.no_progress,
        **_models(args.kind, config),
    )
    return finish(args, report, n, f"{args.kind} verdicts to {args.output}")


def _models(kind: str, config: CheckerConfig) -> dict[str, Any]:
    """The judge and NLI model of a baseline: specs with their options, or those of a bundle
    (loaded here, given to the baseline that needs them)."""
    if config.bundle:
        from stepgap.eval.baselines import BASELINES
        from stepgap.export.offline import load_checker

        needs = BASELINES.backend_of(kind).needs
        bundled = load_checker(config)
        if bundled.judge is None:
            raise ValueError(
                f"--bundle {config.bundle} is a PRM's: a baseline takes a judge or an NLI model, "
                "and a PRM has neither"
            )
        return {
            "judge": bundled.judge if "judge" in needs else None,
            "nli": bundled.nli if "nli" in needs else None,
        }
    from stepgap.teacher.judges import JUDGES
    from stepgap.teacher.nli import NLI_BACKENDS

    models: dict[str, Any] = {"judge": config.judge, "nli": config.nli}
    if config.judge:
        backend = JUDGES.backend_of(config.judge)
        models["judge_options"] = config.judge_options(backend, f"the judge {config.judge}")
    if config.nli:
        backend = NLI_BACKENDS.backend_of(config.nli)
        models["nli_options"] = config.nli_options(backend, f"the NLI model {config.nli}")
    return models


@dataclass(frozen=True, kw_only=True)
class ViewArguments(RecordOptions):
    input: str = option(help="traces (raw or segmented)", positional=True)
    verdicts: list[str] = option(
        help="a checker's verdicts (repeatable: the checkers are shown side by side)",
        metavar="[NAME=]FILE",
    )
    reward: str | None = option(None, "rewards written by `stepgap reward`", metavar="FILE")
    gold: list[str] | None = option(
        None, "gold step labels and trace correctness (one file or two; repeatable)", metavar="FILE"
    )
    output: str = option(help="the HTML page, overwritten", aliases=["-o"])
    title: str | None = option(None, "page title (default: the traces file name)")
    page_size: int = option(25, "traces per page")
    resamples: int = option(2000, "bootstrap resamples (with --gold)")

    def __post_init__(self) -> None:
        at_least_one("page_size", self.page_size)
        at_least_one("resamples", self.resamples)
        super().__post_init__()


def view(args: ViewArguments, reading: FailedCheckOptions) -> int:
    from stepgap.eval.view import parse_named_files, write_view
    from stepgap.io import ErrorReport

    report = ErrorReport()
    result = write_view(
        args.input,
        parse_named_files(args.verdicts),
        args.output,
        rewards=args.reward,
        on_failed_check=reading.on_failed_check,
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


COMMANDS = [
    Command(
        "baseline",
        "run a baseline checker: nli-only, minicheck, ner-quote, llm-strict, llm-only or "
        "flag-everything",
        (BaselineArguments, CheckerConfig),
        baseline,
    ),
    Command(
        "eval",
        "score checkers against gold labels, and their agreement with a teacher: report.json, "
        "report.md and PNG plots",
        (EvalArguments,),
        evaluate,
    ),
    Command(
        "view",
        "one offline HTML page of traces and verdicts: paths, quotes, NLI, rewards, gold",
        (ViewArguments, FailedCheckOptions),
        view,
    ),
]
