"""bench/feedback_latency.py runs as shipped (a few short rollouts here): its report has every
mode side by side, the notes that reached a turn are a share of the searches' gap steps, a mode
without feedback waits for nothing, and the rewards with notes equal those without."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_bench_reports_each_mode_side_by_side(tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/feedback_latency.py", "--rollouts", "6", "--turn-s", "0.05",
         "--judge-ms", "50", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "feedback_latency.json").read_text())
    runs = report["runs"]
    assert list(runs) == ["off", "wait_0", "wait_judge", "wait_2judge", "wait_queue"]
    assert report["rewards_equal_with_and_without_notes"] is True
    gaps = runs["off"]["gap_steps"]
    assert gaps > 0 and all(r["gap_steps"] == gaps for r in runs.values())
    assert runs["off"]["gap_notes_reached"] == 0 and runs["off"]["wait_per_turn_s"]["mean"] == 0
    assert all(0 <= r["gap_notes_reached"] <= gaps for r in runs.values())
    assert "rewards equal with and without notes: True" in done.stdout
