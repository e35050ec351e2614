"""The judge's work is never thrown away while a client may retry (`serving/work.py` through the
batcher): a request that ends unanswered leaves its trace's check running; the client's retry
of the same rollout (a new trace id, as OpenRLHF's client sends it) joins that check, or takes
its verdicts at once if it finished; nobody coming back within the keep time abandons it. All
on a `ManualClock`, with the checker held by gates."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stepgap.schema import Verdict
from stepgap.serving.batching import PROBE_EVERY, Busy, MicroBatcher
from stepgap.serving.work import KEEP_FOR_RETRY, content_key
from stepgap.teacher.judges.concurrency import EngineLimit
from tests.fixtures.clock import ManualClock

pytestmark = pytest.mark.timeout(120)


def verdicts_of(trace) -> list[Verdict]:
    return [
        Verdict(trace_id=trace.id, step=s.index, type="inference", label="no_gap", repair="none")
        for s in trace.steps or []
    ]


class GatedChecker:
    """A checker stream that checks each trace when the test opens its gate, and counts the
    traces it was asked to check, and those it finished."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started: list[str] = []
        self.finished: list[str] = []
        self.stops: list[threading.Event] = []

    def __call__(self, traces, stop, deadlines):
        self.stops.append(stop)
        for position, trace in enumerate(traces):
            self.started.append(trace.id)
            while not self.gate.wait(0.01) or stop.is_set():
                if stop.is_set() or deadlines[position].over():
                    return  # stopped part-way: the judge's requests for it are closed
            self.finished.append(trace.id)
            yield position, verdicts_of(trace)


def retried(trace, attempt: int):
    """The trace as the client's retry sends it: the same rollout under a new id."""
    return trace.model_copy(update={"id": f"{trace.id}-retry{attempt}"})


async def until(condition, what: str) -> None:
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never: {what}")


async def unanswered(batcher, checker, clock, trace) -> None:
    """The trace's first request: its check starts, and its 5 s deadline passes (503)."""
    first = asyncio.ensure_future(batcher.submit([trace], timeout=5.0))
    await until(lambda: checker.started, "the check started")
    clock.advance(5.0)
    with pytest.raises(Busy) as refused:
        await first
    assert refused.value.reason == "deadline"


def judge_to_probe(clock: ManualClock):
    """(a judge's `EngineLimit`, the answers its probe gives: `answers["now"]`, the clock times
    it was probed at)."""
    limit = EngineLimit(adapt=False)
    answers = {"now": False}
    probes: list[float] = []

    def prober() -> bool:
        probes.append(clock.now())
        return answers["now"]

    limit.prober = prober
    return limit, answers, probes


def run_scene(scene, clock: ManualClock | None = None, **options):
    """`scene(batcher, checker, clock)` on a batcher over a `GatedChecker`; (its result, the
    checker)."""
    clock = clock or ManualClock()
    checker = GatedChecker()

    async def run():
        clock.loop = asyncio.get_running_loop()
        batcher = MicroBatcher(stream=checker, max_wait_ms=0, clock=clock, **options)
        batcher.start()
        try:
            return await scene(batcher, checker, clock)
        finally:
            checker.gate.set()
            await batcher.stop()

    return asyncio.run(run()), checker


def test_content_key_ignores_the_id_only(example_traces):
    trace = example_traces[0]
    assert content_key(trace) == content_key(retried(trace, 1))
    other = trace.model_copy(update={"question": trace.question + "?"})
    assert content_key(other) != content_key(trace)


def test_a_retry_joins_the_check_its_first_request_left_running(example_traces):
    """The first request's deadline passes (503) with its trace half checked: the check goes
    on, the retry joins it, and the trace is checked once, never stopped part-way; the retry's
    verdicts carry the retry's trace id."""
    trace = example_traces[0]

    async def scene(batcher, checker, clock):
        await unanswered(batcher, checker, clock, trace)
        clock.advance(KEEP_FOR_RETRY / 2)  # the client retries within the keep time
        retry = asyncio.ensure_future(batcher.submit([retried(trace, 1)], timeout=5.0))
        await asyncio.sleep(0)
        checker.gate.set()
        return await retry

    (verdicts,), checker = run_scene(scene)
    assert checker.started == [trace.id] and checker.finished == [trace.id]
    assert {v.trace_id for v in verdicts} == {f"{trace.id}-retry1"}
    assert len(verdicts) == len(trace.steps)


