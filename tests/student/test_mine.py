"""Hard-negative mining: what counts as a disagreement, the gold rule, the split, the outputs."""

from __future__ import annotations

import json

import pytest

from stepgap.io import read_models
from stepgap.schema import NLIProbs, Verdict
from stepgap.student.mining import (
    ShortCircuit,
    compare,
    nli_decision,
    select_hard_negatives,
    write_mined,
)
from stepgap.student.recipe import load_config
from stepgap.teacher.judges.base import JudgeBackend
from stepgap.teacher.nli.base import NLIBackend
from stepgap.teacher.nli.replay import ReplayNLI
from stepgap.tree import JudgeResult


@pytest.fixture(scope="module")
def pool(examples_dir) -> list[Verdict]:
    return [v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict)]


def _agreeing(v: Verdict) -> JudgeResult:
    return JudgeResult(judge=v.judge)


class ScriptedStudent(JudgeBackend):
    """A judge backend answering with the teacher's judge object except on chosen steps."""

    name = "scripted"

    def __init__(self, pool, overrides):
        self.by_key = {(v.trace_id, v.step): v for v in pool}
        self.overrides = overrides
        self.asked = []

    def judge(self, requests, *, stop=None):
        self.asked.extend((r.trace_id, r.step) for r in requests)
        out = []
        for r in requests:
            v = self.by_key[(r.trace_id, r.step)]
            out.append(self.overrides.get((r.trace_id, r.step), _agreeing)(v))
        return out


class PoolNLI(NLIBackend):
    """The teacher's stored NLI answers; a pair the teacher never asked (a quote only the
    student chose) gets `unseen`."""

    name = "pool-nli"

    def __init__(self, pool, unseen: NLIProbs):
        self.replay = ReplayNLI.from_verdicts(pool)
        self.unseen = unseen

    def predict(self, pairs):
        return [self.replay.table.get(p, self.unseen) for p in pairs]


ENTAILED = NLIProbs(entailment=0.9, neutral=0.05, contradiction=0.05)


@pytest.fixture(scope="module")
def nli(pool) -> PoolNLI:
    return PoolNLI(pool, ENTAILED)


def _own_quote(v: Verdict) -> JudgeResult:
    """The student finds a quote of its own (verbatim from the trace's evidence so far) that
    the NLI entails: the tree then says no-gap where the teacher, after its NLI, found a gap."""
    judge = v.judge.model_copy(deep=True)
    section = judge.step_1_quote_search
    section.entity_match = True
    section.found_quote = True
    section.evidence_quote = EVIDENCE_SO_FAR[(v.trace_id, v.step)][0][:80]
    assert section.evidence_quote != v.judge.step_1_quote_search.evidence_quote
    return JudgeResult(judge=judge)


EVIDENCE_SO_FAR: dict[tuple[str, int], list[str]] = {}


def _stage_d_gaps(pool) -> list[Verdict]:
    """Teacher gaps decided at stage D (on target, not an abstention, its quote not entailed)."""
    for v in pool:
        EVIDENCE_SO_FAR[(v.trace_id, v.step)] = [
            s.text for u in pool if u.trace_id == v.trace_id and u.step <= v.step
            for s in u.step_data.evidence
        ]  # fmt: skip
    return [v for v in pool if v.label in ("MB", "CC") and "stageC:quote" in v.path
            and EVIDENCE_SO_FAR[(v.trace_id, v.step)]]  # fmt: skip


def test_nli_decision_is_the_stage_d_e_part():
    assert nli_decision(["stageA:on_target", "stageC:quote", "stageD:neutral"]) == (
        "stageD:neutral",
    )
    assert nli_decision(["stageA:off_target:entity_drift"]) == ()
    assert nli_decision(None) == ()


