"""`stepgap label` at scale: resume after SIGKILL without paying twice, shards, no leaked key."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stepgap.teacher.label import drop_superseded, finished_steps, parse_shard, shard_of
from tests.fixtures.openai_server import FakeOpenAI

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
    """Each trace in exactly one shard, and the same one in every process: machines of one
    sharded run start Python with different string-hash seeds, so `hash()` would split the
    traces differently on each (losing some and labelling others twice)."""
    ids = [t.id for t in example_traces]
    parts = [{i for i in ids if shard_of(i, 3) == k} for k in range(3)]
    assert set().union(*parts) == set(ids) and sum(map(len, parts)) == len(ids)
    assert all(parts), parts  # the ten example traces fall in all three shards
    code = (
        "import json, sys; from stepgap.teacher.label import shard_of; "
        "print(json.dumps([shard_of(i, 3) for i in json.loads(sys.argv[1])]))"
    )
    seen = []
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps(ids)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        seen.append(json.loads(done.stdout))
    assert seen[0] == seen[1] == [shard_of(i, 3) for i in ids]
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
    codes = [p.wait() for p in procs]
    assert codes == [0, 0], [p.stderr.read().decode()[-2000:] for p in procs]
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


def test_a_server_that_fails_every_request_stops_after_three_and_exits_non_zero(
    fake_openai, tmp_path, examples_dir
):
    """No 7 retries x 28 steps of the same 500: one request at a time until one works; three
    identical failures stop the run (exit 2) with the server's error in one line."""
    out, cache = tmp_path / "v.jsonl", tmp_path / "c.sqlite"
    fake_openai.always = "500"
    cmd = _label_cmd(fake_openai, examples_dir, out, cache, "--max-retries", "1")
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "failed its first 3 requests the same way" in done.stderr and "boom" in done.stderr
    assert "Traceback" not in done.stderr
    # The first step also probes the response formats (a 500 may be a refusal of json_schema,
    # as llama-cpp-python's is): 3 formats x (1 try + 1 retry); then 2 steps x 2, not 28 x 2.
    assert fake_openai.formats_seen[:6] == ["json_schema"] * 2 + ["json_object"] * 2 + ["none"] * 2
    assert len(fake_openai.events) == 3 * 2 + 2 * 2


def test_a_rerun_asks_the_failed_steps_again_and_leaves_one_line_per_step(
    fake_openai, tmp_path, examples_dir, example_prompts
):
    out, cache = tmp_path / "v.jsonl", tmp_path / "c.sqlite"
    last = list(dict.fromkeys(t for t, _ in example_prompts))[-1]
    lost = {key for (t, _), key in example_prompts.items() if t == last}
    answers = dict(fake_openai.answers)
    for key in lost:  # the server cannot answer the last trace's steps (a 400 each)
        del fake_openai.answers[key]
    cmd = _label_cmd(fake_openai, examples_dir, out, cache)
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert f"{len(lost)} failed (most often, {len(lost)}x: judge API error" in first.stderr
    fake_openai.answers = answers  # the server is back
    before = len(fake_openai.events)
    rerun = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(lost)} failed step(s) asked again" in rerun.stderr
    assert len(fake_openai.events) - before == len(lost)  # only the failed steps were asked
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 28 and all(v["label"] is not None for v in lines)
    assert len({(v["trace_id"], v["step"]) for v in lines}) == 28


