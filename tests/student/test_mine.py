"""Hard-negative mining: what counts as a disagreement, the gold rule, the split, the outputs."""

from __future__ import annotations

import json

import pytest

from stepgap.data_builders.io import read_models
from stepgap.data_builders.schema import Verdict
from stepgap.student.config import load_config
from stepgap.student.mining import (
    ShortCircuit,
    compare,
    nli_decision,
    select_hard_negatives,
    write_mined,
)
from stepgap.teacher.judges.base import JudgeResult


@pytest.fixture(scope="module")
def pool(examples_dir) -> list[Verdict]:
    return [v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict)]


def _agreeing(v: Verdict) -> JudgeResult:
    return JudgeResult(judge=v.judge, extra={"pipeline_path": list(v.path), "gap_type": v.label})


class ScriptedStudent:
    """A judge backend answering like the teacher except on chosen steps."""

    name = "scripted"

    def __init__(self, pool, overrides):
        self.by_key = {(v.trace_id, v.step): v for v in pool}
        self.overrides = overrides
        self.asked = []

    def judge(self, requests):
        self.asked.extend((r.trace_id, r.step) for r in requests)
        out = []
        for r in requests:
            v = self.by_key[(r.trace_id, r.step)]
            out.append(self.overrides.get((r.trace_id, r.step), _agreeing)(v))
        return out


def _short_circuit(v: Verdict) -> JudgeResult:
    """found_quote and no_gap, skipping stage D: the paper's calibration failure."""
    judge = v.judge.model_copy(deep=True)
    judge.step_1_quote_search.found_quote = True
    return JudgeResult(
        judge=judge,
        extra={"pipeline_path": ["stageA:on_target", "stageB:not_abstention", "stageC:quote"],
               "gap_type": "no_gap"},
    )  # fmt: skip


def test_nli_decision_is_the_stage_d_e_part():
    assert nli_decision(["stageA:on_target", "stageC:quote", "stageD:neutral"]) == (
        "stageD:neutral",
    )
    assert nli_decision(["stageA:off_target:entity_drift"]) == ()
    assert nli_decision(None) == ()


def test_agreeing_student_mines_nothing(pool):
    student = ScriptedStudent(pool, {})
    comparisons = compare(student, pool)
    assert len(comparisons) == len(student.asked) == sum(v.label is not None for v in pool)
    result = select_hard_negatives(comparisons)
    assert result.mined == [] and result.short_circuit.short_circuits == 0


def test_disagreements_are_mined_with_their_reason(pool):
    gaps = [v for v in pool if v.label not in (None, "no_gap") and nli_decision(v.path)]
    label_only = next(v for v in pool if v.label == "no_gap" and not nli_decision(v.path))
    overrides = {(v.trace_id, v.step): _short_circuit for v in gaps[:2]}
    overrides[(label_only.trace_id, label_only.step)] = lambda v: JudgeResult(
        judge=v.judge, extra={"pipeline_path": list(v.path), "gap_type": "IE"}
    )
    failed = next(v for v in pool if v.label == "CC")
    overrides[(failed.trace_id, failed.step)] = lambda v: JudgeResult.failed("truncated")
    result = select_hard_negatives(compare(ScriptedStudent(pool, overrides), pool))
    reasons = {(v.trace_id, v.step): r for v, r in result.mined}
    assert len(reasons) == 4
    assert reasons[(gaps[0].trace_id, gaps[0].step)] == "nli_stage"
    assert reasons[(label_only.trace_id, label_only.step)] == "label"
    assert reasons[(failed.trace_id, failed.step)].startswith("student failed")
    sc = result.short_circuit
    assert sc.short_circuits == 2
    assert sc.teacher_gaps == sum(v.label not in (None, "no_gap") for v in pool)
    assert sc.rate == pytest.approx(2 / sc.teacher_gaps)
    assert sc.share_of_false_negatives == 1.0
    # halves are split by trace
    held = {v.trace_id for v in result.held_out}
    assert not held & {v.trace_id for v in result.train}
    assert len(result.held_out) + len(result.train) == 4


def test_gold_keeps_only_steps_next_to_a_step_the_teacher_got_right(pool):
    target = next(v for v in pool if v.step == 1 and v.label is not None)
    other = next(v for v in pool if v.step == 1 and v.trace_id != target.trace_id)
    overrides = {(v.trace_id, v.step): _short_circuit for v in (target, other)}
    comparisons = compare(ScriptedStudent(pool, overrides), pool)
    teacher = {(v.trace_id, v.step): v.label for v in pool}
    gold = {
        (target.trace_id, 0): teacher[(target.trace_id, 0)],  # teacher right next to `target`
        (other.trace_id, 0): "CC" if teacher[(other.trace_id, 0)] != "CC" else "MB",  # wrong
    }
    result = select_hard_negatives(comparisons, gold)
    assert [(v.trace_id, v.step) for v, _ in result.mined] == [(target.trace_id, 1)]
    assert result.skipped_gold == 1


