"""Teacher verdicts -> path-supervised SFT data: targets, trace-level splits, exclusions, CLI."""

from __future__ import annotations

import json

import pytest

from stepgap.cli import main
from stepgap.data_builders.sft_data import (
    SFTStats,
    build_sft_dataset,
    sft_examples,
    split_by_trace,
    student_target,
)
from stepgap.io import read_models
from stepgap.schema import Verdict
from stepgap.segment import iter_traces
from stepgap.teacher.checker import Checker
from stepgap.teacher.judges import ReplayJudge
from stepgap.teacher.nli.replay import ReplayNLI
from stepgap.teacher.prompt import build_messages


@pytest.fixture(scope="module")
def verdicts(examples_dir) -> list[Verdict]:
    return [v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict)]


def _many_traces(verdicts: list[Verdict], copies: int) -> list[Verdict]:
    """The example verdicts under `copies` distinct trace ids each."""
    return [
        v.model_copy(update={"trace_id": f"{v.trace_id}#{k}"})
        for k in range(copies)
        for v in verdicts
    ]


def test_shipped_teacher_verdicts_are_what_the_replay_teacher_says(examples_dir, verdicts):
    """The SFT tests read the shipped verdicts. Their oracle is outside the checker: the hand
    labels, which they match but on the teacher's two documented errors; and the replayed
    checker gives them back exactly (so they are the teacher's, not edited by hand)."""
    hand = {(g["trace_id"], g["step"]): g["label"]
            for g in map(json.loads, (examples_dir / "gold_steps.jsonl").open())}  # fmt: skip
    wrong = [(v.trace_id, v.step) for v in verdicts if v.label != hand[(v.trace_id, v.step)]]
    assert len(verdicts) == len(hand) and len(wrong) == 2, wrong
    traces = list(iter_traces(examples_dir / "traces.jsonl"))
    checker = Checker(
        ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )
    fresh = [v for vs in checker.check(traces) for v in vs]
    assert [(v.trace_id, v.step, v.label, v.path) for v in fresh] == [
        (v.trace_id, v.step, v.label, v.path) for v in verdicts
    ]


def test_target_is_the_judge_json_plus_path_and_label(verdicts):
    v = next(v for v in verdicts if v.label == "MB")
    target = json.loads(student_target(v))
    assert target.pop("pipeline_path") == v.path
    assert target.pop("gap_type") == "MB"
    assert target == v.judge.model_dump(mode="json")
    assert ", " not in student_target(v)[:40]  # compact, as constrained decoding writes JSON


def test_prompt_is_the_teachers_judge_prompt(verdicts):
    ex = next(sft_examples(verdicts))
    group = [v for v in verdicts if v.trace_id == ex["trace_id"]]
    steps = [v.step_data for v in group]
    assert ex["prompt"] == build_messages(group[0].question, steps, ex["step"])
    assert ex["completion"][0]["role"] == "assistant"


def test_split_never_puts_one_trace_on_both_sides(verdicts):
    data = build_sft_dataset(_many_traces(verdicts, 20), eval_fraction=0.3, seed=7)
    train, test = set(data["train"]["trace_id"]), set(data["test"]["trace_id"])
    assert train and test and not train & test
    # every step of a held-out trace is held out
    for tid in test:
        assert tid not in train
    assert 0.15 < len(test) / (len(test) + len(train)) < 0.45
    again = build_sft_dataset(_many_traces(verdicts, 20), eval_fraction=0.3, seed=7)
    assert set(again["test"]["trace_id"]) == test  # deterministic
    other = build_sft_dataset(_many_traces(verdicts, 20), eval_fraction=0.3, seed=8)
    assert set(other["test"]["trace_id"]) != test


def test_split_by_trace_is_stable_under_reordering(verdicts):
    examples = list(sft_examples(_many_traces(verdicts, 5)))
    a = split_by_trace(examples, 0.5)
    b = split_by_trace(list(reversed(examples)), 0.5)
    assert {e["trace_id"] for e in a[1]} == {e["trace_id"] for e in b[1]}


def test_excluded_and_failed_steps_are_counted_not_learned(verdicts):
    failed = verdicts[0].model_copy(update={"label": None, "judge": None, "error": "boom"})
    stats = SFTStats()
    excluded = {"case2-kuhn-pertramer"}
    out = list(sft_examples([failed, *verdicts[1:]], exclude_ids=excluded, stats=stats))
    assert stats.skipped_failed == 1
    assert stats.skipped_excluded == sum(v.trace_id in excluded for v in verdicts)
    assert not {e["trace_id"] for e in out} & excluded
    assert stats.examples == len(out) == len(verdicts) - 1 - stats.skipped_excluded
    assert str(stats).startswith(f"{len(out)} example(s) from {stats.traces} trace(s) (labels: ")
    assert str(stats).endswith(
        f"skipped 1 failed check(s), {stats.skipped_excluded} excluded step(s), 0 incomplete "
        "trace(s)"
    )


