"""A tiny student trained once per session by the shipped `tiny` recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepgap.data_builders.io import read_models
from stepgap.data_builders.schema import Verdict
from stepgap.student.config import load_config
from stepgap.student.sft import train

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "student" / "configs" / "tiny.yaml"


@pytest.fixture(scope="session")
def pool(examples_dir) -> list[Verdict]:
    return [v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict)]


@pytest.fixture(scope="session")
def tiny_student(tmp_path_factory, examples_dir) -> tuple[Path, dict]:
    """The tiny recipe exactly as shipped (16 steps, 100 optimiser steps), in a temp folder."""
    out = tmp_path_factory.mktemp("tiny-student")
    cfg = load_config(
        TINY, {"output_dir": str(out), "dataset": str(examples_dir / "teacher_verdicts.jsonl")}
    )
    return out, train(cfg)
