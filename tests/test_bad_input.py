"""Bad input through every command that reads a user's file (RELIABILITY.md).

Each input file is a good file with poison lines inserted: invalid JSON, a JSON value that is
not an object, non-UTF-8 bytes, a wrong type, a missing field. Every poison line is reported on
stderr and in `--errors` as `file:line: field: reason`, every good record is still processed,
and the command exits `SKIPPED` (3), so a pipeline sees that the output lacks them. Extreme but valid records (a 1 MB response, a 10,000-step trace, empty evidence,
unicode, nested tags) are processed, not reported.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepgap.cli import main
from stepgap.cli.options import EXIT_SKIPPED as SKIPPED

LOREM = "lorem ipsum dolor sit amet " * 20  # a Search-R1 snippet is about 100 words
BIG_STEP = (
    "<think>Claim {i}: film {i} was directed by someone.</think><search>director of film {i}</search>"
    "<information>Doc 1(Title: Film {i}) Film {i} is a film. " + LOREM + "</information>"
)
EXTREME = {
    "huge": "<think>" + "a very long thought. " * 50_000 + "</think><answer>Paris</answer>",
    "long": "".join(BIG_STEP.format(i=i) for i in range(9_999)) + "<answer>Paris</answer>",
    "empty-evidence": "<think>look</think><search>x</search><information></information><answer>no</answer>",
    "unicode": "<think>Wer? 物理学者 \u200f\u05e9\u05dc\u05d5\u05dd 🙂\u200b</think><answer>Ünïcode</answer>",
    "nested": "<think>I <search>inner</search> think</think><search>q <think>x</think></search>"
    "<information>Doc 1(Title: <b>T</b>) <information>n</information></information><answer>y</answer>",
}


def _poisoned(path: Path, good_lines: list[str], bad: dict[str, bytes]) -> dict[int, str]:
    """Write good lines with bad ones after the first; returns {line number: poison kind}."""
    lines: list[bytes] = [good_lines[0].encode()]
    where = {}
    for kind, raw in bad.items():
        lines.append(raw)
        where[len(lines)] = kind
    lines += [g.encode() for g in good_lines[1:]]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return where


def _run(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def _assert_reported(err: str, errors_file: Path, path: Path, where: dict[int, str], fields: dict):
    reported = [json.loads(x) for x in errors_file.read_text().splitlines()]
    lines = {r["line"] for r in reported}
    assert set(where) <= lines, (where, reported)
    for line, kind in where.items():
        assert f"{path}:{line}: " in err, (kind, err)
        if kind in fields:
            assert any(r["line"] == line and r["field"] == fields[kind] for r in reported), (
                kind,
                reported,
            )


TRACE_POISON = {
    "invalid": b'{"id": "bad1", "question": "q?", "response": "<think>x',
    "not-object": b"[1, 2, 3]",
    "non-utf8": b'{"id": "bad2", "question": "caf\xe9?", "response": "<answer>x</answer>"}',
    "wrong-type": b'{"id": "bad3", "question": 5, "response": "<answer>x</answer>"}',
    "missing": b'{"id": "bad4", "response": "<answer>x</answer>"}',
    "malformed-tool-call": b'{"id": "bad5", "question": "q?", "response": "<tool_call>{oops</tool_call>"}',
    "no-content": b'{"id": "bad6", "question": "q?"}',
}
TRACE_FIELDS = {
    "wrong-type": "question",
    "missing": "question",
    "malformed-tool-call": "response",
    "no-content": "response",  # neither response nor steps: named as the response missing
}


@pytest.fixture(scope="module")
def poisoned_traces(tmp_path_factory, examples_dir) -> tuple[Path, dict[int, str], list[str]]:
    good = (examples_dir / "traces.jsonl").read_text().splitlines()
    extreme = [
        json.dumps({"id": k, "question": f"{k}?", "golden_answers": ["Paris"], "response": r})
        for k, r in EXTREME.items()
    ]
    path = tmp_path_factory.mktemp("bad") / "traces.jsonl"
    where = _poisoned(path, good + extreme, TRACE_POISON)
    ids = [json.loads(x)["id"] for x in good + extreme]
    return path, where, ids


def test_segment(poisoned_traces, tmp_path, capsys):
    path, where, ids = poisoned_traces
    out, errors = tmp_path / "seg.jsonl", tmp_path / "errors.jsonl"
    rc, err = _run(["segment", str(path), "-o", str(out), "--errors", str(errors)], capsys)
    assert rc == SKIPPED
    _assert_reported(err, errors, path, where, TRACE_FIELDS)
    traces = {json.loads(x)["id"]: json.loads(x) for x in out.read_text().splitlines()}
    assert list(traces) == ids
    assert len(traces["long"]["steps"]) == 10_000
    assert len(traces["huge"]["steps"][0]["claim"]) > 1_000_000
    # an empty block is one snippet with empty text (docs/contract.md, fixed reading)
    assert traces["empty-evidence"]["steps"][0]["evidence"] == [{"title": "", "text": ""}]
    assert "🙂" in traces["unicode"]["steps"][0]["claim"]


@pytest.mark.timeout(150)
def test_check_gives_every_step_of_every_good_trace_a_verdict(
    poisoned_traces, examples_dir, tmp_path, capsys
):
    path, where, ids = poisoned_traces
    out, errors = tmp_path / "v.jsonl", tmp_path / "errors.jsonl"
    rc, err = _run(
        ["check", str(path), "-o", str(out), "--errors", str(errors),
         "--judge", f"replay:{examples_dir / 'judge_replay.jsonl'}",
         "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}"],
        capsys,
    )  # fmt: skip
    assert rc == SKIPPED
    _assert_reported(err, errors, path, where, TRACE_FIELDS)
    verdicts = [json.loads(x) for x in out.read_text().splitlines()]
    by_trace: dict[str, list] = {}
    for v in verdicts:
        by_trace.setdefault(v["trace_id"], []).append(v)
    assert list(by_trace) == ids
    assert len(by_trace["long"]) == 10_000
    # Steps with no stored judge answer get an error verdict, never a label.
    assert all(v["error"] and v["label"] is None for v in by_trace["long"])
    examples = [v for t in ids[:4] for v in by_trace[t]]
    assert all(v["label"] is not None for v in examples)


VERDICT_POISON = {
    "invalid": b'{"trace_id": "case1-whitehorse", "step": 9, "type": "infer',
    "not-object": b'"just a string"',
    "non-utf8": b'{"trace_id": "caf\xe9", "step": 0, "type": "inference", "label": "no_gap", "repair": "none"}',
    "wrong-type": b'{"trace_id": "x", "step": "first", "type": "inference", "label": "no_gap", "repair": "none"}',
    "missing": b'{"step": 0, "type": "inference", "label": "no_gap", "repair": "none"}',
    "bad-label": b'{"trace_id": "x", "step": 0, "type": "inference", "label": "maybe", "repair": "none"}',
}
VERDICT_FIELDS = {"wrong-type": "step", "missing": "trace_id", "bad-label": "label"}


@pytest.fixture
def poisoned_verdicts(tmp_path, examples_dir) -> tuple[Path, dict[int, str], int]:
    good = (examples_dir / "teacher_verdicts.jsonl").read_text().splitlines()
    path = tmp_path / "verdicts.jsonl"
    return path, _poisoned(path, good, VERDICT_POISON), len(good)


def test_reward_over_poisoned_traces_and_verdicts(
    poisoned_traces, poisoned_verdicts, examples_dir, tmp_path, capsys
):
    path, where, _ = poisoned_traces
    vpath, vwhere, _ = poisoned_verdicts
    out, errors = tmp_path / "r.jsonl", tmp_path / "errors.jsonl"
    rc, err = _run(
        ["reward", str(path), "--verdicts", str(vpath), "-o", str(out), "--errors", str(errors)],
        capsys,
    )
    assert rc == SKIPPED
    _assert_reported(err, errors, path, where, TRACE_FIELDS)
    _assert_reported(err, errors, vpath, vwhere, VERDICT_FIELDS)
    rewarded = {json.loads(x)["trace_id"] for x in out.read_text().splitlines()}
    good = (examples_dir / "teacher_verdicts.jsonl").read_text().splitlines()
    assert {json.loads(x)["trace_id"] for x in good} <= rewarded


def test_relabel(poisoned_verdicts, tmp_path, capsys):
    path, where, n = poisoned_verdicts
    out, errors = tmp_path / "r.jsonl", tmp_path / "errors.jsonl"
    rc, err = _run(["relabel", str(path), "-o", str(out), "--errors", str(errors)], capsys)
    assert rc == SKIPPED
    _assert_reported(err, errors, path, where, VERDICT_FIELDS)
    assert len(out.read_text().splitlines()) == n


def test_sft_data(poisoned_verdicts, tmp_path, capsys):
    path, where, n = poisoned_verdicts
    out, errors = tmp_path / "sft", tmp_path / "errors.jsonl"
    rc, err = _run(["sft-data", str(path), "-o", str(out), "--errors", str(errors)], capsys)
    assert rc == SKIPPED
    _assert_reported(err, errors, path, where, VERDICT_FIELDS)
    meta = json.loads((out / "stepgap_sft.json").read_text())
    assert meta["stats"]["examples"] == n


def test_eval_with_poisoned_gold_and_predictions(poisoned_verdicts, examples_dir, tmp_path, capsys):
    path, where, _ = poisoned_verdicts
    gold_good = (examples_dir / "gold_steps.jsonl").read_text().splitlines()
    gold = tmp_path / "gold.jsonl"
    gwhere = _poisoned(gold, gold_good, {
        "invalid": b'{"trace_id": "x", "step": 0, "label"',
        "non-utf8": b'{"trace_id": "\xff", "step": 0, "label": "CC"}',
        "bad-label": b'{"trace_id": "x", "step": 0, "label": "gap"}',
    })  # fmt: skip
    out, errors = tmp_path / "report", tmp_path / "errors.jsonl"
    rc, err = _run(
        ["eval", "--gold", str(gold), "--gold", str(examples_dir / "gold_traces.jsonl"),
         "--pred", f"teacher={path}", "-o", str(out), "--no-plots", "--resamples", "50",
         "--errors", str(errors)],
        capsys,
    )  # fmt: skip
    assert rc == SKIPPED
    _assert_reported(err, errors, path, where, VERDICT_FIELDS)
    _assert_reported(err, errors, gold, gwhere, {"bad-label": "label"})
    report = json.loads((out / "report.json").read_text())
    assert report["n_steps"] == len(gold_good)
    assert report["checkers"]["teacher"]["missing_steps"] == 0
