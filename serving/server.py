"""`stepgap serve`: the checker and the reward over HTTP, micro-batched across clients.

Requests from many rollout workers are queued per trace and checked in micro-batches (up to
`max_batch` traces, waiting at most `max_wait_ms` for more), so the judge and the NLI model see
large batches. Up to `max_inflight` such checker calls run at once, and each trace is answered as
soon as its own steps are checked, not when its whole batch is. A judge behind a URL gets no more
requests at once than its engine serves (`EngineLimit`, in the judge).

A reward is only worth something before its client stops waiting. Each request has a deadline:
its `X-Stepgap-Timeout` header (seconds), else the server's `client_timeout` (OpenRLHF waits 180 s
and sends no header), and its traces carry it to the judge (`TraceDeadline`): their requests
time out at it, none is sent after it, and a client that hangs up has its requests in flight
closed. A request that the measured pace (`Pace`: the judge's own latency and requests in
flight) cannot answer in time is held until there is room, then admitted, or answered 503 with
Retry-After when its time runs out; a client that sent its own deadline, or a server with
`when_overloaded="refuse"`, gets that 503 at once. An idle server admits what comes. A request
still unanswered just before its deadline gets 503 then. Refusals and drops are counted in
`stepgap_rejected{reason}` and `stepgap_traces_dropped{reason}`. An oversized body gets 413.

A rollout with a failed step check has no reward (`StepGapReward.on_failed_check`): `/get_reward`
answers 503, `/reward` gives `null` and the reason; `/health` says `degraded` while the judge
fails. At start, `serve` probes the judge and prints what it can answer in a client's time.

SIGTERM (`serve`) stops taking requests, answers 503 to the queued and held ones, lets the checks
in flight finish for up to `grace` seconds, answers 503 to what is left, and exits.

Steps while the rollout runs (`serving.streaming`): `POST /steps` takes a rollout's text so far
and answers at once while its complete steps are checked; `/reward` with `trace_ids` then reuses
those answers, under the same deadline rules; `DELETE /steps/{trace_id}` drops an abandoned one.

Routes: `/check`, `/reward`, `/get_reward` (OpenRLHF's remote reward protocol), `/steps`,
`/health`, `/metrics` (Prometheus), `/view` (an HTML page of the last `view_keep` checked
traces).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

try:  # the `serve` extra; at module level so FastAPI can resolve the routes' annotations
    from starlette.requests import Request
except ImportError:  # pragma: no cover - without the extra, create_app says what to install
    Request = Any  # type: ignore[misc,assignment]

from stepgap.reward import RewardResult
from stepgap.schema import Trace, Verdict
from stepgap.teacher.judges.base import TraceDeadline
from stepgap.teacher.judges.concurrency import EngineLimit

from .api import (
    CheckRequest,
    CheckResponse,
    HealthResponse,
    JudgeHealth,
    OpenRLHFRequest,
    OpenRLHFResponse,
    RewardRequest,
    RewardResponse,
    StepsRequest,
    StepsResponse,
    reward_response,
    rollout_traces,
    segmented_traces,
)
from .openrlhf import openrlhf_batch, openrlhf_response
from .reward import RewardUnavailable, StepGapReward, default_inflight
from .streaming import StreamingReward

log = logging.getLogger(__name__)

TIMEOUT_HEADER = "X-Stepgap-Timeout"
# OpenRLHF 0.11's remote reward client waits 180 s in all (aiohttp total=180), 5 tries 1 s apart
OPENRLHF_TIMEOUT = 180.0
HOLD_POLL_S = 0.25  # how often a held request looks again whether it fits
WHEN_OVERLOADED = ("hold", "refuse")  # what a request that does not fit now gets
FIRST = asyncio.FIRST_COMPLETED

Stream = Callable[
    [Sequence[Trace], threading.Event, Sequence[TraceDeadline]], Iterator[tuple[int, list[Verdict]]]
]


class Busy(RuntimeError):
    """The request cannot be answered in time: 503 with Retry-After. `reason` is what the
    metrics count: queue_full, overloaded (the backlog outlasts the deadline), deadline (not
    checked in time), shutdown."""

    def __init__(self, reason: str, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = max(1, math.ceil(retry_after))


@dataclass(eq=False)
class _Item:
    """A queued trace; its request cancels `future` when the client leaves or its deadline
    passes, which cancels `deadline` too: the workers skip (or stop checking) cancelled items,
    and the judge closes their requests in flight and sends no more."""

    trace: Trace
    future: asyncio.Future
    deadline: TraceDeadline = field(default_factory=TraceDeadline)

    @property
    def steps(self) -> int:
        return len(self.trace.steps or [])


@dataclass
class Pace:
    """How fast this server checks steps: enough to tell a new request whether its traces can
    come back before its deadline.

    A judge that measures its own requests (one behind a URL: its `EngineLimit`) gives the rate
    itself: its requests in flight over their latency (Little's law), measured on the requests
    the engine served, never on time spent waiting in this server's queue. Any other judge (a
    model in this process, one call at a time) is measured on whole calls: a call's steps over
    its seconds. Either way, an estimate is only asked while work is queued or in flight: an
    idle server admits what comes (the next request measures the judge again), so it never
    keeps refusing on an old figure.
    """

    judge: EngineLimit | None = None  # the judge's own measure, when it keeps one
    calls: float | None = None  # steps per second over whole calls (moving average)
    weight: float = 0.3  # of the newest call in the moving average

    def observe(self, seconds: float, steps: int) -> None:
        """A whole call of `steps` steps took `seconds`."""
        if steps <= 0 or seconds <= 0:
            return
        rate, w = steps / seconds, self.weight
        self.calls = rate if self.calls is None else (1 - w) * self.calls + w * rate

    def rate(self) -> tuple[float, float] | None:
        """(steps per second, seconds of one step's own round trip), or None before anything
        was measured."""
        if self.judge is not None and (per_second := self.judge.throughput()) is not None:
            return per_second, self.judge.typical_latency() or 0.0
        if self.calls is not None:
            return self.calls, 1 / self.calls
        return None

    def seconds_per_step(self) -> float | None:
        rate = self.rate()
        return None if rate is None else 1 / rate[0]

    def estimate(self, ahead: int, steps: int) -> float | None:
        """Seconds until `steps` more steps are checked behind `ahead` queued or in flight;
        None before anything was measured."""
        rate = self.rate()
        if rate is None:
            return None
        per_second, round_trip = rate
        return (ahead + steps) / per_second + round_trip


@dataclass(eq=False)
class _Call:
    """One checker call in flight: its items and the event that stops it early."""

    items: list[_Item]
    stop: threading.Event = field(default_factory=threading.Event)

    def maybe_stop(self, _: Any = None) -> None:
        """Stop the call once none of its traces is still wanted: each one answered or dropped,
        at least one dropped (its client hung up or its deadline passed)."""
        futures = [i.future for i in self.items]
        if all(f.done() for f in futures) and any(f.cancelled() for f in futures):
            self.stop.set()


class MicroBatcher:
    """Collects traces from concurrent requests into micro-batches, runs up to `max_inflight`
    checker calls at once, and answers each trace as soon as its own verdicts are in.

    `check` is a plain `check(traces) -> verdicts per trace`, or `stream` yields
    (position, verdicts) per trace as they finish (`StepGapReward.check_stream`)."""

    def __init__(
        self,
        check: Callable[[Sequence[Trace]], list[list[Verdict]]] | None = None,
        *,
        stream: Stream | None = None,
        max_batch: int = 32,
        max_wait_ms: float = 10.0,
        max_queue: int = 1024,
        max_inflight: int = 1,
        client_timeout: float = OPENRLHF_TIMEOUT,
        on_batch: Callable[[int], None] | None = None,
        on_drop: Callable[[str, int], None] | None = None,
        judge_limit: EngineLimit | None = None,
        when_overloaded: str = "hold",
    ) -> None:
        if (check is None) == (stream is None):
            raise ValueError("give one of check or stream")
        if max_inflight < 1 or max_batch < 1:
            raise ValueError("max_inflight and max_batch must be at least 1")
        if client_timeout <= 0:
            raise ValueError(f"client_timeout must be positive, got {client_timeout}")
        if when_overloaded not in WHEN_OVERLOADED:
            raise ValueError(f"when_overloaded must be hold or refuse, got {when_overloaded!r}")
        self.when_overloaded = when_overloaded
        self.stream: Stream = stream or _stream_of(check)  # type: ignore[arg-type]
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.max_inflight = max_inflight
        self.client_timeout = client_timeout
        self.on_batch = on_batch
        self.on_drop = on_drop
        self.pace = Pace(judge=judge_limit)
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.queued_steps = 0  # steps of the queued traces
        self.held: list[tuple[object, int]] = []  # requests waiting to be admitted, in order
        self.health = JudgeHealth()  # whether the judge works, from the last checked request
        self.calls: set[_Call] = set()
        self.closing = False
        self._workers: list[asyncio.Task] = []  # the collector and the calls it started
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._workers = [asyncio.create_task(self._collect())]

    def close(self, grace: float = 30.0) -> None:
        """Stop taking traces: the queued ones are answered 503 now, the calls in flight may
        finish for `grace` seconds, then what is left is answered 503 too (on the loop)."""
        if self.closing:
            return
        self.closing = True
        queued = 0
        while not self.queue.empty():
            item = self.queue.get_nowait()
            self.queued_steps -= item.steps
            if not item.future.done():
                queued += 1
            _fail(item, Busy("shutdown", "the server is shutting down"))
        log.warning(
            "shutting down: %d queued trace(s) answered 503; %d checker call(s) in flight get "
            "%g s to finish",
            queued,
            len(self.calls),
            grace,
        )
        asyncio.get_running_loop().call_later(grace, self._stop_calls)

    def close_threadsafe(self, grace: float = 30.0) -> None:
        """`close` from a signal handler or another thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.close, grace)

    def _stop_calls(self) -> None:
        for call in list(self.calls):
            call.stop.set()
            for item in call.items:
                _fail(item, Busy("shutdown", "the server is shutting down"))

    async def stop(self) -> None:
        """Close at once (no grace) and end the workers; checker threads are not waited for."""
        self.close(grace=0)
        self._stop_calls()
        for task in list(self._workers):
            task.cancel()
        for task in list(self._workers):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ requests
    async def submit(
        self,
        traces: Sequence[Trace],
        until_gone: Callable[[], Awaitable[None]] | None = None,
        timeout: float | None = None,
    ) -> list[list[Verdict]] | None:
        """Verdicts per trace, or None when the client hung up first (`until_gone` returns an
        awaitable that finishes when it does). Raises `Busy` when they cannot come back within
        `timeout` seconds (default `client_timeout`): at once for a client that gave its own
        `timeout` (it can act on a refusal: another replica, Retry-After) or with
        `when_overloaded="refuse"`, else once the request has been held as long as its deadline
        allows (see `_admit`)."""
        budget = self.client_timeout if timeout is None else timeout
        if self.closing:
            raise Busy("shutdown", "the server is shutting down")
        if self.queue.qsize() + len(traces) > self.max_queue:
            raise Busy("queue_full", f"{self.queue.qsize()} traces queued (max {self.max_queue})")
        # answer a little before the client's own timeout, so that a 503 reaches it first
        usable = budget - min(2.0, 0.1 * budget)
        until = time.monotonic() + usable
        steps = sum(len(t.steps or []) for t in traces)
        gone = asyncio.ensure_future(until_gone()) if until_gone is not None else None
        try:
            refuse = timeout is not None or self.when_overloaded == "refuse"
            if not await self._admit(steps, until, budget, refuse, gone):
                return None  # the client left while its request was held
            return await self._answer(traces, until, budget, gone)
        finally:
            if gone is not None:
                gone.cancel()

    async def _admit(
        self,
        steps: int,
        until: float,
        budget: float,
        refuse_at_once: bool,
        gone: asyncio.Future | None,
    ) -> bool:
        """Whether a request of `steps` steps may join the queue: when the measured pace
        answers it, behind what is queued, in flight or held before it, well inside its time
        (the pace is an average). An idle server admits what comes (the request measures the
        judge again), so an old figure never keeps it refusing. A request that does not fit is
        refused at once (`refuse_at_once`), or else held, costing the judge nothing, until it
        fits or its time runs out (`Busy`): a client that retries blindly, as OpenRLHF's does
        (5 tries, 1 s apart), keeps its tries for when there is room. False: the client left
        while held."""
        ticket = object()
        self.held.append((ticket, steps))
        try:
            while True:
                position = next(i for i, (t, _) in enumerate(self.held) if t is ticket)
                ahead = self.steps_ahead() + sum(s for _, s in self.held[:position])
                left = until - time.monotonic()
                expected = self.pace.estimate(ahead, steps) if ahead else None
                if self.closing:
                    raise Busy("shutdown", "the server is shutting down")
                if expected is None or expected <= 0.8 * left:
                    return True
                if refuse_at_once or left <= HOLD_POLL_S:
                    raise Busy(
                        "overloaded",
                        f"{ahead} steps queued or in flight: about {expected:.1f} s to answer, "
                        f"past this request's {budget:g} s deadline",
                        retry_after=min(expected - 0.8 * left, 60.0),
                    )
                if gone is not None:
                    await asyncio.wait({gone}, timeout=HOLD_POLL_S)
                    if gone.done():
                        return False
                else:
                    await asyncio.sleep(HOLD_POLL_S)
        finally:
            self.held = [(t, s) for t, s in self.held if t is not ticket]

    async def _answer(
        self, traces: Sequence[Trace], until: float, budget: float, gone: asyncio.Future | None
    ) -> list[list[Verdict]] | None:
        """Queue the traces and wait for their verdicts until `until`; None if the client left."""
        if self.closing:  # the queue was answered 503 already; nothing more joins it
            raise Busy("shutdown", "the server is shutting down")
        loop = asyncio.get_running_loop()
        items = [_Item(t, loop.create_future(), TraceDeadline(until)) for t in traces]
        for item in items:
            # a trace nobody waits for any more (deadline, client gone): its judge requests end
            item.future.add_done_callback(_cancel_deadline_of(item))
            self.queue.put_nowait(item)
            self.queued_steps += item.steps
        answers = asyncio.gather(*(i.future for i in items))
        answers.add_done_callback(_retrieve)
        waiting: set[asyncio.Future] = {answers}
        if gone is not None:
            waiting.add(gone)
        try:
            await asyncio.wait(
                waiting, timeout=max(0.0, until - time.monotonic()), return_when=FIRST
            )
        except asyncio.CancelledError:  # the request's task itself (a forced shutdown)
            for item in items:
                item.future.cancel()
            raise
        if answers.done():
            error = answers.exception()
            if error is None:
                return list(answers.result())
            for item in items:  # Busy (the server closed) or a fault: the rest is not wanted
                item.future.cancel()
            raise error
        reason = "client_gone" if gone is not None and gone.done() else "deadline"
        dropped = sum(1 for i in items if not i.future.done())
        for item in items:
            item.future.cancel()  # the workers skip them; a call with none left stops
        if self.on_drop is not None and dropped:
            self.on_drop(reason, dropped)
        if reason == "client_gone":
            return None
        raise Busy("deadline", f"not checked within its {budget:g} s deadline")

    def steps_ahead(self) -> int:
        """Steps queued or in flight and still wanted: what a new request waits behind."""
        running = sum(i.steps for c in self.calls for i in c.items if not i.future.done())
        return self.queued_steps + running

    # ------------------------------------------------------------------ workers
    async def _get(self) -> _Item:
        item = await self.queue.get()
        self.queued_steps -= item.steps
        return item

    async def _next_batch(self) -> list[_Item]:
        loop = asyncio.get_running_loop()
        batch = [await self._get()]
        until = loop.time() + self.max_wait
        while len(batch) < self.max_batch:
            timeout = until - loop.time()
            if timeout <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._get(), timeout))
            except asyncio.TimeoutError:
                break
        # a client that hung up or timed out cancelled its items: they are not checked
        return [i for i in batch if not i.future.done()]

    async def _collect(self) -> None:
        """One collector forms every batch, so traces that arrive together share a call. It
        waits for a free call slot first: while all `max_inflight` calls run, traces queue and
        the next batch takes up to `max_batch` of them at once."""
        slots = asyncio.Semaphore(self.max_inflight)
        while True:
            await slots.acquire()
            batch = await self._next_batch()
            if not batch:
                slots.release()
                continue
            task = asyncio.create_task(self._run(batch))
            self._workers.append(task)
            task.add_done_callback(lambda t: (slots.release(), self._workers.remove(t)))

    async def _run(self, batch: list[_Item]) -> None:
        """One checker call in a thread of its own; each trace answered as it comes."""
        loop = asyncio.get_running_loop()
        call = _Call(batch)
        for item in batch:
            item.future.add_done_callback(call.maybe_stop)
        finished = loop.create_future()
        started = time.monotonic()
        answered = 0

        def deliver(position: int, verdicts: list[Verdict]) -> None:
            nonlocal answered
            answered += 1
            future = batch[position].future
            if not future.done():
                future.set_result(verdicts)

        def end(error: BaseException | None) -> None:
            if answered == len(batch):  # a whole call: what the next requests can expect
                self.pace.observe(time.monotonic() - started, sum(i.steps for i in batch))
            for item in batch:  # a trace the call never answered (a fault in the call itself)
                _fail(item, error or RuntimeError("the checker gave no verdicts for this trace"))
            if not finished.done():
                finished.set_result(None)

        def work() -> None:
            error: BaseException | None = None
            try:
                traces, deadlines = [i.trace for i in batch], [i.deadline for i in batch]
                for position, verdicts in self.stream(traces, call.stop, deadlines):
                    _call_soon(loop, deliver, position, verdicts)
            except BaseException as exc:  # noqa: BLE001 - every waiting request learns of it
                log.exception("checker failed on a batch of %d", len(batch))
                error = exc
            _call_soon(loop, end, error)

        if self.on_batch is not None:
            self.on_batch(len(batch))
        self.calls.add(call)
        try:
            threading.Thread(target=work, name="stepgap-serve-check", daemon=True).start()
            await finished
        finally:
            self.calls.discard(call)