def test_a_check_that_finished_after_its_503_answers_the_retry_at_once(example_traces):
    trace = example_traces[1]

    async def scene(batcher, checker, clock):
        await unanswered(batcher, checker, clock, trace)
        checker.gate.set()
        await until(lambda: checker.finished, "the check finished")
        await until(lambda: not batcher.calls, "the call ended")
        sent = clock.now()
        answer = await batcher.submit([retried(trace, 1)], timeout=5.0)
        assert clock.now() == sent  # no wait at all: the verdicts were kept
        assert not batcher.works.by_key, "delivered work is not kept again"
        return answer

    (verdicts,), checker = run_scene(scene)
    assert checker.started == [trace.id]  # checked once, for both requests
    assert [v.trace_id for v in verdicts] == [f"{trace.id}-retry1"] * len(trace.steps)


def test_work_nobody_comes_back_for_is_abandoned_after_the_keep_time(example_traces):
    """No retry within `keep_for_retry`: the check is stopped part-way (its judge requests
    closed), and a later request for the same trace starts it afresh."""
    trace = example_traces[2]

    async def scene(batcher, checker, clock):
        await unanswered(batcher, checker, clock, trace)
        work = next(iter(batcher.works.by_key.values()))
        clock.advance(3.0)
        assert not work.deadline.cancelled  # kept for a retry
        clock.advance(3.0)
        await until(lambda: work.deadline.cancelled, "the work was abandoned")
        await until(lambda: checker.stops[0].is_set(), "the call was stopped")
        assert not batcher.works.by_key
        await until(lambda: not batcher.calls, "the call ended")
        later = asyncio.ensure_future(batcher.submit([trace], timeout=5.0))
        await until(lambda: len(checker.started) == 2, "checked afresh")
        checker.gate.set()
        return await later

    _, checker = run_scene(scene, keep_for_retry=6.0)
    assert checker.started == [trace.id, trace.id]
    assert checker.finished == [trace.id]


def test_keep_for_retry_zero_drops_the_work_with_its_request(example_traces):
    trace = example_traces[3]

    async def scene(batcher, checker, clock):
        await unanswered(batcher, checker, clock, trace)
        await until(lambda: checker.stops[0].is_set(), "the call was stopped")
        return None

    _, checker = run_scene(scene, keep_for_retry=0)
    assert checker.finished == []


def test_a_retry_of_work_under_way_is_admitted_at_once(example_traces):
    """Admission counts only what is new: a retry whose trace is being checked waits behind
    nothing, even when the backlog of others would hold a new request."""
    trace = example_traces[4]

    async def scene(batcher, checker, clock):
        batcher.pace.observe(100.0, 1, 1)  # the pace says: 100 s a step, far past any deadline
        await unanswered(batcher, checker, clock, trace)
        retry = asyncio.ensure_future(batcher.submit([retried(trace, 1)], timeout=5.0))
        await asyncio.sleep(0)
        assert not batcher.held, "the retry was held behind its own work"
        checker.gate.set()
        return await retry

    (verdicts,), _ = run_scene(scene, when_overloaded="refuse")
    assert len(verdicts) == len(trace.steps)


