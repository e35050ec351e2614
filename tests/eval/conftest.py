"""The files `stepgap view` reads, made from the shipped examples the way a user makes them:
`check` with the replayed judge and NLI, `relabel --ablate E`, `reward`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from stepgap.serving.reward_function import reward_file
from stepgap.teacher import build_checker, relabel_file
from stepgap.teacher.label import check_file
from stepgap.tree import TreeConfig


@dataclass(frozen=True)
class ViewInputs:
    traces: Path
    verdicts: Path  # StepGap, every stage
    minus_e: Path  # the same verdicts re-decided without stage E
    rewards: Path
    gold: tuple[Path, Path]  # step labels, trace correctness


@pytest.fixture(scope="session")
def view_inputs(tmp_path_factory, examples_dir) -> ViewInputs:
    out = tmp_path_factory.mktemp("view-inputs")
    traces = examples_dir / "traces.jsonl"
    checker = build_checker(
        f"replay:{examples_dir / 'judge_replay.jsonl'}",
        f"replay:{examples_dir / 'nli_replay.jsonl'}",
    )
    check_file(traces, checker, out / "StepGap.jsonl")
    relabel_file(out / "StepGap.jsonl", out / "minus_E.jsonl", TreeConfig(ablate="E"))
    reward_file(traces, out / "StepGap.jsonl", out / "rewards.jsonl")
    return ViewInputs(
        traces,
        out / "StepGap.jsonl",
        out / "minus_E.jsonl",
        out / "rewards.jsonl",
        (examples_dir / "gold_steps.jsonl", examples_dir / "gold_traces.jsonl"),
    )
