"""The micro-batcher of `stepgap serve` (`serving/batching.py`), without HTTP: traces that come
together share a checker call, calls never exceed `max_inflight`, and admission by the measured
pace refuses at once, or holds, what cannot be answered by its deadline."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stepgap.serving.batching import Busy, MicroBatcher, Pace
from stepgap.serving.work import KEEP_FOR_RETRY
from tests.fixtures.clock import ManualClock

pytestmark = pytest.mark.timeout(180)


def _timed_check(clock: ManualClock, seconds: list[float], checked: list[int]):
    """A plain checker call that takes `seconds[0]` of the test's clock and gives no verdicts
    (the clock moves on the loop before the call's answers reach it)."""

    def check(traces):
        clock.advance_soon(seconds[0])
        checked.append(len(traces))
        return [[] for _ in traces]

    return check


def distinct(traces):
    """The traces, each a rollout of its own (the same trace twice is one work: a retry)."""
    return [t.model_copy(update={"question": f"{t.question} ({k})"}) for k, t in enumerate(traces)]


async def _calls_ended(batcher: MicroBatcher) -> None:
    """Until the call in flight has ended (it is measured just after its answers)."""
    while batcher.calls:
        await asyncio.sleep(0)


def test_admission_refuses_at_once_what_the_measured_pace_cannot_answer_in_time(example_traces):
    """A client that gives its own deadline (X-Stepgap-Timeout, as RemoteChecker does) can act
    on a refusal: after one measured call (0.3 s), a burst that one call at a time cannot answer
    within 1 s gets `Busy("overloaded")` at once, beyond what fits; what is admitted is answered
    in time, and what is refused is never checked."""
    checked: list[int] = []
    clock = ManualClock()

    async def run():
        clock.loop = asyncio.get_running_loop()
        batcher = MicroBatcher(
            _timed_check(clock, [0.3], checked), max_batch=1, max_wait_ms=0, max_inflight=1,
            clock=clock,
        )  # fmt: skip
        batcher.start()
        try:
            first = example_traces[:1]
            assert await batcher.submit(first, timeout=1.0) == [[]]
            await _calls_ended(batcher)
            steps = len(first[0].steps)
            assert batcher.pace.seconds_per_step() == pytest.approx(0.3 / steps)

            async def one(t):
                start = clock.now()
                try:
                    await batcher.submit([t], timeout=1.0)
                    return "answered", clock.now() - start
                except Busy as exc:
                    return exc.reason, clock.now() - start

            return await asyncio.gather(*(one(t) for t in example_traces))
        finally:
            await batcher.stop()

    outcomes = asyncio.run(run())
    kinds = [k for k, _ in outcomes]
    assert "answered" in kinds and "overloaded" in kinds
    assert "deadline" not in kinds  # the estimate kept every admitted request within its time
    assert all(s == 0.0 for k, s in outcomes if k == "overloaded")  # before any call ran
    assert all(s <= 0.8 for k, s in outcomes if k == "answered")  # within 1 s less the margin
    assert sum(checked) == 1 + kinds.count("answered")  # refused traces were never checked


def test_a_request_without_its_own_deadline_is_held_until_there_is_room(example_traces):
    """OpenRLHF's client sends no deadline and retries blindly, 1 s apart: a request that does
    not fit now is held (checked by nobody meanwhile) and admitted as the backlog clears, so
    the same burst that a client with its own deadline gets refused is answered whole. Here
    20 one-trace requests of 56 steps, at 0.1 s a step measured, would take 5.7 s by the pace:
    more than 80% of the 6 s a request may use (8 s less the margin), so some are held; each
    call takes 0.2 s, so all are answered in 4 s."""
    checked: list[int] = []
    queued: list[int] = []  # the queue's length as each call starts
    clock = ManualClock()

    async def run():
        clock.loop = asyncio.get_running_loop()
        check = _timed_check(clock, [0.2], checked)
        batcher = MicroBatcher(
            lambda traces: (queued.append(batcher.queue.qsize()), check(traces))[1],
            max_batch=1, max_wait_ms=0, max_inflight=1, client_timeout=8.0, clock=clock,
        )  # fmt: skip
        batcher.start()
        try:
            await batcher.submit(example_traces[:1])  # measures the pace
            await _calls_ended(batcher)
            queued.clear()
            burst = distinct(example_traces * 2)
            requests = [asyncio.ensure_future(batcher.submit([t])) for t in burst]
            await asyncio.sleep(0)  # every request admitted or held
            held = len(batcher.held)
            answers = await asyncio.gather(*requests)
            return answers, held, clock.now()
        finally:
            await batcher.stop()

    start = clock.now()
    answers, held, end = asyncio.run(run())
    assert held > 0  # the burst did not fit at once
    assert answers == [[[]]] * 20  # every one answered, none refused
    assert sum(checked) == 21  # each checked once
    assert max(queued) < 20 - held + 1  # held ones waited outside the queue, admitted as it drained
    assert end - start == pytest.approx(0.2 * 21)


def test_admission_recovers_once_the_server_is_idle(example_traces):
    """A judge that was slow (2 s a call) made a burst refused; once nothing is queued or in
    flight, the next request is admitted whatever the old figure says, answered, and
    measures the pace again: a server never stays stuck refusing."""
    checked: list[int] = []
    delay = [2.0]
    clock = ManualClock()

    async def run():
        clock.loop = asyncio.get_running_loop()
        batcher = MicroBatcher(
            _timed_check(clock, delay, checked), max_batch=1, max_wait_ms=0, max_inflight=1,
            clock=clock,
        )  # fmt: skip
        batcher.start()
        try:
            await batcher.submit(example_traces[:1], timeout=5.0)
            await _calls_ended(batcher)
            slow = batcher.pace.seconds_per_step()
            burst = [batcher.submit([t], timeout=3.0) for t in example_traces]
            outcomes = await asyncio.gather(*burst, return_exceptions=True)
            assert any(isinstance(o, Busy) and o.reason == "overloaded" for o in outcomes)
            while batcher.calls or batcher.queue.qsize():
                await asyncio.sleep(0)
            delay[0] = 0.05  # the judge is fast again; the figure still says slow
            assert batcher.pace.seconds_per_step() == pytest.approx(slow)
            answer = await batcher.submit(example_traces[:1], timeout=3.0)
            await _calls_ended(batcher)
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
    pace.observe(2.0, 4, 4)  # a call of 4 steps (cost 1 each) in 2 s: 2 a second
    assert pace.estimate(0, 4) == pytest.approx(4 / 2 + 0.5)
    assert pace.estimate(8, 4) == pytest.approx(12 / 2 + 0.5)
    assert pace.seconds_per_step() == pytest.approx(0.5)
    limit = EngineLimit(clock=lambda: 0.0)
    limit.learned(4, "llama-server /props")  # 5 in flight
    judged = Pace(judge=limit)
    assert judged.estimate(10, 2) is None  # no request answered yet
    for _ in range(3):
        limit.observe(1, 2.0)  # each request takes 2 s, 5 at once: 2.5 steps a second
    assert judged.estimate(10, 2) == pytest.approx(12 / 2.5 + 2.0)
    assert judged.seconds_per_step() == pytest.approx(2.0 / 5)


def test_the_pace_counts_the_prompts_length_not_the_requests():
    """Requests of 1,000 prompt characters taking 2 s, 5 at once: 2,500 characters a second.
    Work of 10,000 characters is 4 s of the judge's, whether it is 2 steps or 10."""
    from stepgap.teacher.judges.concurrency import EngineLimit

    limit = EngineLimit(clock=lambda: 0.0)
    limit.learned(4, "llama-server /props")
    for _ in range(3):
        limit.observe(1, 2.0, 1000.0)
    pace = Pace(judge=limit)
    assert pace.estimate(0, 10_000) == pytest.approx(10_000 / 2500 + 2.0)


def test_the_pace_slows_as_soon_as_a_request_runs_late():
    """The judge answered in 2 s; a request in flight for 8 s says it is slower now: the
    latency read is 8 s before that request ends, and admission plans with it."""
    from stepgap.teacher.judges.concurrency import EngineLimit

    now = [0.0]
    limit = EngineLimit(clock=lambda: now[0])
    limit.learned(4, "llama-server /props")
    for _ in range(3):
        limit.observe(1, 2.0)
    pace = Pace(judge=limit)
    assert pace.estimate(10, 2) == pytest.approx(12 / 2.5 + 2.0)

    async def one_late_request() -> None:
        await limit.acquire()
        now[0] += 8.0

    asyncio.run(one_late_request())
    assert limit.typical_latency() == pytest.approx(8.0)
    assert pace.estimate(10, 2) == pytest.approx(12 / (5 / 8.0) + 8.0)


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
            later = [  # other rollouts than the first three, which they would join
                asyncio.ensure_future(batcher.submit([t], timeout=30.0))
                for t in distinct(example_traces)
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
    no trace once every trace of the call is gone: its request's deadline has passed (0.6 s,
    0.48 s less the margin, while trace 1 is checked) and no retry came for it within the
    time its work is kept."""
    checked: list[int] = []
    clock = ManualClock()
    gates = [threading.Event() for _ in range(4)]
    stopped: list[threading.Event] = []

    def stream(traces, stop, deadlines):
        stopped.append(stop)
        for i, _ in enumerate(traces):
            assert gates[i].wait(30), "the test never let the trace be checked"
            if stop.is_set():
                return
            checked.append(i)
            yield i, []

    async def run():
        clock.loop = asyncio.get_running_loop()
        batcher = MicroBatcher(stream=stream, max_batch=8, max_wait_ms=50, max_inflight=1,
                               clock=clock)  # fmt: skip
        batcher.start()
        try:
            sent = clock.now()
            request = asyncio.ensure_future(batcher.submit(list(example_traces[:4]), timeout=0.6))
            while not batcher.calls:  # the collector waits 50 ms of the clock for more traces
                clock.advance(0.01)
                await asyncio.sleep(0)
            gates[0].set()  # trace 0 is checked in the call's first 0.4 s
            while not checked:
                await asyncio.sleep(0)
            # trace 1 is under way when the deadline (0.48 s after the request) passes
            clock.advance(sent + 0.5 - clock.now())
            with pytest.raises(Busy) as refused:
                await request
            assert refused.value.reason == "deadline"
            # its work is kept for the client's retry for `keep_for_retry` s; then nobody came
            # back for any trace of the call, and it is stopped (on the loop, at once)
            for _ in range(100):
                await asyncio.sleep(0)
            assert not stopped[0].is_set(), "work a retry may want was stopped"
            clock.advance(KEEP_FOR_RETRY)
            for _ in range(1000):
                if stopped[0].is_set():
                    break
                await asyncio.sleep(0)
            assert stopped[0].is_set(), "the call whose traces are all gone was not stopped"
            for gate in gates[1:]:
                gate.set()
            await _calls_ended(batcher)
        finally:
            await batcher.stop()

    asyncio.run(run())
    assert checked == [0]  # no trace is checked after the deadline