def test_cli_sft_data(tmp_path, examples_dir, capsys):
    from datasets import load_from_disk

    ids = tmp_path / "gold_ids.txt"
    ids.write_text("case1-whitehorse\n")
    out = tmp_path / "sft"
    rc = main(
        [
            "sft-data",
            str(examples_dir / "teacher_verdicts.jsonl"),
            "-o",
            str(out),
            "--eval-fraction",
            "0.3",
            "--exclude-ids",
            str(ids),
        ]
    )
    assert rc == 0
    data = load_from_disk(str(out))
    seen = set(data["train"]["trace_id"]) | set(data.get("test", data["train"])["trace_id"])
    assert "case1-whitehorse" not in seen
    assert set(data["train"].column_names) >= {"prompt", "completion", "trace_id", "step"}


def test_nli_features_variant(tmp_path, examples_dir, tiny_nli, verdicts):
    """--nli-features puts each step's NLI probabilities in its prompt and says so on disk."""
    from datasets import load_from_disk

    from stepgap.data_builders.sft_data import read_sft_metadata
    from stepgap.teacher import load_nli

    plain, feats = tmp_path / "plain", tmp_path / "feats"
    src = str(examples_dir / "teacher_verdicts.jsonl")
    assert main(["sft-data", src, "-o", str(plain), "--eval-fraction", "0"]) == 0
    assert main(["sft-data", src, "-o", str(feats), "--eval-fraction", "0",
                 "--nli-features", str(tiny_nli)]) == 0  # fmt: skip
    assert read_sft_metadata(plain)["nli_features"] is False
    assert read_sft_metadata(feats)["nli_features"] is True
    a, b = load_from_disk(str(plain))["train"], load_from_disk(str(feats))["train"]
    assert "nli_features" not in a[0]["prompt"][1]["content"]
    assert a["completion"] == b["completion"]  # same targets, only the prompt differs
    nli = load_nli(str(tiny_nli))
    first = next(sft_examples(verdicts, nli=nli))
    step = next(v for v in verdicts if v.trace_id == first["trace_id"] and v.step == first["step"])
    user = first["prompt"][1]["content"]
    assert '"nli_features"' in user
    assert len(step.step_data.evidence) == user.count('"entailment"')
    assert b[0]["prompt"] == first["prompt"]


def test_a_prompt_budget_set_for_the_data_is_the_one_the_student_judges_with(
    tmp_path, examples_dir, verdicts
):
    """`sft-data --evidence-chars N` shortens the earlier evidence of every prompt (to fit the
    recipe's max_length); the budget travels through the data's metadata into the student's,
    and the checker asks a judge that carries it with the same short prompts."""
    from datasets import load_from_disk

    from stepgap.data_builders.sft_data import read_sft_metadata
    from stepgap.student.judge import student_meta
    from stepgap.student.recipe import load_config
    from stepgap.student.trainer import write_student_metadata

    full, short = tmp_path / "full", tmp_path / "short"
    src = str(examples_dir / "teacher_verdicts.jsonl")
    assert main(["sft-data", src, "-o", str(full), "--eval-fraction", "0"]) == 0
    assert main(["sft-data", src, "-o", str(short), "--eval-fraction", "0",
                 "--evidence-chars", "150"]) == 0  # fmt: skip
    a, b = load_from_disk(str(full))["train"], load_from_disk(str(short))["train"]
    sizes = [
        (len(x[1]["content"]), len(y[1]["content"]))
        for x, y in zip(a["prompt"], b["prompt"], strict=True)
    ]
    assert all(s <= f for f, s in sizes) and sum(s < f for f, s in sizes) >= 5, sizes
    assert read_sft_metadata(short)["earlier_evidence_chars"] == 150
    assert read_sft_metadata(full).get("earlier_evidence_chars") is None
    cfg = load_config("tiny", {"output_dir": str(tmp_path / "student"), "dataset": str(short)})
    (tmp_path / "student").mkdir()
    write_student_metadata(cfg, read_sft_metadata(short), sorted(set(b["trace_id"])))
    assert student_meta(tmp_path / "student")["earlier_evidence_chars"] == 150

    class Recording(ReplayJudge):
        earlier_evidence_chars = 150

    judge = Recording.from_verdicts(verdicts)
    asked = []
    answer = judge.judge
    judge.judge = lambda requests: asked.extend(requests) or answer(requests)  # type: ignore[method-assign]
    traces = [t for t in iter_traces(examples_dir / "traces.jsonl")]
    Checker(judge, ReplayNLI.from_verdicts(verdicts)).judge_traces(traces)
    prompts = {(r.trace_id, r.step): r.messages for r in asked}
    for row in b:
        assert prompts[(row["trace_id"], row["step"])] == row["prompt"]


