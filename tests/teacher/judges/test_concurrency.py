"""The judge's requests in flight fit the engine: the slots llama.cpp's server reports, or what
the latencies show; a trace's deadline bounds its requests, and a cancel closes them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
import time

import pytest

from stepgap.clock import TraceDeadline
from stepgap.teacher.judges.base import JudgeStopped
from stepgap.teacher.judges.concurrency import EngineLimit
from stepgap.teacher.judges.openai_api import OpenAIJudge, OpenAIJudgeOptions
from stepgap.teacher.prompt import build_requests
from tests.fixtures.clock import ManualClock
from tests.fixtures.openai_server import FakeOpenAI


def simulate(
    limit: EngineLimit, slots: int, durations: list[float], requests: int, per_call: int
) -> int:
    """`requests` requests of one call (at most `per_call` in flight) through `limit` to an
    engine of `slots` slots whose i-th request takes `durations[i % len]` seconds (a waiting one
    queues, as an engine does); returns the most ever in flight at the engine. The engine's
    time is a `ManualClock`'s, moved on to the next answer whenever every request waits, so
    the latencies the limit learns from are exact at any machine load."""
    engine = asyncio.Semaphore(slots)
    call = asyncio.Semaphore(per_call)
    clock = ManualClock()
    most = 0

    async def one(i: int) -> None:
        async with call:
            await through_limit(i)

    async def through_limit(i: int) -> None:
        nonlocal most
        position, ticket = await limit.acquire()
        most = max(most, limit.in_flight)
        started = clock.now()
        try:
            async with engine:
                await clock.sleep(durations[i % len(durations)])
        finally:
            limit.release(ticket)
        limit.observe(position, clock.now() - started)

    async def run() -> None:
        work = asyncio.gather(*(one(i) for i in range(requests)))
        while not work.done():
            for _ in range(100):  # every request that can move moves (no real waits here)
                await asyncio.sleep(0)
            if clock.sleepers:  # all wait for the engine: its next answer is due
                clock.advance(min(at for at, _ in clock.sleepers) - clock.now())
        await work

    asyncio.run(run())
    return most


def test_latencies_of_a_queueing_engine_bring_the_limit_to_its_slots_plus_the_margin():
    limit = EngineLimit()
    simulate(limit, slots=2, durations=[0.05], requests=60, per_call=8)
    assert (limit.limit, limit.source) == (3, "latency")


def test_answers_of_different_lengths_without_queueing_set_no_limit():
    """Latencies that vary by a factor of two (answers of different lengths), on an engine
    with room for all: no queueing, no limit."""
    limit = EngineLimit()
    simulate(limit, slots=16, durations=[0.03, 0.05, 0.04, 0.06], requests=80, per_call=8)
    assert limit.limit is None


def test_a_hosted_api_is_not_adapted():
    limit = EngineLimit(adapt=False)
    simulate(limit, slots=2, durations=[0.02], requests=40, per_call=8)
    assert limit.limit is None


def test_another_thread_reads_the_throughput_while_the_judge_records_answers():
    """A reward server's pacing reads `throughput()` from its own loop while the judge's loop
    records answers: the reading never meets the window mid-change (it raised "deque mutated
    during iteration", a 500 under load)."""
    limit = EngineLimit(adapt=False)
    limit.observe(1, 0.01)
    done = threading.Event()
    errors: list[BaseException] = []

    def judge_loop() -> None:
        k = 0
        while not done.is_set():
            limit.observe(1 + k % 8, 0.01 + (k % 5) / 100)
            k += 1

    writer = threading.Thread(target=judge_loop)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    writer.start()
    try:
        for _ in range(20_000):
            assert limit.throughput() is not None and limit.typical_latency() is not None
    except RuntimeError as exc:
        errors.append(exc)
    finally:
        done.set()
        writer.join()
        sys.setswitchinterval(interval)
    assert not errors, errors


def _requests(example_traces, copies: int = 1):
    out = []
    for k in range(copies):
        for t in example_traces:
            out += build_requests(f"{t.id}#{k}", t.question, t.steps)
    return out


@pytest.mark.parametrize("props", [True, False], ids=["slots-from-props", "slots-from-latency"])
def test_the_judge_never_oversubscribes_an_engine_and_cancels_nothing(
    example_answers, example_traces, props
):
    """A judge server of 2 slots, 0.3 s a request, and a judge allowed 8 at once: with /props
    the judge never has more than 3 requests open at it (2 slots + 1); from latencies alone
    (its first request goes alone and shows what one takes) it comes down near that within the
    first call. Either way no request is cancelled part-way by the judge's own timeouts."""
    server = FakeOpenAI(answers=dict(example_answers), slots=2, props=props, latency=0.3)
    server.start()
    try:
        judge = OpenAIJudge(
            "m", OpenAIJudgeOptions(base_url=server.base_url, concurrency=8, timeout=5.0)
        )
        results = judge.judge(_requests(example_traces))
        assert all(r.judge is not None for r in results)
        assert server.max_serving <= 2
        assert server.cancelled() == []
        if props:
            assert (judge.limit.limit, judge.limit.source) == (3, "llama-server /props")
            assert server.max_open <= 3 + 1
        else:
            assert judge.limit.source == "latency" and 2 <= judge.limit.limit <= 4
            server.max_open = 0
            judge.judge(_requests(example_traces))
            # after learning: about the slots, plus the margin (and one whose answer is written
            # but whose handler has not ended yet)
            assert server.max_open <= judge.limit.limit + 1 < 8
            assert server.cancelled() == []
    finally:
        server.stop()


def test_an_engine_that_batches_continuously_is_not_throttled_by_its_latencies(
    example_answers, example_traces
):
    """vLLM's latency grows with its running batch by design: read as queueing, it brought the
    limit to a request or two (on a CPU, 25 answer tokens/s where the engine gives 137). A
    server whose models vLLM owns keeps no limit: the call's concurrency alone."""
    server = FakeOpenAI(answers=dict(example_answers), slots=2, latency=0.2, owned_by="vllm")
    server.start()
    try:
        judge = OpenAIJudge(
            "m", OpenAIJudgeOptions(base_url=server.base_url, concurrency=8, timeout=5.0)
        )
        results = judge.judge(_requests(example_traces))
        assert all(r.judge is not None for r in results)
        assert judge.limit.limit is None and not judge.limit.adapt
        assert server.max_open == 8
    finally:
        server.stop()


def _until(condition, seconds: float = 30.0) -> bool:
    """Whether `condition()` holds within `seconds` (the server records a closed request
    after the client closed it)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.realtime
def test_a_request_past_its_deadline_is_not_sent_and_a_cancel_closes_those_in_flight(
    example_answers, example_traces
):
    server = FakeOpenAI(answers=dict(example_answers), latency=5.0)
    server.start()
    try:
        judge = OpenAIJudge(
            "m", OpenAIJudgeOptions(base_url=server.base_url, concurrency=8, timeout=60.0)
        )
        judge.working = True
        requests = _requests(example_traces[:1])
        passed = TraceDeadline(time.monotonic() - 1)
        for r in requests:
            r.deadline = passed
        results = judge.judge(requests)
        assert all(r.error == "not judged: its deadline passed" for r in results)
        assert server.events == []  # nothing was sent

        requests = _requests(example_traces[:1])
        wanted = TraceDeadline(time.monotonic() + 30)
        for r in requests:
            r.deadline = wanted
        box: list = []
        worker = threading.Thread(target=lambda: box.append(judge.judge(requests)))
        worker.start()
        while len(server.events) < len(requests):
            time.sleep(0.01)
        cancelled_at = time.monotonic()
        wanted.cancel()  # the trace's client left
        worker.join(timeout=10)
        assert all("no longer waits" in r.error for r in box[0])
        assert _until(lambda: len(server.cancelled()) == len(requests))
        closed = [e.closed_at - cancelled_at for e in server.cancelled()]
        assert all(c < 4.0 for c in closed)  # closed, not answered: an answer takes 5 s
    finally:
        server.stop()


@pytest.mark.realtime
def test_the_requests_time_out_at_the_traces_deadline_not_after_the_fixed_timeout(
    example_answers, example_traces
):
    """A trace with 1 s left and a judge whose fixed timeout is 60 s: its request ends at the
    deadline (closed, not answered), and is not sent again."""
    server = FakeOpenAI(answers=dict(example_answers), latency=5.0)
    server.start()
    try:
        judge = OpenAIJudge(
            "m", OpenAIJudgeOptions(base_url=server.base_url, timeout=60.0, max_retries=3)
        )
        judge.working = True
        (request,) = _requests(example_traces[:1])[:1]
        request.deadline = TraceDeadline(time.monotonic() + 1.0)
        start = time.monotonic()
        (result,) = judge.judge([request])
        assert time.monotonic() - start < 4.5  # at its 1 s deadline: not the 5 s answer, nor 60
        assert result.error == "not judged: its deadline passed"
        assert _until(lambda: len(server.events) == 1 and server.events[0].closed_early)
    finally:
        server.stop()


@pytest.mark.realtime
def test_stop_closes_the_calls_requests_in_flight(example_answers, example_traces):
    """A checker call that nobody waits for any more (`stop`, set once every request is at the
    judge server): the judge raises `JudgeStopped` at once and its requests in flight are
    closed."""
    server = FakeOpenAI(answers=dict(example_answers), latency=30.0)
    server.start()
    try:
        judge = OpenAIJudge("m", OpenAIJudgeOptions(base_url=server.base_url, timeout=60.0))
        judge.working = True
        stop = threading.Event()
        requests = _requests(example_traces[:2])

        def stop_once_all_are_in() -> None:
            if _until(lambda: len(server.events) == len(requests)):
                stop.set()

        threading.Thread(target=stop_once_all_are_in, daemon=True).start()
        with pytest.raises(JudgeStopped):
            judge.judge(requests, stop=stop)  # the answers would take 30 s
        assert stop.is_set(), "the call ended before all its requests were at the server"
        assert _until(lambda: len(server.cancelled()) == len(requests))
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_judge_reports_a_server_it_cannot_reach_at_once_and_a_probe_finds_it_again(
    example_answers, example_traces
):
    """Nothing listens at the judge's URL: its first connection refused marks the limit down
    while the SDK's retries (50 here, minutes of backoff) have barely begun, so a reward server
    can act on it at once. When a server listens there again, `probe()` finds it and marks it
    up; both changes reach the listeners."""
    port = _free_port()
    options = OpenAIJudgeOptions(base_url=f"http://127.0.0.1:{port}/v1", max_retries=50)
    judge = OpenAIJudge("m", options)
    judge.working = True
    changes: list[str | None] = []
    reported = threading.Event()
    judge.limit.on_change(lambda: (changes.append(judge.limit.down), reported.set()))
    stop = threading.Event()
    call = threading.Thread(
        target=lambda: _swallow(judge.judge, _requests(example_traces)[:1], stop)
    )
    call.start()
    try:
        assert reported.wait(60), "a refused connection was never reported"
        assert call.is_alive(), "reported only after the SDK's retries gave up"
        assert changes[0] is not None and "ConnectError" in changes[0]
        assert judge.limit.down is not None
        assert judge.limit.probe() is False and judge.limit.down is not None
    finally:
        stop.set()
        call.join(30)
    server = FakeOpenAI(answers=dict(example_answers)).start(port)
    try:
        assert judge.limit.probe() is True
        assert judge.limit.down is None and changes[-1] is None
        results = judge.judge(_requests(example_traces)[:2])
        assert all(r.judge is not None for r in results)
    finally:
        server.stop()


def _swallow(judge, requests, stop) -> None:
    with contextlib.suppress(JudgeStopped):
        judge(requests, stop=stop)


def test_a_judge_server_killed_mid_request_is_reported_down_at_once(
    example_answers, example_traces, tmp_path
):
    """The judge server dies (SIGKILL) with a request in flight: the dropped connection, and a
    new one refused, mark it down at once, before the SDK's first retry."""
    from tests.fixtures.openai_server import start_in_child

    report = tmp_path / "seen.json"
    process, base_url = start_in_child(dict(example_answers), 60.0, report=str(report))
    judge = OpenAIJudge("m", OpenAIJudgeOptions(base_url=base_url, max_retries=50))
    judge.working = True
    reported = threading.Event()
    judge.limit.on_change(reported.set)
    stop = threading.Event()
    call = threading.Thread(
        target=_swallow, args=(judge.judge, _requests(example_traces)[:1], stop)
    )
    call.start()
    try:
        assert _until(lambda: report.exists() and json.loads(report.read_text())["requests"] == 1)
        process.kill()
        assert reported.wait(60), "the dead server was never reported"
        assert "a new connection is refused" in (judge.limit.down or "")
    finally:
        stop.set()
        call.join(30)
        process.kill()
