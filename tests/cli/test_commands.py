"""The `stepgap` console script: help, segment and check end to end on the shipped examples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepgap.cli import COMMANDS, main
from tests.fixtures import models

# The console script installed next to the interpreter running the tests (CI does not activate
# the virtual environment, so `stepgap` need not be on PATH).
STEPGAP = str(Path(sys.executable).parent / "stepgap")


def test_help_lists_every_command():
    out = subprocess.run([STEPGAP, "--help"], capture_output=True, text=True, check=True).stdout
    for name in COMMANDS:
        assert name in out
    for name in COMMANDS:
        assert subprocess.run([STEPGAP, name, "--help"], capture_output=True).returncode == 0


def test_segment_reports_bad_lines_and_keeps_the_rest(tmp_path, examples_dir, capsys):
    src = tmp_path / "in.jsonl"
    lines = (examples_dir / "traces.jsonl").read_text().splitlines()
    src.write_text("\n".join([lines[0], "{oops", lines[1]]) + "\n")
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    assert main(["segment", str(src), "-o", str(out), "--errors", str(errors)]) == 3  # skipped
    traces = [json.loads(line) for line in out.read_text().splitlines()]
    assert [t["id"] for t in traces] == ["case1-whitehorse", "case2-kuhn-pertramer"]
    assert traces[1]["steps"][3]["answer"] == "no"
    assert traces[0]["data_source"] == "2wikimultihopqa"  # extra keys are kept
    (err,) = [json.loads(line) for line in errors.read_text().splitlines()]
    assert err["line"] == 2 and "invalid JSON" in err["reason"]
    assert f"{src}:2" in capsys.readouterr().err


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    assert main(["segment", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "input file not found" in capsys.readouterr().err


def test_check_with_a_real_tiny_nli_model(tmp_path, examples_dir, tiny_nli):
    out = tmp_path / "verdicts.jsonl"
    rc = main(
        [
            "check",
            str(examples_dir / "traces.jsonl"),
            "--judge",
            f"replay:{examples_dir / 'judge_replay.jsonl'}",
            "--nli",
            str(tiny_nli),
            "--device",
            "cpu",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(verdicts) == 28
    # Judge-decided steps keep their labels; NLI-decided ones carry the model's probabilities.
    by_key = {(v["trace_id"], v["step"]): v for v in verdicts}
    assert by_key[("hermes-blade-runner", 1)]["label"] == "CC"
    d = by_key[("case2-kuhn-pertramer", 3)]
    assert d["path"][-1].startswith("stageD:") and len(d["nli"]) == 1
    probs = d["nli"][0]["probs"]
    assert abs(sum(probs.values()) - 1) < 1e-5
    counts = models.nli_label_counts(verdicts)  # the stand-in's labels vary with the pair
    assert sum(n > 0 for n in counts.values()) >= 2, counts
    print("NLI labels on the examples:", counts)


def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "stepgap.cli", "--version"], capture_output=True, text=True
    )
    assert out.stdout.startswith("stepgap ")
