"""Train the student judge: a TRL-style script, the one `accelerate launch` runs.

    accelerate launch student/train.py --config student/configs/qwen2.5-7b-lora.yaml
    python student/train.py --config tiny --max_steps 20 --learning_rate 1e-3
    python student/train.py --config tiny --set max_steps=20 --print-config

As in TRL's own scripts (`trl/scripts/sft.py`), an `HfArgumentParser` (stepgap's one parser,
`stepgap.arguments.ArgumentParser`) reads the recipe (`--config`: a YAML file, or a packaged
recipe by name) into stepgap's `StudentArguments`, TRL's `SFTConfig` and `ModelConfig`; any of
their fields is also a flag (`python student/train.py --help` lists them), and `--set
key=value` gives a key as the file would. `--resume` continues from the last checkpoint in
`output_dir` (same step count as an uninterrupted run); `--print-config` prints the keys the
run set. `stepgap train` parses and trains with the same two functions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from stepgap.hub_access import HubUploadError
from stepgap.redact import install_redaction, redact
from stepgap.student.prm import PRM_KIND
from stepgap.student.recipe import Recipe, RunArguments, StudentArguments, make_parser

if TYPE_CHECKING:
    from trl import ModelConfig, SFTConfig

# Errors that mean the recipe, its data or the set-up is wrong: one line and exit 2.
USER_ERRORS = (FileNotFoundError, ValueError, HubUploadError)


def main(
    script_args: StudentArguments,
    training_args: SFTConfig,
    model_args: ModelConfig,
    run: RunArguments,
) -> int:
    """Train on the recipe and print the metrics once."""
    from stepgap.student.trainer import process_state, train

    try:
        metrics = train(Recipe(script_args, training_args, model_args), resume=run.resume)
        if process_state().is_main_process:  # one report, not one per rank
            print(json.dumps(metrics, indent=2, default=str))
            what = "the LoRA adapter" if model_args.use_peft else "the model"
            if script_args.kind == PRM_KIND:
                what = "the PRM"
            print(f"wrote {what} to {training_args.output_dir}", file=sys.stderr)
    finally:
        _leave_process_group()
    return 0


def _leave_process_group() -> None:
    """End the run's process group (`accelerate launch` with several processes) before the
    interpreter exits: left to exit, gloo's threads were seen to abort a rank ("terminate
    called without an active exception", exit -6) after a finished run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def one_line_errors(prog: str) -> Iterator[None]:
    """A wrong recipe, missing data or a failed upload as one line on stderr and exit 2, as the
    `stepgap` command reports them, instead of a traceback; Ctrl-C as one line and exit 130,
    at once (the exit handlers of torch and its threads are not run on the way out)."""
    try:
        yield
    except USER_ERRORS as exc:
        print(f"{prog}: error: {redact(str(exc))}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(
            f"{prog}: interrupted; output_dir keeps the checkpoints saved so far (--resume "
            "continues from the last)",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)


def script(argv: list[str] | None = None) -> None:
    """What `python student/train.py` and `accelerate launch student/train.py` run."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # bitsandbytes warns at import, on every CPU machine, of a kernels package 4-bit CPU
    # training may use; `stepgap train` keeps it quiet too
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    install_redaction()
    parser = make_parser(prog="student/train.py")
    with one_line_errors(parser.prog):
        parsed = parser.parse(argv)
        status = 0 if parsed is None else main(*parsed)
    sys.exit(status)


if __name__ == "__main__":
    script()
