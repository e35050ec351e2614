"""Commands of the student: `train` (LoRA/QLoRA SFT, the same as `student/train.py`) and `mine`
(hard negatives, optional augmentation run)."""

from __future__ import annotations

import argparse
import json
import sys

from stepgap.cli import Command
from stepgap.cli.options import (
    add_engine_options,
    add_errors_option,
    add_nli_options,
    finish,
    tree_config,
)


def train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        required=True,
        metavar="RECIPE",
        help="training recipe: a YAML file, or a packaged recipe by name (tiny, smollm2-135m, "
        "qwen2.5-7b-lora, qwen2.5-7b-qlora)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")


def train(args: argparse.Namespace) -> int:
    from stepgap.student.recipe import load_config, parse_overrides

    cfg = load_config(args.config, parse_overrides(args.set))
    if getattr(args, "print_config", False):
        import yaml

        print(yaml.safe_dump(cfg.model_dump(), sort_keys=False), end="")
        return 0
    from stepgap.student.trainer import train as run_training

    try:
        metrics = run_training(cfg, resume=args.resume)
        from stepgap.student.trainer import process_state

        if process_state().is_main_process:  # one report, not one per rank
            print(json.dumps(metrics, indent=2, default=str))
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


def mine(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport
    from stepgap.student import mine as run_mining

    report = ErrorReport()
    summary = run_mining(
        args.pool,
        args.student,
        args.output,
        gold=args.gold,
        nli=args.nli,
        tree=tree_config(args),
        device=args.device,
        held_out_fraction=args.held_out_fraction,
        seed=args.seed,
        allow_training_traces=args.include_training_traces,
        augment_config=args.augment_config,
        augment_steps=args.augment_steps,
        augment_lr=args.augment_lr,
        overrides=args.set,
        judge_options={
            "base": args.student_base,
            "device": args.judge_device,
            "dtype": args.judge_dtype,
            "batch_size": args.judge_batch_size,
            "max_new_tokens": args.max_tokens,
            "engine": args.engine,
            "kv_cache_gib": args.kv_cache_gib,
        },
        report=report,
    )
    print(json.dumps(summary, indent=2))
    return finish(args, report, summary["mined"], f"hard negatives to {args.output}")


def mine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "pool",
        help="teacher verdicts of a labeled pool (JSONL); traces the student was trained on are "
        "left out",
    )
    p.add_argument("--student", required=True, metavar="PATH", help="trained adapter or merged")
    p.add_argument("-o", "--output", required=True, help="folder for the mined steps")
    p.add_argument("--gold", nargs="+", help="gold labels: keep steps the paper's way")
    p.add_argument(
        "--include-training-traces",
        action="store_true",
        help="keep the student's training traces in the pool (measures memory, not the checker)",
    )
    p.add_argument(
        "--held-out-fraction", type=float, default=0.5, help="mined steps kept out of augmentation"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--augment-config",
        metavar="YAML",
        help="continue training the adapter on the mined half with this recipe, then re-measure",
    )
    p.add_argument("--augment-steps", type=int, default=200, help="augmentation optimiser steps")
    p.add_argument(
        "--augment-lr",
        type=float,
        default=None,
        help="augmentation learning rate (default: the recipe's learning_rate / 10, an order of "
        "magnitude below distillation as in the paper)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe key")
    g = p.add_argument_group("student judge")
    g.add_argument("--student-base", metavar="ID_OR_PATH", help="base of the adapter")
    g.add_argument("--judge-device", default=None, help="device (default auto)")
    g.add_argument("--judge-dtype", default=None, help="dtype (float32, bfloat16, ...)")
    g.add_argument("--judge-batch-size", type=int, default=8, help="generation batch")
    g.add_argument("--max-tokens", type=int, default=None, help="answer token budget")
    add_engine_options(g)
    add_nli_options(p)  # the shipped checker is compared: the tree needs stages D-E
    add_errors_option(p)


def train_main(argv: list[str] | None = None) -> int:
    """`python student/train.py` / `accelerate launch student/train.py`: `stepgap train`."""
    from stepgap.cli import main

    return main(["train", *(sys.argv[1:] if argv is None else argv)])


COMMANDS = [
    Command(
        "train",
        "train the student (LoRA/QLoRA SFT): same as student/train.py",
        train_arguments,
        train,
    ),
    Command(
        "mine",
        "hard negatives where the student parts from the teacher; optional augmentation run",
        mine_arguments,
        mine,
    ),
]
