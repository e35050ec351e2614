"""Training the typed PRM (student/prm_train.py) from teacher verdicts: the prm-tiny recipe under
`accelerate launch` as users run it, its folder loaded by `PRMChecker`, bad records, the window,
resuming, and hard negatives mined with a PRM."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest

from stepgap.data_builders.sft_data import in_eval_split
from stepgap.schema import LABELS
from stepgap.student.judge import TRAIN_TRACES
from stepgap.student.mining import pool_traces
from stepgap.student.prm import IGNORE, PRM_META, PRMChecker
from stepgap.student.recipe import load_config
from stepgap.student.trainer import train

from .conftest import REPO

PRM_TINY = REPO / "student" / "configs" / "prm-tiny.yaml"
HELD_OUT = {"case3-peter-paul-fortress", "hermes-blade-runner", "ie-eiffel-stage-e"}


def _agreement(folder: Path, pool, held: bool) -> tuple[float, float, int]:
    """(share of steps whose label the PRM gives as the teacher did, share whose firing stage
    it gives as the teacher's path ends, steps) on the recipe's training (or held-out) traces."""
    fraction = load_config(PRM_TINY).script_args.eval_fraction
    teacher = {(v.trace_id, v.step): v for v in pool}
    traces = [t for t in pool_traces(pool) if in_eval_split(t.id, fraction) == held]
    verdicts = [v for vs in PRMChecker.from_folder(folder).check(traces) for v in vs]
    wanted = [teacher[(v.trace_id, v.step)] for v in verdicts]
    labels = sum(v.label == w.label for v, w in zip(verdicts, wanted, strict=True))
    stages = sum(v.path[-1] == w.path[-1] for v, w in zip(verdicts, wanted, strict=True))
    return labels / len(verdicts), stages / len(verdicts), len(verdicts)


def _disagreeing(folder: Path, pool) -> set[tuple[str, int]]:
    """The held-out steps whose label or firing stage the PRM gives otherwise than the teacher."""
    teacher = {(v.trace_id, v.step): (v.label, v.path[-1]) for v in pool}
    traces = [t for t in pool_traces(pool) if t.id in HELD_OUT]
    verdicts = [v for vs in PRMChecker.from_folder(folder).check(traces) for v in vs]
    return {
        (v.trace_id, v.step)
        for v in verdicts
        if (v.label, v.path[-1]) != teacher[(v.trace_id, v.step)]
    }


def test_accelerate_launch_writes_a_prm_that_labels_the_training_steps_as_the_teacher(
    prm_launched, pool
):
    out, proc = prm_launched
    assert proc.stderr.rstrip().endswith(f"wrote the PRM to {out}")
    metrics = json.loads(proc.stdout[proc.stdout.rindex("\n{\n") + 1 :])
    assert metrics["global_step"] == 100
    assert metrics["prm_steps"] == {"train_traces": 7, "train_steps": 21, "held_out_traces": 3,
                                    "held_out_steps": 7, "past_window": 0}  # fmt: skip
    assert 0.0 <= metrics["eval_label_accuracy"] <= 1.0 and metrics["eval_loss"] > 0
    meta = json.loads((out / PRM_META).read_text())
    assert meta["kind"] == "prm" and meta["format"]["max_length"] == 512
    assert set(meta[TRAIN_TRACES]).isdisjoint(HELD_OUT) and len(meta[TRAIN_TRACES]) == 7
    assert meta["base_model"] == str(out / "tiny-prm-base")
    assert "fine-tuned from `tiny-prm-base`" in (out / "README.md").read_text()
    labels, stages, steps = _agreement(out, pool, held=False)
    assert steps == 21
    assert labels >= 0.8 and stages >= 0.8, (labels, stages)


def test_the_fixture_prm_agrees_and_its_base_alone_does_not(tiny_prm_trained, pool):
    """The bar above is not met by chance: the random base it started from gets far fewer of
    the training steps' labels and stages."""
    out, metrics = tiny_prm_trained
    assert metrics["global_step"] == 100
    labels, stages, _ = _agreement(out, pool, held=False)
    assert labels >= 0.8 and stages >= 0.8, (labels, stages)
    base = out / "tiny-prm-base"
    shutil.copy(out / PRM_META, base / PRM_META)
    base_labels, base_stages, _ = _agreement(base, pool, held=False)
    assert base_labels < 0.6 and base_stages < 0.3, (base_labels, base_stages)


def test_the_loss_is_both_heads_at_the_markers_only():
    import torch

    from stepgap.student.prm_train import prm_loss

    logits = torch.zeros(1, 3, len(LABELS) + 15)
    logits[0, 1, 2] = 10.0  # the label head says IE at the marker
    logits[0, 1, len(LABELS) + 12] = 10.0  # the stage head says its 13th stage
    labels = torch.tensor([[IGNORE, 2, IGNORE]])
    stages = torch.tensor([[IGNORE, 12, IGNORE]])
    assert prm_loss(logits, labels, stages).item() < 1e-3
    assert prm_loss(logits, labels, torch.tensor([[IGNORE, 3, IGNORE]])).item() > 5
    assert prm_loss(logits, torch.tensor([[IGNORE, 1, IGNORE]]), stages).item() > 5
    none = torch.full((1, 3), IGNORE)
    assert prm_loss(logits, none, none).item() == 0.0  # no target in the batch: no NaN


def test_a_bad_verdict_is_skipped_with_a_warning_naming_its_line(tmp_path, examples_dir, caplog):
    lines = (examples_dir / "teacher_verdicts.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["label"] = "maybe"
    data = tmp_path / "verdicts.jsonl"
    data.write_text("\n".join([lines[0], json.dumps(bad), *lines[1:]]) + "\n")
    settings = {"dataset": str(data), "output_dir": str(tmp_path / "out"), "max_steps": 2,
                "eval_strategy": "no", "save_steps": 10}  # fmt: skip
    with caplog.at_level(logging.WARNING):
        metrics = train(load_config(PRM_TINY, settings))
    assert f"{data}:2: label" in caplog.text
    assert "skipped 1 bad record(s)" in caplog.text
    assert metrics["global_step"] == 2 and metrics["prm_steps"]["train_steps"] == 21
    PRMChecker.from_folder(tmp_path / "out")


def test_steps_past_the_window_are_counted_and_never_trained(tmp_path, examples_dir, caplog):
    settings = {"dataset": str(examples_dir / "teacher_verdicts.jsonl"), "max_length": 200,
                "output_dir": str(tmp_path / "out"), "max_steps": 1, "eval_strategy": "no"}  # fmt: skip
    with caplog.at_level(logging.WARNING):
        metrics = train(load_config(PRM_TINY, settings))
    said = re.search(
        r"(\d+) training and (\d+) held-out labelled steps fall past the PRM's window "
        r"\(max_length=200\)",
        caplog.text,
    )
    assert said, caplog.text
    past = metrics["prm_steps"]["past_window"]
    assert past > 0 and int(said[1]) + int(said[2]) == past
    checker = PRMChecker.from_folder(tmp_path / "out")
    assert checker.format.max_length == 200


def test_resume_continues_from_the_checkpoint_to_the_same_weights(tmp_path, examples_dir):
    from safetensors.torch import load_file

    settings = {"dataset": str(examples_dir / "teacher_verdicts.jsonl"), "max_steps": 4,
                "save_steps": 2, "save_total_limit": None, "eval_strategy": "no",
                "output_dir": str(tmp_path / "run")}  # fmt: skip
    out = tmp_path / "run"
    full = train(load_config(PRM_TINY, settings))
    assert full["global_step"] == 4 and full["resumed_from"] is None
    reference = load_file(out / "model.safetensors")
    shutil.rmtree(out / "checkpoint-4")  # a crash after step 2
    (out / "model.safetensors").unlink()
    resumed = train(load_config(PRM_TINY, settings), resume=True)
    assert resumed["resumed_from"].endswith("checkpoint-2") and resumed["global_step"] == 4
    again = load_file(out / "model.safetensors")
    assert again.keys() == reference.keys()
    for name, tensor in reference.items():
        assert (again[name] - tensor).abs().max() < 1e-5, name


def test_a_prm_recipe_refuses_what_only_the_judge_student_has(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("kind: prm\nmodel_name_or_path: x\ndataset: y\nuse_peft: true\n")
    with pytest.raises(ValueError, match=rf"^{recipe}:4: use_peft: a PRM is fine-tuned whole"):
        load_config(recipe)
    recipe.write_text("kind: reward\nmodel_name_or_path: x\ndataset: y\nuse_peft: true\n")
    with pytest.raises(ValueError, match=r":1: kind: kind is one of generative, prm, not 'reward'"):
        load_config(recipe)
    assert load_config(recipe, {"kind": "prm", "use_peft": False}).script_args.kind == "prm"


def test_mine_with_a_prm_writes_the_steps_it_gets_wrong_and_augments(
    tiny_prm_trained, tmp_path, examples_dir, capsys, pool
):
    """`stepgap mine --student PRM`: no NLI model; the training traces are left out, a held-out
    step is mined where the PRM's label or stage differs from the teacher's; the mined verdicts
    are a dataset a prm recipe trains on, and the augmentation continues the PRM from its folder
    at the recipe's rate / 10 and moves it towards the teacher on the mined steps."""
    from stepgap.cli import main
    from stepgap.student.prm_train import read_verdicts

    prm, _ = tiny_prm_trained
    verdicts = str(examples_dir / "teacher_verdicts.jsonl")
    out = tmp_path / "mined"
    assert main(["mine", verdicts, "--student", str(prm), "--nli", "x", "-o", str(out)]) == 2
    assert "is a PRM, which uses no NLI model" in capsys.readouterr().err
    argv = ["mine", verdicts, "--student", str(prm), "-o", str(out), "--no-progress",
            "--held-out-fraction", "0", "--augment-config", "prm-tiny", "--augment-steps", "20"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training_traces_dropped"] == 7 and summary["agreement"]["steps"] == 7
    mined = [json.loads(line) for line in (out / "hard_negatives.jsonl").read_text().splitlines()]
    assert mined and len(mined) == summary["mined"] == summary["train"]
    assert {(m["trace_id"], m["step"]) for m in mined} == _disagreeing(prm, pool)
    assert {m["mined_reason"] for m in mined} <= {"label", "stage"}
    data = read_verdicts(out / "prm")
    assert sum(v.label is not None for v in data) == len(mined)
    assert summary["augment_learning_rate"] == pytest.approx(0.001)
    augmented = Path(summary["augmented_prm"])
    meta = json.loads((augmented / PRM_META).read_text())
    assert meta["base_model"] == str(prm) and HELD_OUT <= set(meta[TRAIN_TRACES])
    assert summary["agreement_after"]["path"] > summary["agreement"]["path"]