def test_a_judge_that_cannot_be_reached_fails_its_work_at_once_and_is_found_again(
    example_traces,
):
    """The first connection refused (`EngineLimit.unreachable`, as the judge's transport
    reports it) fails the queued and running work with 503 `judge_down` at once, health says
    degraded, and new requests are refused at once; the judge is probed every second of the
    server's clock, and the first probe it answers lets the next request through. Work queued
    during the outage is never sent."""
    clock = ManualClock()
    limit, answers, probes = judge_to_probe(clock)
    running, queued, fresh = example_traces[5], example_traces[6], example_traces[7]

    async def scene(batcher, checker, clock):
        first = asyncio.ensure_future(batcher.submit([running], timeout=60.0))
        await until(lambda: checker.started, "the first check started")
        second = asyncio.ensure_future(batcher.submit([queued], timeout=60.0))
        await until(lambda: batcher.queue.qsize() == 1, "the second is queued")
        sent = clock.now()
        limit.unreachable("ConnectError: connection refused")  # from the judge's thread
        for request in (first, second):
            with pytest.raises(Busy) as refused:
                await request
            assert refused.value.reason == "judge_down"
        assert clock.now() == sent  # at once, not after a judge timeout
        assert batcher.health.status() == "degraded"
        with pytest.raises(Busy) as refused:
            await batcher.submit([fresh], timeout=60.0)
        assert refused.value.reason == "judge_down" and refused.value.retry_after == 1
        clock.advance(PROBE_EVERY)
        await until(lambda: len(probes) == 1, "the first probe")
        clock.advance(PROBE_EVERY)
        await until(lambda: len(probes) == 2, "the second probe")
        answers["now"] = True
        clock.advance(PROBE_EVERY)
        await until(lambda: batcher.health.status() == "ok", "found again")
        checker.gate.set()
        return await batcher.submit([fresh], timeout=60.0)

    (verdicts,), checker = run_scene(scene, clock, judge_limit=limit)
    assert len(verdicts) == len(fresh.steps)
    assert queued.id not in checker.started  # queued during the outage: never sent
    assert checker.started == [running.id, fresh.id]
    assert probes == [1001.0, 1002.0, 1003.0]


def test_a_request_may_be_held_while_the_judge_is_down_and_is_checked_once_it_is_back(
    example_traces,
):
    """`when_judge_down="hold"` (OpenRLHF's client spends its 5 blind tries, 1 s apart, inside
    a restart): a request without its own deadline is held while the judge cannot be reached,
    nothing sent, and checked once a probe finds the judge; one held past its time gets 503
    `judge_down`; a client that gave its own deadline is still refused at once."""
    clock = ManualClock()
    limit, answers, probes = judge_to_probe(clock)
    back_in_time, late, own_deadline = example_traces[5], example_traces[6], example_traces[7]

    async def tick() -> None:
        """One probe's time: the probe runs, and waits for the next."""
        seen = len(probes)
        clock.advance(PROBE_EVERY)
        await until(lambda: len(probes) == seen + 1, "the probe")
        await until(
            lambda: any(at == clock.now() + PROBE_EVERY for at, _ in clock.sleepers),
            "the next probe's wait",
        )

    async def scene(batcher, checker, clock):
        limit.unreachable("ConnectError: connection refused")
        await until(lambda: batcher._probing is not None, "probing")
        first = asyncio.ensure_future(batcher.submit([late]))  # 20 s: answered by 1018
        await until(lambda: len(batcher.held) == 1, "the first held")
        with pytest.raises(Busy) as refused:
            await batcher.submit([own_deadline], timeout=60.0)
        assert refused.value.reason == "judge_down"
        for _ in range(10):
            await tick()
        second = asyncio.ensure_future(batcher.submit([back_in_time]))  # answered by 1028
        await until(lambda: len(batcher.held) == 2, "the second held")
        for _ in range(8):
            await tick()
        with pytest.raises(Busy) as refused:
            await first
        assert refused.value.reason == "judge_down" and clock.now() == 1018.0
        assert not second.done() and not checker.started  # nothing sent while down
        answers["now"] = True
        clock.advance(PROBE_EVERY)
        await until(lambda: checker.started, "the held request admitted")
        checker.gate.set()
        return await second

    verdicts, checker = run_scene(
        scene, clock, judge_limit=limit, when_judge_down="hold", client_timeout=20.0
    )
    assert [len(v) for v in verdicts] == [len(back_in_time.steps)]
    assert checker.started == [back_in_time.id]
    assert probes[-1] == 1019.0
