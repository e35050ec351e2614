"""The progress of the commands that run a model: shown in a log too (stderr that is no
terminal), with `--no-progress` on each, and never printed after `interrupted`."""

from __future__ import annotations

import re

from stepgap.cli import COMMANDS, main
from stepgap.cli.options import ProgressOptions

# The commands that run a judge, a policy or an encoder over many records.
SHOWING_PROGRESS = {"index", "rollouts", "check", "label", "baseline", "repairs", "mine"}


def _replay(examples_dir) -> list[str]:
    return [f"--judge=replay:{examples_dir / 'judge_replay.jsonl'}",
            f"--nli=replay:{examples_dir / 'nli_replay.jsonl'}"]  # fmt: skip


def test_every_command_that_runs_a_model_over_records_takes_no_progress():
    takes = {
        name
        for name, command in COMMANDS.items()
        if any(issubclass(a, ProgressOptions) for a in command.arguments)
    }
    assert takes == SHOWING_PROGRESS


def test_check_in_a_log_shows_its_total_as_it_starts_and_its_last_count(
    tmp_path, examples_dir, capsys
):
    """stderr a log (capsys, as a pipe): `check` says 0/28 before the first step is judged."""
    argv = ["check", str(examples_dir / "traces.jsonl"), *_replay(examples_dir)]
    assert main([*argv, "-o", str(tmp_path / "v.jsonl")]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("check: ")]
    assert re.fullmatch(r"check: 0/28 steps, 00:0\d elapsed", lines[0])
    assert lines[-1].startswith("check: 28/28 steps, ")
    assert main([*argv, "-o", str(tmp_path / "w.jsonl"), "--no-progress"]) == 0
    assert "steps, " not in capsys.readouterr().err


def test_ctrl_c_in_check_prints_the_last_count_before_interrupted(
    tmp_path, examples_dir, capsys, monkeypatch
):
    from stepgap.teacher.checker import Checker

    decide = Checker.decide_judged
    calls = []

    def interrupted_on_the_second_batch(self, judged):
        calls.append(len(judged))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return decide(self, judged)

    monkeypatch.setattr(Checker, "decide_judged", interrupted_on_the_second_batch)
    argv = ["check", str(examples_dir / "traces.jsonl"), *_replay(examples_dir), "--batch-size=3"]
    assert main([*argv, "-o", str(tmp_path / "v.jsonl")]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "stepgap check: interrupted"
    assert re.match(r"check: \d+/28 steps, ", err[-2]), err


def test_baseline_shows_its_progress_unless_no_progress(tmp_path, examples_dir, capsys):
    argv = ["baseline", "flag-everything", str(examples_dir / "traces.jsonl")]
    assert main([*argv, "-o", str(tmp_path / "f.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "flag-everything: 0/28 steps" in err and "flag-everything: 28/28 steps" in err
    assert main([*argv, "-o", str(tmp_path / "g.jsonl"), "--no-progress"]) == 0
    assert "steps, " not in capsys.readouterr().err
