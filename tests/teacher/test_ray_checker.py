"""`stepgap label|check --ray`: Ray Data's actor pool on a local two-node cluster gives the
verdicts one process gives; a killed actor loses nothing; a rerun after a killed labeling run
asks nothing that was written."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from stepgap.cli import main
from stepgap.teacher.label import finished_steps
from tests.fixtures.openai_server import FakeOpenAI

# heavy: actors on a two-node local Ray cluster (`-m "not slow"` skips it locally; CI runs it)
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
VOLATILE = ("created", "seconds", "latency")


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _by_step(path: Path) -> dict[tuple[str, int], dict]:
    return {(v["trace_id"], v["step"]): v for v in _lines(path)}


def _replay(examples_dir: Path) -> list[str]:
    return ["--judge", f"replay:{examples_dir / 'judge_replay.jsonl'}",
            "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}", "--no-progress"]  # fmt: skip


def test_two_actors_give_the_verdicts_of_one_process(ray_cluster, examples_dir, tmp_path):
    traces = str(examples_dir / "traces.jsonl")
    local, pooled = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert main(["check", traces, "-o", str(local), *_replay(examples_dir)]) == 0
    assert main(["check", traces, "-o", str(pooled), *_replay(examples_dir),
                 "--ray", ray_cluster.address, "--ray-actors", "2", "--batch-size", "2"]) == 0  # fmt: skip
    assert list(_by_step(pooled)) == list(_by_step(local))  # `check` keeps the input order
    assert _by_step(pooled) == _by_step(local)
    labelled = tmp_path / "labelled.jsonl"
    assert main(["label", traces, "-o", str(labelled), *_replay(examples_dir),
                 "--ray", ray_cluster.address, "--batch-size", "3"]) == 0  # fmt: skip
    assert _by_step(labelled) == _by_step(local)
    assert len(_lines(labelled)) == 28


def _label(server: FakeOpenAI, examples_dir: Path, out: Path, address: str) -> list[str]:
    return [
        "label", str(examples_dir / "traces.jsonl"), "-o", str(out),
        "--judge", "openai:gpt-4.1-mini", "--base-url", server.base_url, "--no-cache",
        "--concurrency", "1", "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}",
        "--no-progress", "--ray", address, "--ray-actors", "2", "--batch-size", "1",
    ]  # fmt: skip


def _actor_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any("CheckActor" in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_a_killed_actor_loses_no_step(ray_cluster, example_answers, examples_dir, tmp_path):
    server = FakeOpenAI(answers=dict(example_answers), latency=0.15).start()
    out = tmp_path / "verdicts.jsonl"
    codes: list[int] = []
    run = threading.Thread(
        target=lambda: codes.append(main(_label(server, examples_dir, out, ray_cluster.address)))
    )
    try:
        run.start()
        deadline = time.monotonic() + 120
        while (not out.exists() or len(finished_steps(out)) < 4) and time.monotonic() < deadline:
            time.sleep(0.05)
        actors = _actor_processes()
        assert actors and len(finished_steps(out)) < 28, "the run ended before an actor was killed"
        actors[0].send_signal(signal.SIGKILL)
        run.join(timeout=180)
    finally:
        server.stop()
    assert codes == [0]
    keys = Counter((v["trace_id"], v["step"]) for v in _lines(out))
    assert len(keys) == 28 and set(keys.values()) == {1}  # every step, written once
    assert all(v["error"] is None for v in _lines(out))


def test_a_rerun_after_a_killed_run_asks_nothing_that_was_written(
    ray_cluster, example_answers, examples_dir, tmp_path
):
    server = FakeOpenAI(answers=dict(example_answers), hang_after=10).start()
    out = tmp_path / "verdicts.jsonl"
    cmd = [sys.executable, "-m", "stepgap.cli", *_label(server, examples_dir, out,
                                                         ray_cluster.address)]  # fmt: skip
    try:
        proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)
        # killed once the judge has answered its 10 and answered steps are in the file (the
        # judge hangs after 10, so that state holds however long the machine's load makes
        # Ray's start); what is there when it dies is what the rerun must not ask again
        deadline = time.monotonic() + 600
        while len(server.answered()) < 10 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        while not (out.exists() and finished_steps(out)) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        written = finished_steps(out) if out.exists() else set()
        assert 0 < len(written) < 28
        first = len(server.events)
        server.hang_after = None
        server.release.set()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    finally:
        server.stop()
    keys = Counter((v["trace_id"], v["step"]) for v in _lines(out))
    assert len(keys) == 28 and set(keys.values()) == {1}
    # the second run asked once for each step not written, and for none that was
    asked_again = [e for e in server.events[first:] if e.answered]
    assert len(asked_again) == 28 - len(written)
    assert len({e.key for e in asked_again}) == len(asked_again)


def test_check_dataset_takes_the_users_own_dataset_of_raw_traces(ray_cluster, examples_dir):
    """`check_dataset` on `ray.data.read_json` of a traces file (raw responses, the trace
    fields as columns): one verdict row per step, the verdicts of one process."""
    import ray.data

    from stepgap.teacher import CheckerConfig
    from stepgap.teacher.ray_checker import check_dataset

    config = CheckerConfig(judge=f"replay:{examples_dir / 'judge_replay.jsonl'}",
                           nli=f"replay:{examples_dir / 'nli_replay.jsonl'}")  # fmt: skip
    ds = ray.data.read_json(str(examples_dir / "traces.jsonl"))
    rows = check_dataset(ds, config, actors=2, batch_size=3).take_all()
    got = {(r["trace_id"], int(r["step"])): json.loads(r["verdict"]) for r in rows}
    local = {
        (v.trace_id, v.step): v.model_dump(mode="json")
        for vs in config.build().check(_segmented(examples_dir)) for v in vs
    }  # fmt: skip
    assert len(rows) == len(got) == 28
    assert got == local


def _segmented(examples_dir: Path) -> list:
    from stepgap.segment import iter_traces

    return list(iter_traces(examples_dir / "traces.jsonl"))