def test_the_teachers_judge_objects_through_the_shipped_tree_give_the_teachers_verdicts(pool, nli):
    """A student that answers exactly as the teacher did must disagree nowhere: the expected
    result (nothing mined) holds by construction, whatever the teacher said. The tests below
    script disagreements of their own and check each is mined with its reason."""
    student = ScriptedStudent(pool, {})
    comparisons = compare(student, pool, nli)
    labeled = [v for v in pool if v.label is not None]
    assert len(comparisons) == len(labeled)
    assert set(student.asked) == {(v.trace_id, v.step) for v in pool}  # whole traces
    assert all(c.student_path == list(c.teacher.path) for c in comparisons)
    result = select_hard_negatives(comparisons)
    assert result.mined == [] and result.short_circuit.short_circuits == 0


def test_what_the_student_says_of_its_own_label_and_path_is_not_what_ships(pool, nli):
    """The student's self-reported `gap_type`/`pipeline_path` never reach a verdict: a student
    claiming no-gap everywhere, with the teacher's judge objects, ships the teacher's labels."""
    claims = lambda v: JudgeResult(  # noqa: E731
        judge=v.judge, extra={"gap_type": "no_gap", "pipeline_path": ["stageC:quote"]}
    )
    overrides = {(v.trace_id, v.step): claims for v in pool}
    result = select_hard_negatives(compare(ScriptedStudent(pool, overrides), pool, nli))
    assert result.mined == [] and result.short_circuit.short_circuits == 0


def test_a_quote_that_lets_a_gap_through_is_a_short_circuit_read_from_the_shipped_path(pool):
    gaps = _stage_d_gaps(pool)
    assert len(gaps) >= 2
    overrides = {(v.trace_id, v.step): _own_quote for v in gaps[:2]}
    student = ScriptedStudent(pool, overrides)
    comparisons = compare(student, pool, PoolNLI(pool, ENTAILED))
    by_key = {(c.teacher.trace_id, c.teacher.step): c for c in comparisons}
    for v in gaps[:2]:
        c = by_key[(v.trace_id, v.step)]
        assert c.student_label == "no_gap" and c.student_path[-1] == "stageD:entailment"
        assert c.short_circuit() and c.differs() == "nli_stage"
    sc = ShortCircuit.of(comparisons)
    assert sc.short_circuits == 2 and sc.student_false_negatives == 2
    assert sc.teacher_gaps == sum(v.label not in (None, "no_gap") for v in pool)
    assert sc.rate == pytest.approx(2 / sc.teacher_gaps) and sc.share_of_false_negatives == 1.0
    # the same quote, not entailed by the NLI: the tree catches it; no short circuit
    neutral = NLIProbs(entailment=0.05, neutral=0.9, contradiction=0.05)
    caught = compare(ScriptedStudent(pool, overrides), pool, PoolNLI(pool, neutral))
    assert ShortCircuit.of(caught).short_circuits == 0


def test_disagreements_are_mined_with_their_reason(pool, nli):
    gaps = _stage_d_gaps(pool)
    off = next(v for v in pool if v.label == "no_gap" and v.path[0] == "stageA:on_target"
               and v.step_data.type != "conclusion")  # fmt: skip

    def drift(v: Verdict) -> JudgeResult:
        judge = v.judge.model_copy(deep=True)
        judge.step_minus1_alignment.is_off_target = True
        judge.step_minus1_alignment.drift_type = "entity_drift"
        return JudgeResult(judge=judge)

    failed = next(v for v in pool if v.label == "CC")
    overrides = {
        (gaps[0].trace_id, gaps[0].step): _own_quote,
        (off.trace_id, off.step): drift,
        (failed.trace_id, failed.step): lambda v: JudgeResult.failed("truncated"),
    }
    result = select_hard_negatives(compare(ScriptedStudent(pool, overrides), pool, nli))
    reasons = {(v.trace_id, v.step): r for v, r in result.mined}
    assert reasons[(gaps[0].trace_id, gaps[0].step)] == "nli_stage"
    assert reasons[(off.trace_id, off.step)] == "label"
    assert reasons[(failed.trace_id, failed.step)].startswith("student failed")
    assert len(reasons) == 3
    # halves are split by trace
    held = {v.trace_id for v in result.held_out}
    assert not held & {v.trace_id for v in result.train}
    assert len(result.held_out) + len(result.train) == 3


