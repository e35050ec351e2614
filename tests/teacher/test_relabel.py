"""Re-deciding stored verdicts: identity, ablations, threshold moves, no model calls."""

from __future__ import annotations

import json

import pytest

from stepgap.cli import main
from stepgap.data_builders import Verdict, iter_traces
from stepgap.teacher import Checker, RelabelError, ReplayJudge, ReplayNLI, TreeConfig, relabel

# Under a higher entailment or contradiction threshold only NLI-decided labels may move, and
# only to the classes the tree allows at that stage.
ALLOWED_MOVES = {
    "stageD": {
        ("no_gap", "MB"),
        ("CC", "MB"),
        ("MB", "no_gap"),
        ("MB", "CC"),
        ("no_gap", "CC"),
        ("CC", "no_gap"),
    },
    "stageE": {("no_gap", "IE"), ("IE", "no_gap")},
}


@pytest.fixture(scope="module")
def verdicts(examples_dir):
    checker = Checker(
        ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )
    return [v for vs in checker.check(list(iter_traces(examples_dir / "traces.jsonl"))) for v in vs]


def _roundtrip(verdicts):
    return [Verdict.model_validate_json(v.model_dump_json()) for v in verdicts]


def test_relabel_without_options_reproduces_everything(verdicts):
    again = list(relabel(_roundtrip(verdicts)))
    assert [v.model_dump() for v in again] == [v.model_dump() for v in verdicts]


def test_ablate_a_removes_every_stage_a_decision(verdicts):
    out = list(relabel(_roundtrip(verdicts), TreeConfig(ablate="A")))
    assert all(not t.startswith("stageA") for v in out for t in v.path)
    assert all(v.label is not None for v in out)  # the -A NLI calls were stored at check time
    moved = {(v.trace_id, v.step) for v, w in zip(verdicts, out, strict=True) if v.label != w.label}
    assert moved == {("hermes-blade-runner", 1)}


def test_ablate_e_sends_quoteless_conclusions_to_ie(verdicts):
    out = list(relabel(_roundtrip(verdicts), TreeConfig(ablate="E")))
    for old, new in zip(verdicts, out, strict=True):
        if any(t.startswith("stageE") for t in old.path):
            assert new.label == "IE" and new.path[-1].startswith("stageC")
        else:
            assert new.label == old.label


@pytest.mark.parametrize(
    "config",
    [
        TreeConfig(entail_threshold=0.9),
        TreeConfig(entail_threshold=0.3),
        TreeConfig(contradict_threshold=0.3),
        TreeConfig(contradict_threshold=0.95),
    ],
)
def test_threshold_changes_move_labels_only_where_spec_allows(verdicts, config):
    out = list(relabel(_roundtrip(verdicts), config))
    for old, new in zip(verdicts, out, strict=True):
        if old.label == new.label:
            continue
        stage = old.path[-1].split(":")[0]
        assert stage in ALLOWED_MOVES, (old.path, new.path)
        assert (old.label, new.label) in ALLOWED_MOVES[stage]
        assert old.path[:-1] == new.path[:-1]  # stages A-C are untouched


def test_relabel_needs_the_stored_inputs(verdicts):
    bare = [v.model_copy(update={"step_data": None}) for v in verdicts]
    with pytest.raises(RelabelError, match="step_data"):
        list(relabel(bare))


def test_relabel_cli(tmp_path, examples_dir, capsys):
    out = tmp_path / "v.jsonl"
    assert (
        main(
            [
                "check",
                str(examples_dir / "traces.jsonl"),
                "--judge",
                f"replay:{examples_dir / 'judge_replay.jsonl'}",
                "--nli",
                f"replay:{examples_dir / 'nli_replay.jsonl'}",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert main(["relabel", str(out), "-o", str(tmp_path / "r.jsonl")]) == 0
    assert out.read_text() == (tmp_path / "r.jsonl").read_text()
    assert main(["relabel", str(out), "-o", str(tmp_path / "a.jsonl"), "--ablate", "A"]) == 0
    paths = [json.loads(line)["path"] for line in open(tmp_path / "a.jsonl")]
    assert not any(t.startswith("stageA") for p in paths for t in p)
