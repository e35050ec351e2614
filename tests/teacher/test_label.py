"""`stepgap label` at scale: resume after SIGKILL without paying twice, shards, no leaked key."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from stepgap.teacher.label import finished_steps, parse_shard, shard_of

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]


def _label_cmd(server, examples_dir, out, cache, *extra):
    return [
        sys.executable,
        "-m",
        "stepgap.cli",
        "label",
        str(examples_dir / "traces.jsonl"),
        "-o",
        str(out),
        "--judge",
        "openai:gpt-4.1-mini",
        "--base-url",
        server.base_url,
        "--nli",
        f"replay:{examples_dir / 'nli_replay.jsonl'}",
        "--cache",
        str(cache),
        "--no-progress",
        *extra,
    ]


def _cached(cache: Path) -> int:
    if not cache.exists():
        return 0
    try:
        with sqlite3.connect(cache, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_sigkill_half_way_then_rerun_labels_each_step_once_and_never_asks_twice(
    fake_openai, tmp_path, examples_dir
):
    out, cache = tmp_path / "verdicts.jsonl", tmp_path / "cache.sqlite"
    fake_openai.hang_after = 12  # answer 12 prompts, then hang every request
    cmd = _label_cmd(
        fake_openai, examples_dir, out, cache, "--batch-size", "2", "--concurrency", "2"
    )
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while _cached(cache) < 12 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _cached(cache) == 12
    written_before = len(finished_steps(out))
    assert 0 < written_before < 28
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    answered_first_run = set(fake_openai.answered())
    assert len(answered_first_run) == 12

    fake_openai.hang_after = None
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    keys = Counter((v["trace_id"], v["step"]) for v in lines)
    assert len(keys) == 28 and set(keys.values()) == {1}
    assert all(v["error"] is None for v in lines)
    # No prompt answered in the first run was sent again, and none was answered twice.
    first_answer: dict[str, float] = {}
    for e in fake_openai.events:
        assert e.key not in first_answer, f"prompt {e.key} asked again after it was answered"
        if e.answered:
            first_answer[e.key] = e.time
    assert len(first_answer) == 28
    # A third run finds everything done and asks nothing.
    before = len(fake_openai.events)
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and len(fake_openai.events) == before
    assert "10 already done" in again.stderr


def test_shards_partition_the_traces_deterministically(example_traces):
    ids = [t.id for t in example_traces]
    parts = [{i for i in ids if shard_of(i, 3) == k} for k in range(3)]
    assert set().union(*parts) == set(ids) and sum(map(len, parts)) == len(ids)
    assert [shard_of(i, 3) for i in ids] == [shard_of(i, 3) for i in ids]
    assert parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "a/b", "1"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)


def test_sharded_runs_together_label_everything_once(fake_openai, tmp_path, examples_dir):
    cache = tmp_path / "cache.sqlite"
    outs = [tmp_path / f"shard{i}.jsonl" for i in range(2)]
    procs = [
        subprocess.Popen(
            _label_cmd(fake_openai, examples_dir, out, cache, "--shard", f"{i}/2"),
            cwd=REPO,
            stderr=subprocess.PIPE,
        )
        for i, out in enumerate(outs)
    ]  # two processes share one cache file
    assert [p.wait() for p in procs] == [0, 0]
    keys = [k for out in outs for k in finished_steps(out)]
    assert len(keys) == len(set(keys)) == 28
    assert _cached(cache) == 28


def test_limit_takes_the_first_traces(fake_openai, tmp_path, examples_dir):
    out = tmp_path / "v.jsonl"
    cmd = _label_cmd(fake_openai, examples_dir, out, tmp_path / "c.sqlite", "--limit", "2")
    assert subprocess.run(cmd, cwd=REPO, capture_output=True).returncode == 0
    assert {t for t, _ in finished_steps(out)} == {"case1-whitehorse", "case2-kuhn-pertramer"}


def test_canary_api_key_never_reaches_logs_cache_or_verdicts(fake_openai, tmp_path, examples_dir):
    canary = "sk-canary-7f3a9c1e5b2d4680aa11"
    out, cache = tmp_path / "verdicts.jsonl", tmp_path / "cache.sqlite"
    # Faults make the judge log retries and write error text into a verdict.
    keys = list(fake_openai.answers)
    fake_openai.faults[keys[0]] = ["500"] * 10
    fake_openai.faults[keys[1]] = ["invalid_json", "ok"]
    env = {**os.environ, "OPENAI_API_KEY": canary}
    cmd = _label_cmd(
        fake_openai,
        examples_dir,
        out,
        cache,
        "--max-retries",
        "1",
        "--summary",
        str(tmp_path / "s.json"),
    )
    done = subprocess.run(
        [*cmd[:3], "-vv", *cmd[3:]], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    (tmp_path / "stderr.log").write_text(done.stderr + done.stdout)
    assert "HTTP Request" in done.stderr  # debug logging was on
    assert fake_openai.auth_headers and all(
        h == f"Bearer {canary}" for h in fake_openai.auth_headers
    )
    assert any(json.loads(x)["error"] for x in out.read_text().splitlines())
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