def test_gold_keeps_only_steps_next_to_a_step_the_teacher_got_right(pool, nli):
    gaps = [v for v in _stage_d_gaps(pool) if v.step >= 1]
    target, other = next((a, b) for a in gaps for b in gaps if a.trace_id != b.trace_id)
    overrides = {(v.trace_id, v.step): _own_quote for v in (target, other)}
    comparisons = compare(ScriptedStudent(pool, overrides), pool, nli)
    teacher = {(v.trace_id, v.step): v.label for v in pool}
    before = (target.trace_id, target.step - 1)
    wrong = (other.trace_id, other.step - 1)
    gold = {
        before: teacher[before],  # the teacher is right next to `target`
        wrong: "CC" if teacher[wrong] != "CC" else "MB",  # and wrong next to `other`
    }
    result = select_hard_negatives(comparisons, gold)
    assert [(v.trace_id, v.step) for v, _ in result.mined] == [(target.trace_id, target.step)]
    assert result.skipped_gold == 1


def test_the_pool_leaves_out_the_traces_the_student_was_trained_on(pool, tmp_path):
    from stepgap.student.judge import STUDENT_META, TRAIN_TRACES
    from stepgap.student.mining import held_out_pool

    traces = sorted({v.trace_id for v in pool})
    student = tmp_path / "student"
    student.mkdir()
    (student / STUDENT_META).write_text(json.dumps({TRAIN_TRACES: traces[:-2]}))
    kept, info = held_out_pool(pool, student)
    assert {v.trace_id for v in kept} == set(traces[-2:])
    assert info == {"training_traces_dropped": len(traces) - 2}
    assert len(held_out_pool(pool, student, allow_training_traces=True)[0]) == len(pool)
    (student / STUDENT_META).write_text(json.dumps({TRAIN_TRACES: traces}))
    with pytest.raises(ValueError, match="every trace of the pool was in .* training set"):
        held_out_pool(pool, student)


def test_write_mined_makes_an_sft_set_of_only_the_mined_steps(pool, nli, tmp_path):
    from datasets import load_from_disk

    picks = [v for v in pool if v.label is not None][:6]
    overrides = {(v.trace_id, v.step): lambda v: JudgeResult.failed("truncated") for v in picks}
    result = select_hard_negatives(
        compare(ScriptedStudent(pool, overrides), pool, nli), held_out_fraction=0.5, seed=3
    )
    assert len(result.mined) == 6
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