def test_every_step_failed_is_exit_1_and_keep_errors_skips_failed_steps(tmp_path, examples_dir):
    empty = tmp_path / "other_replay.jsonl"
    first = json.loads((examples_dir / "judge_replay.jsonl").read_text().splitlines()[0])
    empty.write_text(json.dumps({**first, "trace_id": "another trace"}) + "\n")  # none of these
    cmd = [sys.executable, "-m", "stepgap.cli", "label", str(examples_dir / "traces.jsonl"),
           "-o", str(tmp_path / "r.jsonl"), "--judge", f"replay:{empty}",
           "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}", "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1
    assert "every step failed (28 of 28, the most common reason above)" in done.stderr
    assert done.stderr.count("no stored judge output") == 1  # said once, in the counts line
    again = subprocess.run([*cmd, "--keep-errors"], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and "10 already done" in again.stderr
    retried = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert retried.returncode == 1 and "28 failed step(s) asked again" in retried.stderr
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 28


def _replay_shards(examples_dir, tmp_path, shards: int) -> list[Path]:
    from stepgap.teacher import build_checker
    from stepgap.teacher.label import label_file

    checker = build_checker(
        judge=f"replay:{examples_dir / 'judge_replay.jsonl'}",
        nli=f"replay:{examples_dir / 'nli_replay.jsonl'}",
    )
    outs = []
    for i in range(shards):
        out = tmp_path / f"shard{i}.jsonl"
        label_file(examples_dir / "traces.jsonl", checker, out, shard=(i, shards), progress=False)
        outs.append(out)
    return outs


def test_merge_joins_shards_in_the_traces_order(tmp_path, examples_dir, capsys):
    from stepgap.cli import main

    shards = _replay_shards(examples_dir, tmp_path, 3)
    assert all(len(s.read_text().splitlines()) < 28 for s in shards)
    traces = examples_dir / "traces.jsonl"
    out = tmp_path / "all.jsonl"
    assert main(["merge", *map(str, shards), "--traces", str(traces), "-o", str(out)]) == 0
    merged = [json.loads(x) for x in out.read_text().splitlines()]
    ids = [json.loads(x)["id"] for x in traces.read_text().splitlines()]
    order = sorted(merged, key=lambda v: (ids.index(v["trace_id"]), v["step"]))
    assert merged == order and len(merged) == 28
    expected = [json.loads(x) for x in (examples_dir / "teacher_verdicts.jsonl").open()]
    assert [(v["trace_id"], v["step"], v["label"]) for v in merged] == [
        (v["trace_id"], v["step"], v["label"])
        for v in sorted(expected, key=lambda v: (ids.index(v["trace_id"]), v["step"]))
    ]
    assert "28 verdicts" in capsys.readouterr().err


def test_merge_refuses_duplicates_and_gaps_and_writes_nothing(tmp_path, examples_dir, capsys):
    from stepgap.cli import main

    shards = _replay_shards(examples_dir, tmp_path, 2)
    traces = examples_dir / "traces.jsonl"
    out = tmp_path / "all.jsonl"
    # the same file given twice is named as such, not as each of its steps twice
    assert main(["merge", str(shards[0]), str(shards[0]), str(shards[1]), "-o", str(out)]) == 2
    assert f"{shards[0]} is given twice" in capsys.readouterr().err and not out.exists()
    # a copy of a shard: every one of its steps is a duplicate, named with both places
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(shards[0].read_bytes())
    assert main(["merge", str(shards[0]), str(copy), str(shards[1]), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    first = json.loads(shards[0].read_text().splitlines()[0])
    assert (
        f"trace {first['trace_id']!r} step {first['step']} is in {shards[0]}:1 and again in {copy}:1"
        in err
    )
    assert "nothing written" in err and not out.exists()
    # a step dropped from the middle of a trace: a gap, even without the traces file
    lines = shards[1].read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    longer = {r["trace_id"] for r in rows if r["step"] == 2}
    gone = next(i for i, r in enumerate(rows) if r["step"] == 1 and r["trace_id"] in longer)
    victim = json.loads(lines[gone])
    holed = tmp_path / "holed.jsonl"
    holed.write_text("".join(x + "\n" for i, x in enumerate(lines) if i != gone))
    assert main(["merge", str(shards[0]), str(holed), "-o", str(out)]) == 2
    assert f"trace {victim['trace_id']!r} is missing step(s) 1" in capsys.readouterr().err
    assert not out.exists()
    # a whole shard missing: only the traces file can tell
    assert main(["merge", str(shards[0]), "-o", str(out)]) == 0
    out.unlink()
    assert main(["merge", str(shards[0]), "--traces", str(traces), "-o", str(out)]) == 2
    assert "has no verdicts in any input" in capsys.readouterr().err and not out.exists()


@dataclass
class _TimedOpenAI(FakeOpenAI):
    """The fake server with a delay per request (varied, so answers do not arrive in lockstep)
    that records how many requests are open after every arrival and departure, and how many
    verdict lines `watch` held when each request arrived."""

    delays: tuple[float, ...] = (0.3, 0.5, 0.4, 0.6)
    watch: Path | None = None
    open_now: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (time, open requests)
    written_at_arrival: list[int] = field(default_factory=list)
    counter: threading.Lock = field(default_factory=threading.Lock)

    def _handle(self, h) -> None:
        with self.counter:
            delay = self.delays[len(self.written_at_arrival) % len(self.delays)]
            lines = self.watch.read_text().count("\n") if self.watch and self.watch.exists() else 0
            self.written_at_arrival.append(lines)
            self.open_now += 1
            self.timeline.append((time.monotonic(), self.open_now))
        try:
            time.sleep(delay)
            super()._handle(h)
        finally:
            with self.counter:
                self.open_now -= 1
                self.timeline.append((time.monotonic(), self.open_now))


def _openai_checker(server, examples_dir, concurrency: int):
    from stepgap.teacher import build_checker

    return build_checker(
        judge="openai:gpt-4.1-mini",
        nli=f"replay:{examples_dir / 'nli_replay.jsonl'}",
        judge_options={
            "base_url": server.base_url,
            "concurrency": concurrency,
            "no_cache": True,
            "no_logprobs": True,  # less client CPU per answer: a busy machine starves it less
        },
    )


def test_label_streams_requests_across_traces_without_a_barrier(
    example_answers, tmp_path, examples_dir
):
    """At concurrency 4 with 2 traces per NLI batch, requests stay in flight across trace (and
    batch) boundaries until the last one is sent: the judge never waits for a batch to finish.
    Each trace is written as soon as its answers are in, and the verdicts are the sequential
    run's, line for line (in the order traces finished, each trace's steps together)."""
    from stepgap.teacher.label import label_file

    concurrency = 4
    server = _TimedOpenAI(answers=dict(example_answers)).start()
    try:
        out = tmp_path / "streamed.jsonl"
        server.watch = out
        checker = _openai_checker(server, examples_dir, concurrency)
        summary = label_file(
            examples_dir / "traces.jsonl", checker, out, batch_size=2, progress=False
        )
        assert summary.verdicts == 28 and summary.errors == 0
        assert checker.judge.on_result is None  # the stream's hook is gone again
        timeline = list(server.timeline)
        server.delays = (0.0,)
        sequential = tmp_path / "sequential.jsonl"
        label_file(
            examples_dir / "traces.jsonl",
            _openai_checker(server, examples_dir, 1),
            sequential,
            progress=False,
        )
    finally:
        server.stop()

    # The first request goes alone (the judge's probe); from its answer until the last request
    # is sent, work remains, and requests must stay open all along.
    arrivals = [
        t for (t, n), (_, before) in zip(timeline[1:], timeline, strict=False) if n > before
    ]
    first_answer = next(t for t, n in timeline if n == 0)
    window = [(t, n) for t, n in timeline if first_answer <= t < arrivals[-1]]
    # A barrier empties the server at each of the 4 boundaries between batches of 2 traces;
    # one moment at 0 is tolerated: a busy 2-core machine can starve the client that long.
    stalls = sum(n == 0 for _, n in window[1:])
    assert stalls <= 1, f"no request open {stalls} times while work remained: a barrier"
    busy = sum(n * (t2 - t1) for (t1, n), (t2, _) in zip(window, window[1:], strict=False))
    mean = busy / (window[-1][0] - window[0][0])
    assert mean >= 0.6 * concurrency, f"{mean:.2f} requests open on average, want ~{concurrency}"
    assert server.written_at_arrival[-1] > 0  # early traces were on disk before the last ask

    streamed_lines = out.read_text().splitlines()
    assert sorted(streamed_lines) == sorted(sequential.read_text().splitlines())
    order = [(json.loads(x)["trace_id"], json.loads(x)["step"]) for x in streamed_lines]
    traces = list(dict.fromkeys(t for t, _ in order))
    assert order == [(t, s) for t in traces for s, _ in enumerate(x for x in order if x[0] == t)]


def test_check_stream_gives_every_trace_once_with_the_batch_checks_verdicts(
    example_traces, examples_dir
):
    """Over several judge calls and NLI batches, a trace with no steps included, every trace
    comes out once with the verdicts `check` gives it."""
    from stepgap.teacher import build_checker

    checker = build_checker(
        judge=f"replay:{examples_dir / 'judge_replay.jsonl'}",
        nli=f"replay:{examples_dir / 'nli_replay.jsonl'}",
    )
    empty = example_traces[0].model_copy(update={"id": "no-steps", "steps": []})
    traces = [*example_traces[:4], empty, *example_traces[4:]]
    streamed = list(checker.check_stream(traces, batch_size=3, chunk_requests=5))
    assert sorted(t.id for t, _ in streamed) == sorted(t.id for t in traces)
    expected = {t.id: vs for t, vs in zip(traces, checker.check(traces), strict=True)}
    assert {t.id: [v.model_dump() for v in vs] for t, vs in streamed} == {
        k: [v.model_dump() for v in vs] for k, vs in expected.items()
    }


def test_a_rerun_that_fails_leaves_the_failed_verdicts_it_was_to_ask_again(tmp_path, examples_dir):
    """A resume that ends in an input error (exit 2) leaves its output as it was: the failed
    verdicts it was asking again are replaced only by their new verdicts, never dropped first."""
    from stepgap.cli import main

    replay = (examples_dir / "judge_replay.jsonl").read_text().splitlines()
    last = json.loads(replay[-1])["trace_id"]
    partial = tmp_path / "partial_replay.jsonl"
    partial.write_text("".join(x + "\n" for x in replay if json.loads(x)["trace_id"] != last))
    nli = f"--nli=replay:{examples_dir / 'nli_replay.jsonl'}"
    out = tmp_path / "v.jsonl"
    cmd = ["label", str(examples_dir / "traces.jsonl"), "-o", str(out), "--no-progress"]
    assert main([*cmd, f"--judge=replay:{partial}", nli]) == 0
    before = out.read_bytes()
    failed = [v for v in map(json.loads, before.splitlines()) if v["label"] is None]
    assert failed and {v["trace_id"] for v in failed} == {last}
    unrelated = tmp_path / "nli_other.jsonl"
    stored = json.loads((examples_dir / "nli_replay.jsonl").read_text().splitlines()[0])
    unrelated.write_text(json.dumps({**stored, "premise": "another premise"}) + "\n")
    judge = f"--judge=replay:{examples_dir / 'judge_replay.jsonl'}"
    assert main([*cmd, judge, f"--nli=replay:{unrelated}"]) == 2
    assert out.read_bytes() == before
    assert main([*cmd, judge, nli]) == 0  # and a rerun that works replaces them, once each
    after = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(after) == 28 and all(v["label"] is not None for v in after)
    assert len({(v["trace_id"], v["step"]) for v in after}) == 28


class _HeldJudge:
    """A judge whose second call holds until the stream stops it, then takes a moment to end."""

    def __init__(self, inner) -> None:
        self.inner, self.calls, self.ended = inner, 0, threading.Event()
        self.on_result = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def judge(self, requests, *, stop=None):
        self.calls += 1
        if self.calls == 1:
            return self.inner.judge(requests)
        stop.wait()
        time.sleep(0.3)  # the judge's own way out of a call, as a native decode loop has
        self.ended.set()
        from stepgap.teacher.judges.base import JudgeStopped

        raise JudgeStopped("stopped")


def test_an_error_in_the_stream_ends_its_judge_call_before_it_is_raised(examples_dir):
    """A thread left inside a judge call (torch's decode loop, say) as the process exits aborts
    it (`terminate called without an active exception`): the error waits for the call to end."""
    from stepgap.segment import iter_traces
    from stepgap.teacher import build_checker

    checker = build_checker(
        judge=f"replay:{examples_dir / 'judge_replay.jsonl'}",
        nli=f"replay:{examples_dir / 'nli_replay.jsonl'}",
    )
    held = _HeldJudge(checker.judge)
    checker.judge = held

    def decide(judged):
        raise ValueError("an NLI replay without this answer")

    checker.decide_judged = decide
    traces = list(iter_traces(examples_dir / "traces.jsonl"))
    with pytest.raises(ValueError, match="without this answer"):
        for _ in checker.check_stream(traces, batch_size=1, chunk_requests=1):
            pass
    assert held.ended.is_set()
    assert not any(t.name == "stepgap-judge-stream" for t in threading.enumerate())


def test_superseded_verdicts_go_and_every_other_line_stays_byte_for_byte(tmp_path):
    """The old line of a step asked again goes, once its new line is written; a file with none
    is not rewritten; a quote holding U+2028 (a line break to `str.splitlines`, not to JSON
    Lines) stays one line."""

    def line(step, label, quote=""):
        return json.dumps({"trace_id": "t", "step": step, "label": label, "q": quote},
                          ensure_ascii=False) + "\n"  # fmt: skip

    out = tmp_path / "v.jsonl"
    out.write_text(line(0, "CC", "a\u2028b") + line(1, None), encoding="utf-8")
    inode = out.stat().st_ino
    assert drop_superseded(out) == 0 and out.stat().st_ino == inode  # not rewritten
    out.write_text(out.read_text(encoding="utf-8") + line(1, "MB"), encoding="utf-8")
    assert drop_superseded(out) == 1
    assert out.read_text(encoding="utf-8") == line(0, "CC", "a\u2028b") + line(1, "MB")