def _stream_of(check: Callable[[Sequence[Trace]], list[list[Verdict]]]) -> Stream:
    """A plain `check` as a stream: every trace of a call comes back when the call returns."""

    def stream(
        traces: Sequence[Trace], stop: threading.Event, deadlines: Sequence[TraceDeadline]
    ) -> Iterator[tuple[int, list[Verdict]]]:
        yield from enumerate(check(traces))

    return stream


def _cancel_deadline_of(item: _Item) -> Callable[[asyncio.Future], None]:
    def cancel(future: asyncio.Future) -> None:
        if future.cancelled():
            item.deadline.cancel()

    return cancel


def _fail(item: _Item, error: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(error)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
        loop.call_soon_threadsafe(fn, *args)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def _until_disconnected(request: Any) -> None:
    """Returns when the client hangs up (the body is already read, so the next ASGI message
    is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class RecentTraces:
    """The last `keep` checked traces with their verdicts (and rewards, from the reward routes):
    what `GET /view` shows. Each is kept as the page draws it (`stepgap.eval.view_data.trace_view`:
    steps, evidence, verdicts, answer and EM; not the raw response) in a deque of at most `keep`,
    so a long-running server holds a bounded amount; older traces are dropped as new ones come."""

    def __init__(self, keep: int = 100) -> None:
        if keep < 0:
            raise ValueError(f"view_keep must be >= 0, got {keep}")
        self.items: deque[dict[str, Any]] = deque(maxlen=keep)
        self._seq = itertools.count(1)

    def add(self, trace: Trace, verdicts: Sequence[Verdict], result: RewardResult | None) -> None:
        from stepgap.eval.view_data import RewardLine, trace_view

        if self.items.maxlen == 0:
            return
        # Rollouts of different requests share ids (`reward-0`): number them so they stay apart.
        tid = f"#{next(self._seq)} {trace.id}"
        self.items.append(
            trace_view(
                trace.model_copy(update={"id": tid}),
                {"served": [v.model_copy(update={"trace_id": tid}) for v in verdicts]},
                reward=(
                    None
                    if result is None
                    else RewardLine.model_validate({**result.as_dict(), "trace_id": tid})
                ),
            )
        )

    def __len__(self) -> int:
        return len(self.items)

    def render(self) -> str:
        """The page (`stepgap.eval.view_page.render_html`), newest trace first."""
        from stepgap.eval.view_data import page_data
        from stepgap.eval.view_page import render_html

        items = list(reversed(self.items))
        title = f"stepgap serve: the last {len(items)} checked traces (of at most "
        return render_html(page_data(items, ["served"], title=f"{title}{self.items.maxlen})"))


def _timeout_of(request: Any) -> float | None:
    """The client's own deadline in seconds (`X-Stepgap-Timeout`), if it sent one."""
    value = request.headers.get(TIMEOUT_HEADER)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        from fastapi import HTTPException

        raise HTTPException(422, f"{TIMEOUT_HEADER} must be a positive number of seconds")
    return seconds


def judge_limit_of(reward: StepGapReward) -> EngineLimit | None:
    """The judge's own limit of requests in flight, which measures its latency (a judge behind
    a URL); None for a judge in this process."""
    limit = getattr(getattr(reward.checker, "judge", None), "limit", None)
    return limit if isinstance(limit, EngineLimit) else None


def create_app(
    reward: StepGapReward,
    *,
    max_batch: int = 32,
    max_wait_ms: float = 10.0,
    max_queue: int = 1024,
    max_inflight: int | None = None,
    client_timeout: float = OPENRLHF_TIMEOUT,
    max_body_bytes: int = 8 * 1024 * 1024,
    view_keep: int = 100,
    when_overloaded: str = "hold",
) -> Any:
    """The FastAPI app (see the module docstring); `max_inflight` defaults to
    `default_inflight(reward)`, `view_keep` bounds how many checked traces `GET /view` keeps."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )

    registry = CollectorRegistry()
    requests_total = Counter(
        "stepgap_requests", "HTTP requests by route", ["route"], registry=registry
    )
    rejected = Counter(
        "stepgap_rejected",
        "requests not answered with rewards: too_large, queue_full, overloaded (the backlog "
        "outlasts the deadline), deadline (not checked in time), shutdown, client_gone, "
        "no_reward (a step check failed: OpenRLHF's route)",
        ["reason"],
        registry=registry,
    )
    failed_traces = Counter(
        "stepgap_traces_failed",
        "traces with a failed step check (a judge that is down, an answer that cannot be "
        "parsed): no reward, unless on_failed_check=zero",
        registry=registry,
    )
    dropped = Counter(
        "stepgap_traces_dropped",
        "traces left unchecked because their client hung up or their deadline passed",
        ["reason"],
        registry=registry,
    )
    traces_total = Counter("stepgap_traces_checked", "traces checked", registry=registry)
    batch_size = Histogram(
        "stepgap_batch_size",
        "traces per checker call",
        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        registry=registry,
    )
    queue_depth = Gauge("stepgap_queue_depth", "traces waiting for a batch", registry=registry)

    def on_batch(n: int) -> None:
        batch_size.observe(n)
        traces_total.inc(n)

    judge_limit = judge_limit_of(reward)
    # a checker fault becomes error verdicts, never a 500
    batcher = MicroBatcher(
        stream=lambda traces, stop, deadlines: reward.check_stream(
            traces, stop=stop, deadlines=deadlines
        ),
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        max_inflight=max_inflight or default_inflight(reward),
        client_timeout=client_timeout,
        on_batch=on_batch,
        on_drop=lambda reason, n: dropped.labels(reason).inc(n),
        judge_limit=judge_limit,
        when_overloaded=when_overloaded,
    )
    queue_depth.set_function(batcher.queue.qsize)
    in_flight = Gauge("stepgap_checks_in_flight", "checker calls running", registry=registry)
    in_flight.set_function(lambda: len(batcher.calls))
    step_seconds = Gauge(
        "stepgap_seconds_per_step",
        "seconds the server needs per step at its measured rate (what admission plans with; "
        "0 before the first measure)",
        registry=registry,
    )
    step_seconds.set_function(lambda: batcher.pace.seconds_per_step() or 0.0)
    if judge_limit is not None:
        judge_in_flight = Gauge(
            "stepgap_judge_limit",
            "judge requests in flight at most over all calls (the engine's slots plus a margin, "
            "where known; 0: no limit beyond each call's --concurrency)",
            registry=registry,
        )
        judge_in_flight.set_function(lambda: judge_limit.limit or 0)
    engine = getattr(getattr(reward.checker, "judge", None), "engine", None)
    if getattr(engine, "online", False):  # vLLM's async engine in this process
        Gauge(
            "stepgap_engine_requests",
            "judge requests in the in-process engine now (running or waiting)",
            registry=registry,
        ).set_function(engine.unfinished)
        Gauge(
            "stepgap_engine_aborted",
            "judge requests aborted inside the engine (deadline passed, client gone, shutdown)",
            registry=registry,
        ).set_function(lambda: engine.aborted)
    health_of_judge = batcher.health

    # steps checked while the rollout runs (/steps), where the checker can check them one by one
    inline = (
        StreamingReward(reward)
        if reward.variant != "search_only" and StreamingReward.supports(reward.checker)
        else None
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        batcher.start()
        yield
        await batcher.stop()
        if inline is not None:  # the steps not yet sent are dropped: nobody waits for them
            inline.close(wait=False)

    from stepgap import __version__

    app = FastAPI(
        title="stepgap",
        version=__version__,
        description="Step-level gap checking (CC / IE / MB) and the typed GRPO process reward, "
        "micro-batched across clients. A request that cannot be answered before its deadline "
        f"(the `{TIMEOUT_HEADER}` header in seconds, else {client_timeout:g} s) is answered 503 "
        "with Retry-After.",
        lifespan=lifespan,
    )
    app.state.batcher = batcher
    recent = RecentTraces(view_keep)
    app.state.recent = recent

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Any:
        length = request.headers.get("content-length")
        if length is not None and int(length) > max_body_bytes:
            rejected.labels("too_large").inc()
            return JSONResponse(
                {"detail": f"request body over {max_body_bytes} bytes"}, status_code=413
            )
        return await call_next(request)

    async def checked(traces: list[Trace], route: str, request: Request) -> list[list[Verdict]]:
        requests_total.labels(route).inc()
        try:
            verdicts = await batcher.submit(
                traces, lambda: _until_disconnected(request), _timeout_of(request)
            )
            if verdicts is not None:
                health_of_judge.observe(verdicts)
        except Busy as exc:
            rejected.labels(exc.reason).inc()
            raise HTTPException(
                503, str(exc), headers={"Retry-After": str(exc.retry_after)}
            ) from None
        if verdicts is None:  # nobody is listening any more; nginx's "client closed request"
            rejected.labels("client_gone").inc()
            raise HTTPException(499, "client disconnected")
        return verdicts

    async def rewards(
        responses: list[str], questions: list[str], golden: list[Any], route: str, request: Request
    ) -> list[Any]:
        try:
            traces = rollout_traces(reward, responses, questions, golden, route)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        if reward.variant == "search_only":
            return reward.score_traces(traces)
        verdicts = await checked(traces, route, request)
        results = [reward.result(t, v) for t, v in zip(traces, verdicts, strict=True)]
        for t, vs, r in zip(traces, verdicts, results, strict=True):
            recent.add(t, vs, r)
        failed_traces.inc(sum(r.failed_checks > 0 for r in results))
        return results

    @app.post("/check", response_model=CheckResponse, summary="verdicts for every step")
    async def check(body: CheckRequest, request: Request) -> dict[str, Any]:
        try:
            segmented = segmented_traces(body.traces)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        verdicts = await checked(segmented, "check", request)
        for t, vs in zip(segmented, verdicts, strict=True):
            recent.add(t, vs, None)
        return {"verdicts": [[v.model_dump(mode="json") for v in vs] for vs in verdicts]}

    async def finalized(body: RewardRequest, request: Request) -> list[Any]:
        """`/reward` for rollouts whose steps came to `/steps`: each finalized, reusing the
        answers made while it ran; the deadline and a gone client hold as for `/reward`."""
        assert inline is not None and body.trace_ids is not None
        requests_total.labels("reward").inc()
        try:
            traces = rollout_traces(reward, body.responses, body.questions, body.golden_answers,
                                    "reward", body.trace_ids)  # fmt: skip
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        seconds = _timeout_of(request) or client_timeout
        deadline = TraceDeadline.after(seconds)
        work = asyncio.ensure_future(
            asyncio.gather(*(asyncio.to_thread(inline.finalize, t, deadline) for t in traces))
        )
        gone = asyncio.ensure_future(_until_disconnected(request))
        done, _ = await asyncio.wait({work, gone}, timeout=seconds, return_when=FIRST)
        gone.cancel()
        if work not in done:
            deadline.cancel()  # the judge sends nothing more for these rollouts
            if gone in done:
                rejected.labels("client_gone").inc()
                raise HTTPException(499, "client disconnected")
            rejected.labels("deadline").inc()
            raise HTTPException(
                503,
                f"not checked within the request's {seconds:g} s deadline",
                headers={"Retry-After": "1"},
            )
        results = work.result()
        for t, r in zip(traces, results, strict=True):
            recent.add(t, [], r)
        failed_traces.inc(sum(r.failed_checks > 0 for r in results))
        return results

    @app.post("/reward", response_model=RewardResponse, summary="rewards for rollouts")
    async def reward_route(body: RewardRequest, request: Request) -> dict[str, Any]:
        if body.trace_ids is not None and inline is not None:
            return reward_response(await finalized(body, request))
        results = await rewards(
            body.responses, body.questions, body.golden_answers, "reward", request
        )
        return reward_response(results)

    @app.post(
        "/steps",
        response_model=StepsResponse,
        summary="a rollout's text so far: its complete steps are checked while it goes on",
    )
    async def steps(body: StepsRequest) -> dict[str, Any]:
        requests_total.labels("steps").inc()
        if inline is None:
            raise HTTPException(
                404,
                "this server checks whole rollouts only: its checker cannot check steps one by "
                "one (the search_only variant, or a checker without its own judge)",
            )
        try:
            n = await asyncio.to_thread(
                inline.submit_response, body.trace_id, body.question, body.response
            )
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return {"trace_id": body.trace_id, "submitted": n, "rollouts": inline.unfinished()}

    @app.delete("/steps/{trace_id}", summary="forget a rollout whose reward will not be asked")
    async def drop_steps(trace_id: str) -> dict[str, Any]:
        requests_total.labels("steps").inc()
        dropped_now = inline.drop(trace_id) if inline is not None else 0
        if dropped_now:
            dropped.labels("abandoned").inc(dropped_now)
        return {"trace_id": trace_id, "dropped": dropped_now}

    @app.post(
        "/get_reward", response_model=OpenRLHFResponse, summary="OpenRLHF's remote reward protocol"
    )
    async def get_reward(body: OpenRLHFRequest, request: Request) -> dict[str, Any]:
        try:
            responses, questions, golden = openrlhf_batch(body.query, body.prompts, body.labels)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        results = await rewards(responses, questions, golden, "get_reward", request)
        try:
            return openrlhf_response(results)
        except RewardUnavailable as exc:  # OpenRLHF's "no reward": it retries, then gives None
            rejected.labels("no_reward").inc()
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None

    @app.get("/health", response_model=HealthResponse, summary="liveness and queue depth")
    async def health() -> dict[str, Any]:
        status = "closing" if batcher.closing else health_of_judge.status()
        return {
            "status": status,
            "variant": reward.variant,
            "lam": reward.lam,
            "on_failed_check": reward.on_failed_check,
            "queued": batcher.queue.qsize(),
            "in_flight": len(batcher.calls),
            "failed_checks": reward.failures["failed_checks"],
            "judge_failure": health_of_judge.failure,
            "judge_limit": None if judge_limit is None else judge_limit.describe(),
        }

    @app.get(
        "/view",
        response_class=HTMLResponse,
        summary="the last checked traces as a page (stepgap view)",
    )
    async def view():  # no return annotation: FastAPI would read it as a body model
        requests_total.labels("view").inc()
        return HTMLResponse(recent.render())

    @app.get(
        "/metrics",
        response_class=Response,
        summary="Prometheus metrics: requests, batch sizes, queue depth, rejections",
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    )
    async def metrics():  # no return annotation: FastAPI would read it as a body model
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


# A trace of two steps the server asks its judge about at start: what one step takes.
PROBE = Trace(
    id="stepgap-probe",
    question="What is the capital of France?",
    golden_answers=["Paris"],
    response="<think>I need the capital of France.</think><search>capital of France</search>"
    '\n\n<information>Doc 1(Title: "France") Paris is the capital and largest city of France.'
    "</information>\n\n<think>The capital of France is Paris.</think><answer>Paris</answer>",
)
ROLLOUT_STEPS = 3  # a Search-R1 rollout's steps, for the figure `stepgap serve` prints


def probe_capacity(
    reward: StepGapReward, batcher: MicroBatcher, client_timeout: float, wait: float = 60.0
) -> str:
    """Ask the judge (stages A-C) about `PROBE` and say what the server can answer within a
    client's `client_timeout`: the steps (and rollouts of `ROLLOUT_STEPS` steps) that the
    measured latency and the requests in flight allow. A judge that fails the probe, or does
    not answer it within `wait` seconds, marks the server's health degraded and is named."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as Waited

    from stepgap.segment import segment_trace

    trace = segment_trace(PROBE)
    ask = getattr(reward.checker, "judge_traces", None)
    if ask is None:  # a remote checker: its server probes its own judge
        return "the checker is remote; its servers report their own judges"
    started = time.monotonic()
    pool = ThreadPoolExecutor(1)
    try:
        (results,) = pool.submit(ask, [trace]).result(timeout=wait)
        failure = next((r.error for r in results if r.judge is None), None)
    except Waited:
        results, failure = [], f"no answer within {wait:g} s"
    except Exception as exc:  # noqa: BLE001 - a judge that cannot answer is reported, not fatal
        results, failure = [], f"{type(exc).__name__}: {exc}"
    finally:
        pool.shutdown(wait=False)
    seconds = time.monotonic() - started
    if failure is not None:
        batcher.health.failure = failure
        return f"the judge did not answer a probe of {len(trace.steps or [])} steps: {failure}"
    verdicts = results
    limit = batcher.pace.judge
    latency = limit.typical_latency() if limit is not None else None
    if limit is not None and latency:
        at_once = limit.limit or batcher.max_inflight * int(
            getattr(reward.checker.judge, "concurrency", 1)
        )
        per_second, how = at_once / latency, f"{latency:.1f} s a request, {limit.describe()}"
    else:
        per_second, how = len(verdicts) / seconds, f"{seconds / len(verdicts):.1f} s a step"
    usable = client_timeout - min(2.0, 0.1 * client_timeout)
    steps = int(0.8 * usable * per_second)
    return (
        f"a probe of {len(verdicts)} steps took {seconds:.1f} s ({how}): about {steps} steps, "
        f"or {steps // ROLLOUT_STEPS} rollouts of {ROLLOUT_STEPS}, are answered within the "
        f"{client_timeout:g} s a client waits; more are held, then answered 503"
    )


def serve(
    reward: StepGapReward,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int = 32,
    max_wait_ms: float = 10.0,
    max_queue: int = 1024,
    max_inflight: int | None = None,
    client_timeout: float = OPENRLHF_TIMEOUT,
    grace: float = 30.0,
    max_body_mb: int = 8,
    view_keep: int = 100,
    when_overloaded: str = "hold",
) -> None:
    """Run the app with uvicorn until SIGTERM or Ctrl-C (`stepgap serve`); shutting down takes
    at most `grace` seconds (see the module docstring)."""
    from stepgap.teacher.judges.replay import ReplayJudge

    if isinstance(getattr(reward.checker, "judge", None), ReplayJudge):
        raise ValueError(
            "a replay judge answers by trace id, and the rollouts the server scores get new ids "
            "(reward-0, get_reward-0, ...): every step would fail. Serve a model judge "
            "(--judge openai:MODEL, hf:PATH, student:PATH) or an exported --bundle"
        )
    if grace < 0:
        raise ValueError(f"grace must be >= 0 seconds, got {grace}")
    import uvicorn

    app = create_app(
        reward,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        max_inflight=max_inflight,
        client_timeout=client_timeout,
        max_body_bytes=max_body_mb * 1024 * 1024,
        view_keep=view_keep,
        when_overloaded=when_overloaded,
    )
    batcher: MicroBatcher = app.state.batcher
    print(f"stepgap serve: {probe_capacity(reward, batcher, client_timeout)}", file=sys.stderr)
    if batcher.health.failure is not None:
        print("stepgap serve: /health says degraded until the judge answers", file=sys.stderr)

    class Server(uvicorn.Server):
        """uvicorn's server, which on SIGTERM/SIGINT also closes the batcher: the queued
        requests are answered 503 at once instead of being checked for nobody; and closes
        the judge's engine last."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            batcher.close_threadsafe(grace)

        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets)
            # an engine in this process (vLLM) ends its own processes with the server; here,
            # since uvicorn ends the process with the signal it caught once it returns
            close = getattr(getattr(reward.checker, "judge", None), "close", None)
            if close is not None:
                await asyncio.to_thread(close)

    # uvicorn's own wait for open requests outlasts the batcher's grace by a little: by then
    # every request has its answer (verdicts or 503) and only the write is left
    config = uvicorn.Config(
        app, host=host, port=port, log_level="info", timeout_graceful_shutdown=grace + 2
    )
    Server(config).run()