def test_cli_mine_and_augment_with_the_tiny_student(
    tiny_student, tiny_nli, examples_dir, tmp_path, capsys, monkeypatch
):
    """The trained tiny student as it ships (its judge objects through the tree and the NLI
    stand-in) over the pool's held-out traces, then augmentation at the recipe's rate / 10.
    Each judge is closed when its comparisons are done, the first before the augmentation
    trains (on vLLM its engine holds most of the GPU's memory)."""
    from stepgap.cli import main
    from stepgap.student import mining
    from stepgap.student.judge import TRAIN_TRACES, StudentJudge, student_meta

    from .conftest import TINY

    events = []
    monkeypatch.setattr(StudentJudge, "close", lambda self: events.append(("closed", self)))
    trains = mining.augment
    monkeypatch.setattr(
        mining, "augment", lambda *a, **k: events.append(("augment", None)) or trains(*a, **k)
    )

    adapter, _ = tiny_student
    trained = set(student_meta(adapter)[TRAIN_TRACES])
    pool = [v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict)]
    held = [v for v in pool if v.trace_id not in trained]
    assert trained and held and len(held) < len(pool)
    out = tmp_path / "mined"
    rc = main(
        [
            "mine", str(examples_dir / "teacher_verdicts.jsonl"), "--student", str(adapter),
            "--nli", str(tiny_nli), "-o", str(out), "--augment-config", str(TINY),
            "--augment-steps", "4", "--max-tokens", "256", "--held-out-fraction", "0.1",
        ]
    )  # fmt: skip
    assert rc == 0
    assert [e for e, _ in events] == ["closed", "augment", "closed"]
    assert events[0][1] is not events[2][1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training_traces_dropped"] == len({v.trace_id for v in pool} & trained)
    assert summary["short_circuit"]["steps"] == len(held)
    assert summary["mined"] == summary["train"] + summary["held_out"] > 0
    assert summary["short_circuit_after"]["steps"] == len(held)
    rate = load_config(TINY).training_args.learning_rate
    assert summary["augment_learning_rate"] == pytest.approx(rate / 10)
    assert summary["agreement"]["steps"] == len(held)
    assert (out / "augmented" / "adapter_model.safetensors").is_file()
    base = json.loads((out / "augmented" / "adapter_config.json").read_text())
    assert base["base_model_name_or_path"] == str(adapter / "tiny-base")
    # the augmented adapter knows it has now seen the mined train half's traces too
    seen = set(student_meta(out / "augmented")[TRAIN_TRACES])
    rows = [json.loads(x) for x in (out / "hard_negatives.jsonl").read_text().splitlines()]
    assert seen == trained | {r["trace_id"] for r in rows if r["split"] == "train"}
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


def test_agreement_rates(pool, nli):
    from stepgap.student.mining import Agreement

    labeled = [v for v in pool if v.label is not None]
    off = _stage_d_gaps(pool)[0]
    failed = next(v for v in labeled if v.label == "no_gap")
    terse = next(v for v in labeled if v.label == "no_gap" and v is not failed)

    def without_reasoning(v: Verdict) -> JudgeResult:  # a compact student's answer
        judge = v.judge.model_copy(deep=True)
        judge.step_minus1_alignment.alignment_reasoning = ""
        judge.step_1_quote_search.quote_search_reasoning = ""
        return JudgeResult(judge=judge)

    overrides = {(off.trace_id, off.step): _own_quote,
                 (failed.trace_id, failed.step): lambda v: JudgeResult.failed("truncated"),
                 (terse.trace_id, terse.step): without_reasoning}  # fmt: skip
    agreement = Agreement.of(compare(ScriptedStudent(pool, overrides), pool, nli))
    n = len(labeled)
    assert agreement.steps == n and agreement.failed == 1
    assert agreement.judge_json == agreement.label == agreement.path == pytest.approx((n - 2) / n)
    assert agreement.nli_stage == pytest.approx((n - 2) / n)


def test_augmenting_an_adapter_that_names_its_base_relatively_trains_on_that_base(
    tmp_path, monkeypatch
):
    """The augmentation continues the adapter on its own base, found from any folder."""
    import stepgap.student.trainer
    from stepgap.student.mining import augment
    from tests.fixtures.models import build_tiny_adapter

    from .conftest import TINY

    adapter = build_tiny_adapter(tmp_path / "project" / "student", "student/tiny-base")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    recipes = []
    monkeypatch.setattr(stepgap.student.trainer, "train", recipes.append)
    augment(TINY, adapter, tmp_path / "mined", learning_rate=1e-4)
    (recipe,) = recipes
    assert recipe.model_args.model_name_or_path == str(adapter / "tiny-base")
    assert recipe.script_args.init_adapter == str(adapter)


def test_the_shipped_checker_shows_its_progress_over_the_pool(pool, nli, capsys):
    """`stepgap mine` runs a model over every step of the pool: its progress (a log here) has
    the pool's steps as total, and `--no-progress` (progress=False) shows none."""
    compare(ScriptedStudent(pool, {}), pool, nli, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"mine: 0/{len(pool)} steps, ")
    assert lines[-1].startswith(f"mine: {len(pool)}/{len(pool)} steps, ")
    compare(ScriptedStudent(pool, {}), pool, nli)
    assert capsys.readouterr().err == ""
