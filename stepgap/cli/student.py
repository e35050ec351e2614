"""Commands of the student: `train` (LoRA/QLoRA SFT, what `student/train.py` runs) and `mine`
(hard negatives, optional augmentation run)."""

from __future__ import annotations

import argparse
import json

from stepgap.cli import Command
from stepgap.cli.options import (
    add_engine_options,
    add_errors_option,
    add_nli_options,
    finish,
    positive_int,
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
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="give a recipe key as the file would",
    )
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.epilog = (
        "Any field of the recipe's dataclasses (stepgap's StudentArguments, TRL's SFTConfig and "
        "ModelConfig) is also a flag, as in TRL's scripts: --learning_rate 1e-4, --seed 3. "
        "`python student/train.py --help` lists them."
    )


def train(args: argparse.Namespace) -> int:
    """The command line as typed goes to the student's own parser (TRL's, as student/train.py
    runs it): it knows the recipe's keys, this command's parser only the run's options."""
    from stepgap.student.train import main as train_student
    from stepgap.student.train import make_parser

    parser = make_parser(prog="stepgap train")
    script_args, training_args, model_args, options = parser.parse_args_and_config(args.argv)
    return train_student(script_args, training_args, model_args, options)


def mine(args: argparse.Namespace) -> int:
    from stepgap.io import ErrorReport
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
    p.add_argument(
        "--augment-steps", type=positive_int, default=200, help="augmentation optimiser steps"
    )
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
    g.add_argument("--judge-batch-size", type=positive_int, default=8, help="generation batch")
    g.add_argument("--max-tokens", type=positive_int, default=None, help="answer token budget")
    add_engine_options(g)
    add_nli_options(p)  # the shipped checker is compared: the tree needs stages D-E
    add_errors_option(p)


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