def test_write_mined_makes_an_sft_set_of_only_the_mined_steps(pool, tmp_path):
    from datasets import load_from_disk

    picks = [v for v in pool if v.label is not None][:6]
    overrides = {(v.trace_id, v.step): _short_circuit for v in picks}
    result = select_hard_negatives(
        compare(ScriptedStudent(pool, overrides), pool), held_out_fraction=0.5, seed=3
    )
    out = write_mined(result, pool, tmp_path / "mined")
    rows = [json.loads(x) for x in (out / "hard_negatives.jsonl").read_text().splitlines()]
    assert {(r["trace_id"], r["step"]) for r in rows} == {
        (v.trace_id, v.step) for v, _ in result.mined
    }
    assert {r["split"] for r in rows} <= {"train", "held_out"}
    data = load_from_disk(str(out / "sft"))
    got = {
        (t, s)
        for split in data.values()
        for t, s in zip(split["trace_id"], split["step"], strict=True)
    }
    assert got == {(v.trace_id, v.step) for v, _ in result.mined}
    if "test" in data:
        assert not set(data["test"]["trace_id"]) & set(data["train"]["trace_id"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mined"] == len(result.mined)


def test_short_circuit_of_empty_pool_has_no_rate():
    empty = ShortCircuit.of([])
    assert empty.rate is None and empty.share_of_false_negatives is None


def test_cli_mine_and_augment_with_the_tiny_student(tiny_student, examples_dir, tmp_path, capsys):
    """The trained tiny student over the whole pool (7 of 28 steps unseen), then augmentation at
    the recipe's rate / 10. Its disagreements are on the unseen traces; the hash split that held
    them out of training holds most of them out here too, hence a small held-out fraction."""
    from stepgap.cli import main

    from .conftest import TINY

    adapter, _ = tiny_student
    out = tmp_path / "mined"
    rc = main(
        [
            "mine", str(examples_dir / "teacher_verdicts.jsonl"), "--student", str(adapter),
            "-o", str(out), "--augment-config", str(TINY), "--augment-steps", "4",
            "--max-tokens", "256", "--held-out-fraction", "0.1",
        ]
    )  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["short_circuit"]["steps"] == 28
    assert summary["mined"] == summary["train"] + summary["held_out"] > 0
    assert summary["short_circuit_after"]["steps"] == 28
    assert summary["augment_learning_rate"] == pytest.approx(load_config(TINY).learning_rate / 10)
    assert summary["agreement"]["steps"] == 28 and summary["agreement"]["label"] >= 16 / 28
    assert (out / "augmented" / "adapter_model.safetensors").is_file()
    base = json.loads((out / "augmented" / "adapter_config.json").read_text())
    assert base["base_model_name_or_path"] == str(adapter / "tiny-base")
    mined = [json.loads(x) for x in (out / "hard_negatives.jsonl").read_text().splitlines()]
    assert len(mined) == summary["mined"]
    # the augmentation moved the adapter: every LoRA matrix it trained changed
    from safetensors.torch import load_file

    before = load_file(adapter / "adapter_model.safetensors")
    after = load_file(out / "augmented" / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    moved = [k for k in before if (after[k] - before[k]).abs().max() > 1e-6]
    assert len(moved) == len(before), f"{len(moved)}/{len(before)} tensors moved"
    # and what the student answers: its agreement with the teacher is not the same afterwards
    assert summary["agreement_after"] != summary["agreement"], summary["agreement"]


def test_agreement_rates(pool):
    from stepgap.student.mining import Agreement

    labeled = [v for v in pool if v.label is not None]
    off = labeled[0]
    overrides = {(off.trace_id, off.step): lambda v: JudgeResult(
        judge=v.judge, extra={"pipeline_path": ["stageA:on_target"], "gap_type": v.label})}  # fmt: skip
    agreement = Agreement.of(compare(ScriptedStudent(pool, overrides), pool))
    n = len(labeled)
    assert agreement.steps == n and agreement.failed == 0
    assert agreement.judge_json == 1.0 and agreement.label == 1.0
    assert agreement.path == pytest.approx((n - 1) / n)