def _keys(node: object) -> set[str]:
    """Every key of a JSON object, at any depth."""
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    return set()


def test_compact_target_drops_the_reasoning_and_keeps_every_decision(verdicts):
    """`--target compact`: no reasoning strings, and for every example step the parsed answer
    gives the tree the same decisions as the full target, so re-deciding all 28 steps from the
    compact answers yields the teacher's labels and paths."""
    from stepgap.data_builders.student_target import (
        REASONING_FIELDS,
        judge_decisions,
        parse_student_answer,
    )
    from stepgap.teacher.relabel import relabel

    reasoning = {name for fields in REASONING_FIELDS.values() for name in fields}
    assert reasoning == {k for k in _keys(verdicts[0].judge.model_dump()) if "reasoning" in k}
    parsed = []
    for v in verdicts:
        text = student_target(v, "compact")
        assert not _keys(json.loads(text)) & reasoning, text
        assert "evidence_quote" in _keys(json.loads(text))  # stage D's premise, verbatim
        assert len(text) < len(student_target(v))
        judge, extra = parse_student_answer(text, "compact")
        full, full_extra = parse_student_answer(student_target(v))
        assert full == v.judge
        assert extra == full_extra == {"pipeline_path": v.path, "gap_type": v.label}
        assert judge_decisions(judge) == judge_decisions(full)
        dumped = judge.model_dump()
        assert all(dumped[s][n] == "" for s, names in REASONING_FIELDS.items() for n in names)
        parsed.append(v.model_copy(update={"judge": judge}))
    again = list(relabel(parsed))
    assert [(v.label, v.path) for v in again] == [(v.label, v.path) for v in verdicts]
    assert sum(v.label != "no_gap" for v in again) >= 5  # the examples exercise the gap labels


def test_a_compact_answer_is_refused_by_the_full_parser_and_vice_versa(verdicts):
    from stepgap.data_builders.student_target import parse_student_answer
    from stepgap.teacher.judges.base import JudgeParseError

    v = verdicts[0]
    with pytest.raises(JudgeParseError, match="alignment_reasoning"):
        parse_student_answer(student_target(v, "compact"))
    with pytest.raises(JudgeParseError, match="carries no reasoning"):
        parse_student_answer(student_target(v), "compact")
    with pytest.raises(ValueError, match="unknown student target 'short'"):
        student_target(v, "short")


def test_cli_sft_data_target_is_recorded_and_reaches_the_student(tmp_path, examples_dir):
    """`sft-data --target compact` writes compact completions and says so in stepgap_sft.json;
    the trainer copies the target into the student's stepgap_student.json; full is the default."""
    from datasets import load_from_disk

    from stepgap.data_builders.sft_data import read_sft_metadata
    from stepgap.student.judge import student_meta
    from stepgap.student.recipe import load_config
    from stepgap.student.trainer import write_student_metadata

    full, compact = tmp_path / "full", tmp_path / "compact"
    src = str(examples_dir / "teacher_verdicts.jsonl")
    assert main(["sft-data", src, "-o", str(full), "--eval-fraction", "0"]) == 0
    assert main(["sft-data", src, "-o", str(compact), "--eval-fraction", "0",
                 "--target", "compact"]) == 0  # fmt: skip
    assert read_sft_metadata(full)["target"] == "full"
    assert read_sft_metadata(compact)["target"] == "compact"
    a, b = load_from_disk(str(full))["train"], load_from_disk(str(compact))["train"]
    assert a["prompt"] == b["prompt"]  # same prompts, only the completion differs
    for x, y in zip(a["completion"], b["completion"], strict=True):
        assert "_reasoning" in x[0]["content"] and "_reasoning" not in y[0]["content"]
    for data, want in ((compact, "compact"), (full, "full")):
        out = tmp_path / f"student-{want}"
        out.mkdir()
        cfg = load_config("tiny", {"output_dir": str(out), "dataset": str(data)})
        write_student_metadata(cfg, read_sft_metadata(data), [])
        assert student_meta(out)["target"] == want
