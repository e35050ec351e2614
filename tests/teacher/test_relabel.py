"""Re-deciding stored verdicts: identity, ablations, threshold moves, no model calls."""

from __future__ import annotations

import json

import pytest

from stepgap.cli import main
from stepgap.schema import Verdict
from stepgap.segment import iter_traces
from stepgap.teacher import Checker, RelabelError, ReplayJudge, ReplayNLI, relabel
from stepgap.tree import TreeConfig, nli_label

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


# Which stored steps move under each threshold, worked out from the stored NLI probabilities
# of the replayed examples: at entailment 0.9 the quotes (stage D) and snippets (stage E)
# entailed at 0.5..0.9 stop entailing; at contradiction 0.95 the one contradiction found at
# 0.5..0.95 becomes a missing bridge; at 0.3 nothing crosses (or it crosses where another
# premise already decided the step).
EXPECTED_MOVES = {
    (0.9, 0.5): {
        ("case2-kuhn-pertramer", 0, "no_gap", "MB"),
        ("case4-whiplash", 1, "no_gap", "MB"),
        ("case4-whiplash", 2, "no_gap", "IE"),
        ("cc-merkel-abstention", 1, "no_gap", "MB"),
        ("e-rashomon", 1, "no_gap", "MB"),
        ("e-rashomon", 2, "no_gap", "IE"),
        ("nogap-tchaikovsky-abstention", 1, "no_gap", "MB"),
    },
    (0.3, 0.5): set(),
    (0.5, 0.3): set(),
    (0.5, 0.95): {("hermes-blade-runner", 2, "CC", "MB")},
}


@pytest.mark.parametrize("thresholds", sorted(EXPECTED_MOVES))
def test_threshold_changes_move_exactly_the_labels_whose_nli_call_crosses(verdicts, thresholds):
    entail, contradict = thresholds
    config = TreeConfig(entail_threshold=entail, contradict_threshold=contradict)
    out = list(relabel(_roundtrip(verdicts), config))
    moved = {
        (old.trace_id, old.step, old.label, new.label)
        for old, new in zip(verdicts, out, strict=True)
        if old.label != new.label
    }
    assert moved == EXPECTED_MOVES[thresholds]
    crossed = {  # steps with a stored NLI call whose label the new thresholds change
        (v.trace_id, v.step)
        for v in verdicts
        if any(nli_label(c.probs, entail, contradict) != c.label for c in v.nli)
    }
    assert {(t, s) for t, s, _, _ in moved} <= crossed
    for old, new in zip(verdicts, out, strict=True):
        if old.label != new.label:
            stage = old.path[-1].split(":")[0]
            assert (old.label, new.label) in ALLOWED_MOVES[stage], (old.path, new.path)
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


@pytest.mark.parametrize("hypothesis", ["answer_statement", "answer", "claim"])
def test_a_check_under_any_tree_option_is_reproduced_by_relabel_without_options(
    hypothesis, examples_dir, tiny_nli, tmp_path
):
    """`check --hypothesis MODE` (and thresholds, an ablation) then `relabel` with no option:
    the same verdicts, because each records the config that decided it. (Before it did, a
    check under `--hypothesis answer` came back relabelled under the default mode, and every
    conclusion step whose hypothesis changed came back as "NLI stage failed".)"""
    traces = examples_dir / "traces.jsonl"
    checked, again = tmp_path / "checked.jsonl", tmp_path / "again.jsonl"
    options = [f"--hypothesis={hypothesis}", "--entail-threshold=0.4", "--ablate=E"]
    assert main(["check", str(traces), f"--judge=replay:{examples_dir / 'judge_replay.jsonl'}",
                 f"--nli={tiny_nli}", "--device=cpu", *options, "-o", str(checked)]) == 0  # fmt: skip
    assert main(["relabel", str(checked), "-o", str(again)]) == 0
    before = [json.loads(x) for x in checked.read_text().splitlines()]
    after = [json.loads(x) for x in again.read_text().splitlines()]
    assert after == before
    assert all(v["tree"]["hypothesis"] == hypothesis and v["error"] is None for v in after)
    assert {v["tree"]["entail_threshold"] for v in after} == {0.4}
    # an option given to relabel changes that option only
    assert main(["relabel", str(checked), "--ablate=A", "-o", str(again)]) == 0
    moved = [json.loads(x)["tree"] for x in again.read_text().splitlines()]
    assert all(t == {**v["tree"], "ablate": "A"} for t, v in zip(moved, before, strict=True))
