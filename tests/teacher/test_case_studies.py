"""The paper's four case studies, trace to verdict, with the shipped replay files."""

from __future__ import annotations

import pytest

from stepgap.segment import iter_traces
from stepgap.teacher import Checker, ReplayJudge, ReplayNLI


@pytest.fixture(scope="module")
def verdicts(examples_dir):
    checker = Checker(
        ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )
    traces = list(iter_traces(examples_dir / "traces.jsonl"))
    return {t.id: vs for t, vs in zip(traces, checker.check(traces), strict=True)}


def test_case1_whitehorse_nli_breaks_prompt_contamination(verdicts):
    v = verdicts["case1-whitehorse"][-1]
    assert (v.label, v.path[-2:]) == ("no_gap", ["stageC:quote", "stageD:entailment"])
    assert "terminal handled 294,000 passengers" in v.nli[0].premise


def test_case2_kuhn_pertramer_missing_bridge(verdicts):
    vs = verdicts["case2-kuhn-pertramer"]
    assert [v.label for v in vs] == ["no_gap", "no_gap", "no_gap", "MB"]
    assert [v.path[-1] for v in vs] == [
        "stageD:entailment",
        "stageD:entailment",
        "stageC:no_quote",
        "stageD:neutral",
    ]
    assert vs[-1].repair == "bridging-search"


def test_case3_peter_and_paul_fortress_teacher_says_mb(verdicts):
    v = verdicts["case3-peter-paul-fortress"][-1]
    assert (v.label, v.path[-1]) == ("MB", "stageD:neutral")
    assert "citadel of St. Petersburg" in v.nli[0].premise


def test_case4_whiplash_quote_entailed(verdicts):
    v = verdicts["case4-whiplash"][1]
    assert (v.label, v.path[-2:]) == ("no_gap", ["stageC:quote", "stageD:entailment"])
    assert v.nli[0].premise == "directed by Damien Chazelle"


# The hand labels were made by reading the traces, not from the replay; the replayed teacher is
# wrong on these steps (the paper's failure modes), each explained by the annotator's note.
TEACHER_ERRORS = {
    ("nogap-tchaikovsky-abstention", 1): ("no_gap", "IE"),  # false negative: entity matched
    ("ie-eiffel-stage-e", 1): ("IE", "MB"),  # gap found, wrong type
}


def test_the_teacher_agrees_with_the_hand_labels_except_its_known_errors(verdicts, examples_dir):
    import json

    gold = {
        (g["trace_id"], g["step"]): g
        for g in map(json.loads, open(examples_dir / "gold_steps.jsonl"))
    }
    got = {(v.trace_id, v.step): v.label for vs in verdicts.values() for v in vs}
    assert gold.keys() == got.keys()
    differ = {k: (got[k], g["label"]) for k, g in gold.items() if got[k] != g["label"]}
    assert differ == TEACHER_ERRORS
    assert all(len(gold[k].get("note", "")) > 40 for k in differ)  # each one explained
    assert set(got.values()) == {"no_gap", "CC", "IE", "MB"}
    assert {g["label"] for g in gold.values()} == {"no_gap", "CC", "IE", "MB"}
