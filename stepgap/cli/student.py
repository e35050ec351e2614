"""Commands of the student: `train` (LoRA/QLoRA SFT, what `student/train.py` runs) and `mine`
(hard negatives, optional augmentation run)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from stepgap.cli import Command
from stepgap.cli.options import ProgressOptions, RecordOptions, finish
from stepgap.options import at_least_one, option
from stepgap.teacher.judges.hf import StudentJudgeOptions
from stepgap.teacher.nli import NLI_GROUP
from stepgap.tree import TreeConfig

if TYPE_CHECKING:
    from stepgap.arguments import ArgumentParser


def train(*parsed: Any) -> int:
    """The recipe as `student/train.py` parses it: stepgap's parser over StudentArguments,
    TRL's SFTConfig and ModelConfig (any of their fields is a flag: --learning_rate 1e-4), and
    the run's options."""
    from stepgap.student.train import main as train_student

    return train_student(*parsed)


def train_parser(prog: str) -> ArgumentParser:
    """The training run's own parser (TRL's dataclasses are imported only for it)."""
    from stepgap.student.recipe import make_parser

    return make_parser(prog)


@dataclass(frozen=True, kw_only=True)
class MineArguments(RecordOptions, ProgressOptions):
    pool: str = option(
        help="teacher verdicts of a labeled pool (JSONL); traces the student was trained on are "
        "left out",
        positional=True,
    )
    student: str | None = option(
        None, "trained adapter, merged model or PRM folder (or --bundle)", metavar="PATH"
    )
    bundle: str | None = option(
        None,
        "an exported bundle: its student, ONNX NLI model and thresholds are the checker that "
        "would ship (in place of --student and --nli); its folder or Hub id "
        "USER/NAME[@REVISION]",
        metavar="DIR_OR_ID",
    )
    output: str = option(help="folder for the mined steps", aliases=["-o"])
    gold: list[str] | None = option(None, "gold labels: keep steps the paper's way")
    include_training_traces: bool = option(
        False,
        "keep the student's training traces in the pool (measures memory, not the checker)",
    )
    held_out_fraction: float = option(0.5, "mined steps kept out of augmentation")
    seed: int = option(0, "seed of the split")
    augment_config: str | None = option(
        None,
        "continue training the adapter on the mined half with this recipe, then re-measure",
        metavar="YAML",
    )
    augment_steps: int = option(200, "augmentation optimiser steps")
    augment_lr: float | None = option(
        None,
        "augmentation learning rate (default: the recipe's learning_rate / 10, an order of "
        "magnitude below distillation as in the paper)",
    )
    set: list[str] = option([], "a recipe key of the augmentation", metavar="KEY=VALUE")
    nli: str | None = option(
        None,
        "the NLI model of the checker that would ship (stages D-E): replay:FILE, "
        "hf:ID_OR_PATH, onnx:EXPORTED_FOLDER or a hub id/path (or --bundle)",
        metavar="SPEC",
        group=NLI_GROUP,
    )
    device: str | None = option(None, "NLI device", group=NLI_GROUP)

    def __post_init__(self) -> None:
        from stepgap.student.prm import is_prm

        at_least_one("augment_steps", self.augment_steps)
        if self.bundle and (self.student or self.nli):
            raise ValueError("bundle brings its own student and NLI model: drop --student, --nli")
        prm = bool(self.student) and is_prm(self.student)  # a PRM checks alone: no NLI model
        if prm and self.nli:
            raise ValueError(f"{self.student} is a PRM, which uses no NLI model: drop --nli")
        if not self.bundle and not (self.student and (self.nli or prm)):
            raise ValueError(
                "give --student PATH with --nli SPEC (a PRM folder needs no --nli), or --bundle"
            )
        super().__post_init__()


def mine(args: MineArguments, judge: StudentJudgeOptions, tree: TreeConfig) -> int:
    from stepgap.io import ErrorReport
    from stepgap.student import mine as run_mining

    report = ErrorReport()
    student, nli = args.student, args.nli
    if args.bundle:  # the bundle's checker: its student, its NLI model, its thresholds
        from stepgap.export.offline import bundle_nli, open_bundle, student_options

        bundle = open_bundle(args.bundle)
        student, (nli, _) = str(bundle.student_dir), bundle_nli(bundle)
        judge = student_options(bundle, judge)
        tree = replace(TreeConfig(**bundle.tree), **tree.changed())
    summary = run_mining(
        args.pool,
        student,
        args.output,
        gold=args.gold,
        nli=nli,
        tree=tree,
        device=args.device,
        held_out_fraction=args.held_out_fraction,
        seed=args.seed,
        allow_training_traces=args.include_training_traces,
        augment_config=args.augment_config,
        augment_steps=args.augment_steps,
        augment_lr=args.augment_lr,
        overrides=args.set,
        judge_options=judge,
        report=report,
        progress=not args.no_progress,
    )
    print(json.dumps(summary, indent=2))
    return finish(args, report, summary["mined"], f"hard negatives to {args.output}")


COMMANDS = [
    Command(
        "train",
        "train the student (LoRA/QLoRA SFT): same as student/train.py",
        (),
        train,
        parser=train_parser,
    ),
    Command(
        "mine",
        "hard negatives where the student (or a PRM) parts from the teacher; optional "
        "augmentation run",
        (MineArguments, StudentJudgeOptions, TreeConfig),
        mine,
    ),
]
