"""The micro-batcher of `stepgap serve` (`serving/batching.py`), without HTTP: traces that come
together share a checker call, calls never exceed `max_inflight`, and admission by the measured
pace refuses at once, or holds, what cannot be answered by its deadline."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from stepgap.serving.batching import Busy, MicroBatcher, Pace

pytestmark = pytest.mark.timeout(180)


def _sleepy_check(seconds: float, checked: list[int]):
    """A plain checker call that takes `seconds` and gives no verdicts."""

    def check(traces):
        time.sleep(seconds)
        checked.append(len(traces))
        return [[] for _ in traces]

    return check


def test_admission_refuses_at_once_what_the_measured_pace_cannot_answer_in_time(example_traces):
    """A client that gives its own deadline (X-Stepgap-Timeout, as RemoteChecker does) can act
    on a refusal: after one measured call (0.3 s), a burst that one call at a time cannot answer
    within 1 s gets `Busy("overloaded")` at once, beyond what fits; what is admitted is answered
    in time, and what is refused is never checked."""
    checked: list[int] = []

    async def run():
        batcher = MicroBatcher(
            _sleepy_check(0.3, checked), max_batch=1, max_wait_ms=0, max_inflight=1
        )
        batcher.start()
        try:
            first = example_traces[:1]
            assert await batcher.submit(first, timeout=1.0) == [[]]
            while batcher.calls:  # the call ends (and is measured) just after its answer
                await asyncio.sleep(0.01)
            steps = len(first[0].steps)
            assert batcher.pace.seconds_per_step() == pytest.approx(0.3 / steps, rel=0.6)

            async def one(t):
                start = time.monotonic()
                try:
                    await batcher.submit([t], timeout=1.0)
                    return "answered", time.monotonic() - start
                except Busy as exc:
                    return exc.reason, time.monotonic() - start

            return await asyncio.gather(*(one(t) for t in example_traces))
        finally:
            await batcher.stop()

    outcomes = asyncio.run(run())
    kinds = [k for k, _ in outcomes]
    assert "answered" in kinds and "overloaded" in kinds
    assert "deadline" not in kinds  # the estimate kept every admitted request within its time
    assert all(s < 0.05 for k, s in outcomes if k == "overloaded")
    assert sum(checked) == 1 + kinds.count("answered")  # refused traces were never checked


def test_a_request_without_its_own_deadline_is_held_until_there_is_room(example_traces):
    """OpenRLHF's client sends no deadline and retries blindly, 1 s apart: a request that does
    not fit now is held (checked by nobody meanwhile) and admitted as the backlog clears, so
    the same burst that a client with its own deadline gets refused is answered whole."""
    checked: list[int] = []

    async def run():
        batcher = MicroBatcher(
            _sleepy_check(0.2, checked), max_batch=1, max_wait_ms=0, max_inflight=1,
            client_timeout=10.0,
        )  # fmt: skip
        batcher.start()
        try:
            await batcher.submit(example_traces[:1])  # measures the pace
            while batcher.calls:
                await asyncio.sleep(0.01)
            peak_queue = 0

            async def watch():
                nonlocal peak_queue
                while True:
                    peak_queue = max(peak_queue, batcher.queue.qsize())
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch())
            answers = await asyncio.gather(*(batcher.submit([t]) for t in example_traces * 2))
            watcher.cancel()
            return answers, peak_queue
        finally:
            await batcher.stop()

    answers, peak_queue = asyncio.run(run())
    assert answers == [[[]]] * 20  # every one answered, none refused
    assert sum(checked) == 21  # each checked once
    assert peak_queue < 20  # held ones waited outside the queue, admitted as it drained


def test_admission_recovers_once_the_server_is_idle(example_traces):
    """A judge that was slow (2 s a call) made a burst refused; once nothing is queued or in
    flight, the next request is admitted whatever the old figure says, answered, and
    measures the pace again: a server never stays stuck refusing."""
    checked: list[int] = []
    delay = [2.0]

    def check(traces):
        time.sleep(delay[0])
        checked.append(len(traces))
        return [[] for _ in traces]

    async def run():
        batcher = MicroBatcher(check, max_batch=1, max_wait_ms=0, max_inflight=1)
        batcher.start()
        try:
            await batcher.submit(example_traces[:1], timeout=5.0)
            while batcher.calls:
                await asyncio.sleep(0.01)
            slow = batcher.pace.seconds_per_step()
            burst = [batcher.submit([t], timeout=3.0) for t in example_traces]
            outcomes = await asyncio.gather(*burst, return_exceptions=True)
            assert any(isinstance(o, Busy) and o.reason == "overloaded" for o in outcomes)
            while batcher.calls or batcher.queue.qsize():
                await asyncio.sleep(0.05)
            delay[0] = 0.05  # the judge is fast again; the figure still says slow
            assert batcher.pace.seconds_per_step() == pytest.approx(slow, rel=0.2)
            answer = await batcher.submit(example_traces[:1], timeout=3.0)
            while batcher.calls:
                await asyncio.sleep(0.01)
            return answer, slow, batcher.pace.seconds_per_step()
        finally:
            await batcher.stop()

    answer, slow, now = asyncio.run(run())
    assert answer == [[]]
    assert now < slow  # measured again


def test_pace_from_the_judges_own_requests_or_from_whole_calls():
    from stepgap.teacher.judges.concurrency import EngineLimit

    pace = Pace()
    assert pace.estimate(100, 3) is None  # nothing measured: admit
    pace.observe(2.0, 4)  # a call of 4 steps in 2 s: 2 steps a second
    assert pace.estimate(0, 4) == pytest.approx(4 / 2 + 0.5)
    assert pace.estimate(8, 4) == pytest.approx(12 / 2 + 0.5)
    limit = EngineLimit()
    limit.learned(4, "llama-server /props")  # 5 in flight
    judged = Pace(judge=limit)
    assert judged.estimate(10, 2) is None  # no request answered yet
    for _ in range(3):
        limit.observe(1, 2.0)  # each request takes 2 s, 5 at once: 2.5 steps a second
    assert judged.estimate(10, 2) == pytest.approx(12 / 2.5 + 2.0)


@pytest.mark.parametrize("max_inflight", [1, 8])
def test_traces_that_arrive_together_share_one_call_and_calls_never_exceed_max_inflight(
    example_traces, max_inflight
):
    """Requests that come within `max_wait_ms` of each other form one batch, however many
    calls may run at once (several idle callers once split them, each taking one request);
    and while every call slot is busy, what queues waits and then goes as one batch."""
    batches: list[int] = []
    running = [0, 0]  # now, most
    release = threading.Event()

    def check(traces):
        running[0] += 1
        running[1] = max(running)
        batches.append(len(traces))
        release.wait(10)
        running[0] -= 1
        return [[] for _ in traces]

    async def run():
        batcher = MicroBatcher(check, max_batch=16, max_wait_ms=300, max_inflight=max_inflight)
        batcher.start()
        try:
            first = [
                asyncio.ensure_future(batcher.submit([t], timeout=30.0)) for t in example_traces[:3]
            ]
            while len(batches) < 1:
                await asyncio.sleep(0.01)
            later = [
                asyncio.ensure_future(batcher.submit([t], timeout=30.0)) for t in example_traces
            ]
            while len(batches) < (2 if max_inflight > 1 else 1):
                await asyncio.sleep(0.01)
            release.set()
            await asyncio.gather(*first, *later)
        finally:
            await batcher.stop()

    asyncio.run(run())
    assert batches == [3, len(example_traces)]
    assert running[1] == min(max_inflight, 2)


def test_the_batcher_imports_without_the_web_framework():
    """The batcher is a queue and threads: it loads without FastAPI or Starlette."""
    import subprocess
    import sys

    code = (
        "import sys, stepgap.serving.batching; "
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_call_whose_traces_are_all_dropped_stops_before_its_next_trace(example_traces):
    """The call's own stop, apart from the judge's deadlines: a checker that ignores deadlines
    but looks at the stop event between traces (as `StepGapReward.check_stream` does) checks
    no trace after its request's deadline has passed and every trace of the call is gone."""
    checked: list[int] = []

    def stream(traces, stop, deadlines):
        for i, _ in enumerate(traces):
            if stop.is_set():
                return
            time.sleep(0.4)
            checked.append(i)
            yield i, []

    async def run():
        batcher = MicroBatcher(stream=stream, max_batch=8, max_wait_ms=50, max_inflight=1)
        batcher.start()
        try:
            with pytest.raises(Busy) as refused:
                await batcher.submit(list(example_traces[:4]), timeout=0.6)
            assert refused.value.reason == "deadline"
            await asyncio.sleep(2.0)  # time for the rest, were the call not stopped
        finally:
            await batcher.stop()

    asyncio.run(run())
    # what was under way when the deadline passed ends (on a busy machine, one trace or none);
    # no trace starts after it
    assert 1 <= len(checked) <= 2 and checked == list(range(len(checked))), checked
