"""The TRL example: two GRPO steps on CPU with the stepgap reward wired in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_example_runs_two_steps_with_the_reward(tiny_qwen2, tiny_nli, tmp_path):
    out = tmp_path / "grpo"
    cmd = [
        sys.executable, str(REPO / "examples" / "grpo_trl.py"), "--model", str(tiny_qwen2),
        "--judge", f"hf:{tiny_qwen2}", "--judge-max-string-chars", "8", "--nli", str(tiny_nli),
        "--steps", "2", "--max-completion-length", "16", "--output", str(out), "--cpu",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    history = json.loads((out / "log_history.json").read_text())
    steps = [row for row in history if "rewards/stepgap_typed_shape/mean" in row]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        # Random completions: no correct answer, so the reward is the step term alone, in the
        # SPEC range per step; the logged per-label rates came through log_metric.
        assert -0.25 * 16 <= row["rewards/stepgap_typed_shape/mean"] <= 0.35 * 16
        assert "stepgap/rate_IE" in row and "stepgap/em" in row
