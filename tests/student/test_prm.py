"""The PRM's reading of a trace and its verdicts (student/prm.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stepgap.schema import LABELS, REPAIRS
from stepgap.student.mining import pool_traces
from stepgap.student.prm import (
    COLUMNS,
    FIRING,
    FIRING_TOKENS,
    IGNORE,
    PRMChecker,
    PRMFormat,
    PRMRunner,
    decide_step,
    step_targets,
)


class FixedLogits(PRMRunner):
    """Logits chosen by the test: `column` high at every position."""

    name = "prm:fixed"

    def __init__(self, columns: dict[int, float]) -> None:
        self.columns = columns

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = np.zeros((*input_ids.shape, COLUMNS), dtype=np.float32)
        for column, value in self.columns.items():
            out[..., column] = value
        return out


def test_every_firing_stage_is_a_path_token_and_gives_a_label():
    from stepgap.tree import PATH_TOKENS

    assert set(FIRING) <= set(PATH_TOKENS)
    assert all(set(labels) <= set(LABELS) for labels in FIRING.values())


def test_the_stage_is_one_that_can_give_the_label():
    logits = np.zeros(COLUMNS, dtype=np.float32)
    logits[LABELS.index("MB")] = 5.0  # the label head says MB
    logits[len(LABELS) + FIRING_TOKENS.index("stageD:entailment")] = 9.0  # stage head: entailed
    label, stage, p_label, _ = decide_step(logits)
    assert (label, stage) == ("MB", "stageD:neutral")
    assert p_label > 0.9


def test_the_teacher_verdicts_train_both_heads(pool):
    targets = [step_targets(v) for v in pool]
    assert all(label != IGNORE and stage != IGNORE for label, stage in targets)
    for v, (label, stage) in zip(pool, targets, strict=True):
        assert LABELS[label] == v.label and FIRING_TOKENS[stage] == v.path[-1]


def test_a_checker_labels_every_step_with_its_repair_and_stage(tiny_prm, pool):
    traces = pool_traces(pool)
    runner = FixedLogits(
        {LABELS.index("IE"): 4.0, len(LABELS) + FIRING_TOKENS.index("stageC:entity_mismatch"): 4.0}
    )
    base = PRMChecker.from_folder(tiny_prm)
    checker = PRMChecker(runner, base.encoder.tokenizer, base.format, batch_size=3)
    verdicts = checker.check(traces)
    assert [len(v) for v in verdicts] == [len(t.steps) for t in traces]
    flat = [v for vs in verdicts for v in vs]
    assert {(v.label, v.repair, tuple(v.path)) for v in flat} == {
        ("IE", REPAIRS["IE"], ("stageC:entity_mismatch",))
    }
    assert all(v.checker["prm"]["spec"] == "prm:fixed" for v in flat)


def test_steps_past_the_window_fail_and_are_never_guessed(tiny_prm, pool):
    traces = pool_traces(pool)
    base = PRMChecker.from_folder(tiny_prm)
    full = base.encoder.encode(traces[0])
    window = full.markers[0] + 1  # the first step's marker is the window's last token
    short = PRMChecker(base.runner, base.encoder.tokenizer, replace(base.format, max_length=window))
    verdicts = short.check([traces[0]])[0]
    assert verdicts[0].label is not None
    for v in verdicts[1:]:
        assert v.label is None and "past the PRM's window" in v.error
        assert f"reads {window}" in v.error


def test_an_unsegmented_trace_is_refused(tiny_prm):
    from stepgap.schema import Trace

    with pytest.raises(ValueError, match="not segmented"):
        PRMChecker.from_folder(tiny_prm).check([Trace(id="t", question="q", response="r")])


def test_the_format_travels_with_the_model(tiny_prm, tmp_path):
    PRMFormat(max_length=128, evidence_tokens=10).write(tmp_path)
    assert PRMFormat.read(tmp_path) == PRMFormat(max_length=128, evidence_tokens=10)
