"""`stepgap serve` under a slow judge: checker calls in flight at once, each trace answered when
its own steps are in, deadlines (503 before the client would time out, dropped work), admission
by the measured pace, and a bounded SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from stepgap.serving import StepGapReward
from stepgap.serving.server import create_app
from stepgap.teacher import Checker, ReplayNLI, build_judge
from tests.fixtures.live_server import LiveServer, ServeProcess, _free_port
from tests.serving.conftest import chat_prompt

pytestmark = pytest.mark.timeout(180)


def slow_reward(fake_openai, examples_dir, *, concurrency: int = 8) -> StepGapReward:
    judge = build_judge(
        "openai:gpt-4.1-mini",
        base_url=fake_openai.base_url,
        max_retries=0,
        concurrency=concurrency,
        no_cache=True,
    )
    return StepGapReward(Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl")))


def _body(t) -> dict:
    return {
        "responses": [t.response],
        "questions": [t.question],
        "golden_answers": [t.golden_answers],
    }


def _metric(metrics: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)", metrics, re.M)
    return float(found.group(1)) if found else 0.0


def _until(condition, what: str, seconds: float = 60.0) -> None:
    """Wait until `condition()` holds (a generous limit for a loaded machine, not a bound)."""
    give_up = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < give_up, what
        time.sleep(0.01)


def test_a_trace_is_answered_when_its_own_steps_are_in_not_its_batchs(
    fake_openai, examples_dir, example_traces, expected_rewards, example_prompts
):
    """Two traces in one checker call; the judge holds its answers for one of them until the
    test opens its gate. The other's reward comes back while they are held (a batch used to
    wait for its slowest)."""
    slow, fast = example_traces[1], example_traces[0]
    for step in slow.steps:
        fake_openai.faults[example_prompts[(slow.id, step.index)]] = ["gated"]
    reward = slow_reward(fake_openai, examples_dir)
    reward.checker.judge.working = True  # no serial first request: both traces start at once
    app = create_app(reward, max_batch=16, max_wait_ms=300, max_inflight=1)
    with LiveServer(app) as url:

        def post(t) -> float:
            r = httpx.post(f"{url}/reward", json=_body(t), timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["rewards"][0]

        with ThreadPoolExecutor(2) as pool:
            slow_f, fast_f = pool.submit(post, slow), pool.submit(post, fast)
            fast_r = fast_f.result(timeout=120)  # while the slow trace's answers are held
            assert not slow_f.done() and not fake_openai.gate.is_set()
            fake_openai.gate.set()
            slow_r = slow_f.result(timeout=120)
        metrics = httpx.get(f"{url}/metrics").text
    assert _metric(metrics, "stepgap_batch_size_count") == 1  # one call held both traces
    assert slow_r == pytest.approx(expected_rewards[slow.id])
    assert fast_r == pytest.approx(expected_rewards[fast.id])


def test_several_checker_calls_are_in_flight_at_once(
    fake_openai, examples_dir, example_traces, expected_rewards
):
    """One trace per call (max_batch 1) and four calls at once: the judge server holds every
    answer until all four traces have requests open at once, which one call at a time (one
    trace's requests, then the next trace's) could never do."""
    fake_openai.always = "gated"
    reward = slow_reward(fake_openai, examples_dir)
    reward.checker.judge.working = True  # no serial first request
    traces = example_traces[:4]
    steps = sum(len(t.steps) for t in traces)
    app = create_app(reward, max_batch=1, max_wait_ms=1, max_inflight=4)
    with LiveServer(app) as url:
        with ThreadPoolExecutor(4) as pool:
            answers = pool.map(
                lambda t: httpx.post(f"{url}/reward", json=_body(t), timeout=120), traces
            )
            _until(lambda: len(fake_openai.events) == steps, "not every step was asked at once")
            fake_openai.gate.set()
            answers = list(answers)
    assert [a.json()["rewards"][0] for a in answers] == pytest.approx(
        [expected_rewards[t.id] for t in traces]
    )
    assert len(fake_openai.events) == steps


@pytest.mark.realtime
def test_a_request_past_its_deadline_gets_503_in_time_and_its_work_is_dropped(
    fake_openai, examples_dir, example_traces
):
    """A judge slower than the client's own deadline (X-Stepgap-Timeout: 6 s): the client gets
    a 503 with Retry-After before it would have timed out (the server answers at 4.8 s, 1.2 s
    ahead), and with no time kept for a retry (`keep_for_retry=0`) the judge's request is
    closed and the trace's other steps are never sent. Real time, end to end: the deadline
    logic itself is `test_batching.py`'s, the keeping for a retry `test_work.py`'s."""
    fake_openai.latency = 8.0
    reward = slow_reward(fake_openai, examples_dir)
    t = example_traces[1]  # four steps
    app = create_app(reward, max_batch=4, max_wait_ms=1, keep_for_retry=0)
    with LiveServer(app) as url:
        start = time.monotonic()
        r = httpx.post(
            f"{url}/reward", json=_body(t), headers={"X-Stepgap-Timeout": "6"}, timeout=30
        )
        took = time.monotonic() - start
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert "not checked within" in r.json()["detail"]
        assert took < 6  # the client's own timeout never fires
        # its judge request is closed: the call ends there
        _until(lambda: httpx.get(f"{url}/health").json()["in_flight"] == 0, "the call went on")
        metrics = httpx.get(f"{url}/metrics").text
        assert _metric(metrics, 'stepgap_rejected_total{reason="deadline"}') == 1
        assert _metric(metrics, 'stepgap_traces_dropped_total{reason="deadline"}') == 1
    # the judge's first request goes alone until one has worked: the other 3 were never sent
    assert len(fake_openai.events) == 1 < len(t.steps)
    with LiveServer(create_app(reward)) as url:  # a bad header is the client's error, not a 500
        r = httpx.post(f"{url}/reward", json=_body(t), headers={"X-Stepgap-Timeout": "soon"})
        assert r.status_code == 422 and "X-Stepgap-Timeout" in r.text


def test_openrlhf_client_with_a_low_timeout_gets_every_reward(
    fake_openai, examples_dir, example_traces, expected_rewards, monkeypatch
):
    """OpenRLHF 0.11.2's own client (`SingleTurnAgentExecutor`, one request per rollout, 5 tries
    1 s apart) with its fixed 180 s cut to 10 s, against a judge that makes one checker batch
    of 16 traces take about 22 s: each trace is answered as soon as it is in, and what cannot
    be in time is answered 503 before the client's timeout (2 s before: room for a loaded
    machine, where this client and the server share one process), so its retry lands. Every
    reward comes back, and the server never saw a client give up."""
    agent = pytest.importorskip("openrlhf.utils.agent", reason="the interop extra")
    real_timeout = agent.aiohttp.ClientTimeout
    monkeypatch.setattr(
        agent.aiohttp, "ClientTimeout", lambda total=None, **_: real_timeout(total=10)
    )
    fake_openai.latency = 1.2
    reward = slow_reward(fake_openai, examples_dir, concurrency=4)
    rollouts = [example_traces[i % len(example_traces)] for i in range(24)]
    # one checker call at a time (as with a model in the server's process): the 24 rollouts
    # make a call of 16 traces, about 22 s of judging, and 8 more wait behind it
    app = create_app(reward, max_batch=16, max_wait_ms=50, max_inflight=1, client_timeout=10)
    with LiveServer(app) as url:
        client = agent.SingleTurnAgentExecutor(f"{url}/get_reward")

        async def rollout(t):
            prompt = chat_prompt(t.question)
            (answer,) = await client._fetch_rewards_via_http(
                [prompt + t.response], [prompt], [t.golden_answers]
            )
            return answer["rewards"][0]

        async def run():
            return await asyncio.gather(*(rollout(t) for t in rollouts))

        got = asyncio.run(run())
        metrics = httpx.get(f"{url}/metrics").text
    assert got == pytest.approx([expected_rewards[t.id] for t in rollouts])
    assert _metric(metrics, 'stepgap_rejected_total{reason="client_gone"}') == 0
    # a 16-trace batch outlasts the client's timeout: some answers had to be 503s and retries
    refused = sum(
        _metric(metrics, f'stepgap_rejected_total{{reason="{r}"}}')
        for r in ("deadline", "overloaded")
    )
    assert refused > 0


@pytest.mark.realtime
def test_sigterm_answers_what_is_queued_and_exits_within_the_grace_period(
    fake_openai, examples_dir, example_traces, tmp_path
):
    """`stepgap serve --grace 3` with a judge that takes 2 s per request and 40 rollouts queued:
    SIGTERM answers every request (rewards or 503 + Retry-After) and the process is gone within
    the grace period and a little; the old server kept checking for minutes."""
    fake_openai.latency = 2.0
    with ServeProcess(
        fake_openai, examples_dir, tmp_path / "serve.log", "--grace", "3", "--max-batch", "4",
        "--concurrency", "2",
    ) as server:  # fmt: skip
        statuses: list[object] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            t = example_traces[k % len(example_traces)]
            try:
                r = httpx.post(f"{server.url}/reward", json=_body(t), timeout=60)
                status: object = (r.status_code, r.headers.get("Retry-After"))
            except httpx.ConnectError:  # came after the server stopped taking requests
                status = "refused"
            with lock:
                statuses.append(status)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(40)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        # every request read by the server (a connection still in the kernel's backlog when
        # the listening socket closes is reset, never read: no answer could be owed to it),
        # and a checker call under way
        while (
            _metric(
                httpx.get(f"{server.url}/metrics").text, 'stepgap_requests_total{route="reward"}'
            )
            < 40
            or httpx.get(f"{server.url}/health").json()["in_flight"] == 0
        ):
            assert time.monotonic() < deadline, "the requests did not all arrive"
            time.sleep(0.1)
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=30)
        took = time.monotonic() - start
        for th in threads:
            th.join(timeout=30)
    assert took < 3 + 4, f"exit took {took:.1f} s"
    assert len(statuses) == 40
    assert all(s in ((200, None), (503, "1"), "refused") for s in statuses), sorted(
        map(str, statuses)
    )
    assert (503, "1") in statuses  # the queued ones were not checked for nobody
    log = (tmp_path / "serve.log").read_text()
    assert "shutting down" in log


def test_sigterm_closes_the_judge_when_the_server_has_shut_down(
    fake_openai, examples_dir, tmp_path
):
    """`serve` closes its judge (an engine in the process, vLLM: its processes and GPU memory)
    in the server's own shutdown, on SIGTERM: uvicorn ends the process with the signal it
    caught once the server returns, so a close after `serve()` would never run."""
    fake_openai.answer_any = True  # the server's probe at start
    closed, port = tmp_path / "closed", _free_port()
    script = f"""
import os, signal, threading, time
import httpx
from stepgap.serving import StepGapReward
from stepgap.serving.server import serve
from stepgap.teacher import Checker, ReplayNLI, build_judge

judge = build_judge("openai:gpt-4.1-mini", base_url={fake_openai.base_url!r}, max_retries=0,
                    no_cache=True)
judge.close = lambda: open({str(closed)!r}, "w").write("closed")

def stop():
    while True:
        try:
            if httpx.get("http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=stop, daemon=True).start()
nli = ReplayNLI.from_file({str(examples_dir / "nli_replay.jsonl")!r})
serve(StepGapReward(Checker(judge, nli)), port={port}, grace=1)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert "Shutting down" in done.stderr or "shutting down" in done.stderr.lower(), done.stderr
    assert closed.is_file() and closed.read_text() == "closed", done.stderr[-2000:]
