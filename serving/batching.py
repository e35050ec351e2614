"""The micro-batcher behind `stepgap serve`: traces from many requests, queued and checked in
batches, each answered as soon as its own steps are checked, within its request's deadline.

`MicroBatcher.submit(traces, deadline)` (async) queues a request's traces and returns their
verdicts. A worker thread takes up to `max_batch` traces (waiting at most `max_wait_ms` for
more) per checker call, up to `max_inflight` calls at once. `Pace` measures how fast the checker
answers (a judge behind a URL: its own `EngineLimit`), so a request the backlog cannot answer by
its deadline is held until there is room, or refused at once (`Busy`, which the server answers
503 with Retry-After). A trace's checking is a `Work` (`work.py`), shared by the requests that
send the same trace: a request that ends unanswered (its deadline passed, its client left)
leaves its work running for a retry, `keep_for_retry` seconds, before it is abandoned (the
workers skip it, and the judge sends nothing more for it). While the judge server cannot be
reached, its queued and running work fails at once and new requests are refused at once (503;
or held until it answers, `when_judge_down="hold"`), and the judge is probed every
`PROBE_EVERY` seconds until it answers. Nothing here knows HTTP:
the server (`server.py`) maps requests and `Busy` onto routes. Every
time here (deadlines, holds, the wait for a batch, the pace) is read and waited on through one
`stepgap.clock.Clock`, the machine's unless a test gives its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepgap.clock import SYSTEM, Clock, TraceDeadline
from stepgap.schema import Trace, Verdict
from stepgap.teacher.judges.concurrency import EngineLimit

from .api import JudgeHealth
from .pace import Pace
from .work import KEEP_FOR_RETRY, Work, Works, content_key

log = logging.getLogger(__name__)

# OpenRLHF 0.11's remote reward client waits 180 s in all (aiohttp total=180), 5 tries 1 s apart
OPENRLHF_TIMEOUT = 180.0
HOLD_POLL_S = 0.25  # how often a held request looks again whether it fits, at the latest
WHEN_OVERLOADED = ("hold", "refuse")  # what a request that does not fit now gets
WHEN_JUDGE_DOWN = ("refuse", "hold")  # what a request gets while the judge cannot be reached
FIRST = asyncio.FIRST_COMPLETED
PROBE_EVERY = 1.0  # seconds between probes of a judge server that cannot be reached


def usable_seconds(budget: float) -> float:
    """How long the server may work on a request whose client waits `budget` seconds: it
    answers 2 s before the client's own timeout (a fifth of a short budget), so that a 503
    reaches the client first even from a busy host, whose loop can be late by a good part of a
    second."""
    return budget - min(2.0, 0.2 * budget)


Stream = Callable[
    [Sequence[Trace], threading.Event, Sequence[TraceDeadline]], Iterator[tuple[int, list[Verdict]]]
]


class Busy(RuntimeError):
    """The request cannot be answered in time: 503 with Retry-After. `reason` is what the
    metrics count: queue_full, overloaded (the backlog outlasts the deadline), deadline (not
    checked in time), judge_down (its server cannot be reached), shutdown."""

    def __init__(self, reason: str, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = max(1, math.ceil(retry_after))


@dataclass(eq=False)
class _Call:
    """One checker call in flight: its items and the event that stops it early."""

    items: list[Work]
    stop: threading.Event = field(default_factory=threading.Event)

    def maybe_stop(self, _: Any = None) -> None:
        """Stop the call once none of its traces is still wanted: each one answered, abandoned
        or failed, at least one not answered (nobody came back for it, the judge is down)."""
        futures = [i.future for i in self.items]
        if all(f.done() for f in futures) and any(
            f.cancelled() or f.exception() is not None for f in futures
        ):
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
        when_judge_down: str = "refuse",
        keep_for_retry: float = KEEP_FOR_RETRY,
        cost_of: Callable[[Trace], float] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        if (check is None) == (stream is None):
            raise ValueError("give one of check or stream")
        if max_inflight < 1 or max_batch < 1:
            raise ValueError("max_inflight and max_batch must be at least 1")
        if client_timeout <= 0:
            raise ValueError(f"client_timeout must be positive, got {client_timeout}")
        if when_overloaded not in WHEN_OVERLOADED:
            raise ValueError(f"when_overloaded must be hold or refuse, got {when_overloaded!r}")
        if when_judge_down not in WHEN_JUDGE_DOWN:
            raise ValueError(f"when_judge_down must be refuse or hold, got {when_judge_down!r}")
        self.when_overloaded = when_overloaded
        self.when_judge_down = when_judge_down
        self.clock = clock
        self.stream: Stream = stream or _stream_of(check)  # type: ignore[arg-type]
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.max_inflight = max_inflight
        self.client_timeout = client_timeout
        self.on_batch = on_batch
        self.on_drop = on_drop
        self.pace = Pace(judge=judge_limit)
        self.judge_limit = judge_limit
        self.works = Works(clock, keep_for_retry)
        self.queue: asyncio.Queue[Work] = asyncio.Queue()
        # what checking a trace costs, in the judge limit's unit (its requests' prompt
        # characters, from the checker); its steps by default
        self.cost_of = cost_of or (lambda t: float(len(t.steps or [])))
        self.queued_cost = 0.0  # of the queued traces
        self.held: list[tuple[object, float]] = []  # requests waiting to be admitted, in order
        self.health = JudgeHealth(judge_limit)  # whether the judge works
        self.calls: set[_Call] = set()
        self.closing = False
        self._workers: list[asyncio.Task] = []  # the collector and the calls it started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._room: asyncio.Future | None = None  # done when a call ends: held ones look again
        self._unlisten: Callable[[], None] | None = None
        self._probing: asyncio.Future | None = None  # probes a judge that cannot be reached

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._workers = [asyncio.create_task(self._collect())]
        if self.judge_limit is not None:
            loop = self._loop
            self._unlisten = self.judge_limit.on_change(
                lambda: _call_soon(loop, self._judge_reach_changed)
            )
            self._judge_reach_changed()  # down before this server started: probed from now

    def close(self, grace: float = 30.0) -> None:
        """Stop taking traces: the queued ones are answered 503 now, the calls in flight may
        finish for `grace` seconds, then what is left is answered 503 too (on the loop)."""
        if self.closing:
            return
        self.closing = True
        queued = 0
        while not self.queue.empty():
            item = self.queue.get_nowait()
            self.queued_cost -= item.cost
            if not item.future.done():
                queued += 1
            _fail(item, Busy("shutdown", "the server is shutting down"))
        self.works.close()
        if self._unlisten is not None:
            self._unlisten()
        log.warning(
            "shutting down: %d queued trace(s) answered 503; %d checker call(s) in flight get "
            "%g s to finish",
            queued,
            len(self.calls),
            grace,
        )
        self._workers.append(asyncio.ensure_future(self._stop_calls_after(grace)))

    async def _stop_calls_after(self, grace: float) -> None:
        await self.clock.sleep(grace)
        self._stop_calls()

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
        known_wait: float | None = None,
    ) -> list[list[Verdict]] | None:
        """Verdicts per trace, or None when the client hung up first (`until_gone` returns an
        awaitable that finishes when it does). Raises `Busy` when they cannot come back within
        `timeout` seconds (default `client_timeout`, or `known_wait` where the route knows its
        client waits less: slime's 120 s): at once for a client that gave its own `timeout` (it
        can act on a refusal: another replica, Retry-After) or with `when_overloaded="refuse"`,
        else once the request has been held as long as its deadline allows (see `_admit`)."""
        budget = self.client_timeout if known_wait is None else min(self.client_timeout, known_wait)
        budget = budget if timeout is None else timeout
        if self.closing:
            raise Busy("shutdown", "the server is shutting down")
        # a client that gave its own timeout can act on a refusal: it is never held
        hold_if_down = timeout is None and self.when_judge_down == "hold"
        self._judge_down(hold_if_down, usable_seconds(budget))
        if self.queue.qsize() + len(traces) > self.max_queue:
            raise Busy("queue_full", f"{self.queue.qsize()} traces queued (max {self.max_queue})")
        until = self.clock.now() + usable_seconds(budget)
        # what is new to check: a retried trace's work is under way (or done) already
        keys = [content_key(t) for t in traces]
        new = {k: t for k, t in zip(keys, traces, strict=True) if self.works.find(k) is None}
        costs = {k: self.cost_of(t) for k, t in new.items()}
        cost = sum(costs.values())
        gone = asyncio.ensure_future(until_gone()) if until_gone is not None else None
        try:
            refuse = timeout is not None or self.when_overloaded == "refuse"
            if cost and not await self._admit(cost, until, budget, refuse, hold_if_down, gone):
                return None  # the client left while its request was held
            return await self._answer(traces, keys, costs, until, budget, gone)
        finally:
            if gone is not None:
                gone.cancel()

    async def _admit(
        self,
        cost: float,
        until: float,
        budget: float,
        refuse_at_once: bool,
        hold_if_down: bool,
        gone: asyncio.Future | None,
    ) -> bool:
        """Whether a request that costs `cost` (its new traces' judge requests) may join the
        queue: when the measured pace answers it, behind what is queued, in flight or held
        before it, well inside its time
        (the pace is an average). An idle server admits what comes (the request measures the
        judge again), so an old figure never keeps it refusing. A request that does not fit is
        refused at once (`refuse_at_once`), or else held, costing the judge nothing, until it
        fits or its time runs out (`Busy`): a client that retries blindly, as OpenRLHF's does
        (5 tries, 1 s apart), keeps its tries for when there is room. While the judge cannot be
        reached, it is refused (`judge_down`), or held the same way (`hold_if_down`) until the
        judge answers a probe. False: the client left while held."""
        ticket = object()
        self.held.append((ticket, cost))
        try:
            while True:
                position = next(i for i, (t, _) in enumerate(self.held) if t is ticket)
                ahead = self.cost_ahead() + sum(c for _, c in self.held[:position])
                left = until - self.clock.now()
                expected = self.pace.estimate(ahead, cost) if ahead else None
                if self.closing:
                    raise Busy("shutdown", "the server is shutting down")
                down = self._judge_down(hold_if_down, left)
                if not down and (expected is None or expected <= 0.8 * left):
                    return True
                if not down and (refuse_at_once or left <= HOLD_POLL_S):
                    raise Busy(
                        "overloaded",
                        f"the work queued or in flight takes about {expected:.1f} s to answer, "
                        f"past this request's {budget:g} s deadline",
                        retry_after=min(expected - 0.8 * left, 60.0),
                    )
                # until a call ends (there may be room now), the client leaves, or the next look
                waits = {self._room_changes(), *([gone] if gone is not None else [])}
                await self.clock.wait(waits, self.clock.now() + HOLD_POLL_S)
                if gone is not None and gone.done():
                    return False
        finally:
            self.held = [(t, s) for t, s in self.held if t is not ticket]

    async def _answer(
        self,
        traces: Sequence[Trace],
        keys: Sequence[str],
        costs: dict[str, float],
        until: float,
        budget: float,
        gone: asyncio.Future | None,
    ) -> list[list[Verdict]] | None:
        """Queue the traces' work (or join the work a retry finds) and wait for their verdicts
        until `until`; None if the client left. `keys` are their `content_key`s, `costs` the
        costs `submit` found. The work outlives an unanswered request by `keep_for_retry`
        seconds (`Works.release`)."""
        if self.closing:  # the queue was answered 503 already; nothing more joins it
            raise Busy("shutdown", "the server is shutting down")
        works = [self._claim(t, k, costs) for t, k in zip(traces, keys, strict=True)]
        # shielded: a request that stops waiting leaves its work to `Works`
        answers = asyncio.gather(*(asyncio.shield(w.future) for w in works))
        answers.add_done_callback(_retrieve)
        waiting: set[asyncio.Future] = {answers, *([gone] if gone is not None else [])}
        try:
            await self.clock.wait(waiting, until)
        finally:  # answered, past its deadline, gone, or the request's own task cancelled
            answers.cancel()
            unanswered = sum(not w.future.done() for w in works)
            for work in works:
                self.works.release(work)
        if answers.done() and not answers.cancelled():
            if (error := answers.exception()) is not None:
                raise error  # Busy (the server closed, the judge is down) or a fault
            return [w.verdicts_for(t.id) for w, t in zip(works, traces, strict=True)]
        reason = "client_gone" if gone is not None and gone.done() else "deadline"
        if self.on_drop is not None and unanswered:
            self.on_drop(reason, unanswered)
        if reason == "client_gone":
            return None
        raise Busy("deadline", f"not checked within its {budget:g} s deadline")

    def _claim(self, trace: Trace, key: str, costs: dict[str, float]) -> Work:
        work, new = self.works.claim(trace, key)
        if new:  # its cost is known unless its work was there at `submit` and is gone since
            work.cost = costs[key] if key in costs else self.cost_of(trace)
            self.queue.put_nowait(work)
            self.queued_cost += work.cost
        return work

    def _room_changes(self) -> asyncio.Future:
        """A future that is done when the next checker call ends."""
        if self._room is None or self._room.done():
            self._room = asyncio.get_running_loop().create_future()
        return self._room

    def _room_changed(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def cost_ahead(self) -> float:
        """The cost of the work queued or in flight and not done (a retry may still want it):
        what a new request waits behind."""
        running = sum(i.cost for c in self.calls for i in c.items if not i.future.done())
        return self.queued_cost + running

    # ------------------------------------------------------------------ the judge's server
    def _judge_down(self, hold: bool, left: float) -> bool:
        """Whether the judge cannot be reached now and a request with `left` seconds is held
        (`hold`, while it has time to wait); refused (`Busy`) if it cannot be held."""
        limit = self.judge_limit
        if limit is None or limit.down is None:
            return False
        if hold and left > HOLD_POLL_S:
            return True
        raise Busy("judge_down", f"the judge cannot be reached ({limit.down}); it is probed "
                   f"every {PROBE_EVERY:g} s", retry_after=PROBE_EVERY)  # fmt: skip

    def _judge_reach_changed(self) -> None:
        """On the loop: the judge's server went down (its work fails now, and it is probed
        until it answers) or came back."""
        limit = self.judge_limit
        if limit is None or limit.down is None or self.closing or self._probing is not None:
            return
        error = Busy("judge_down", f"the judge cannot be reached ({limit.down})", PROBE_EVERY)
        while not self.queue.empty():
            self.queued_cost -= self.queue.get_nowait().cost
        failed = self.works.fail_all(error)  # queued, running and kept: none is sent again
        for call in self.calls:
            call.stop.set()
        log.warning("the judge cannot be reached: %d trace(s) answered 503; probing it every "
                    "%g s", len(failed), PROBE_EVERY)  # fmt: skip
        self._probing = asyncio.ensure_future(self._probe_until_up(limit))
        self._workers.append(self._probing)
        self._room_changed()  # held requests look again: refused, or held on (`when_judge_down`)

    async def _probe_until_up(self, limit: EngineLimit) -> None:
        try:
            while limit.down is not None and not self.closing:
                await self.clock.sleep(PROBE_EVERY)
                await asyncio.to_thread(limit.probe)
        finally:
            self._workers.remove(self._probing)
            self._probing = None
        self._room_changed()  # held requests look again

    # ------------------------------------------------------------------ workers
    async def _get(self) -> Work:
        item = await self.queue.get()
        self.queued_cost -= item.cost
        return item

    async def _next_batch(self) -> list[Work]:
        batch = [await self._get()]
        until = self.clock.now() + self.max_wait
        while len(batch) < self.max_batch and self.clock.now() < until:
            getting = asyncio.ensure_future(self._get())
            try:
                done = await self.clock.wait({getting}, until)
            finally:  # the time ran out, or this task was cancelled: a get cancelled before it
                if not getting.done():  # took its item leaves the queue as it was
                    getting.cancel()
            if getting not in done:
                break
            batch.append(getting.result())
        # work abandoned (nobody came back for it) or failed (the judge is down) is not checked
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

    async def _run(self, batch: list[Work]) -> None:
        """One checker call in a thread of its own; each trace answered as it comes."""
        loop = asyncio.get_running_loop()
        call = _Call(batch)
        for item in batch:
            item.future.add_done_callback(call.maybe_stop)
        finished = loop.create_future()
        started = self.clock.now()
        answered = 0

        def deliver(position: int, verdicts: list[Verdict]) -> None:
            nonlocal answered
            answered += 1
            future = batch[position].future
            if not future.done():
                future.set_result(verdicts)

        def end(error: BaseException | None) -> None:
            if answered == len(batch):  # a whole call: what the next requests can expect
                seconds, cost = self.clock.now() - started, sum(i.cost for i in batch)
                self.pace.observe(seconds, cost, sum(i.steps for i in batch))
            for item in batch:  # a trace the call never answered (a fault in the call itself)
                _fail(item, error or RuntimeError("the checker gave no verdicts for this trace"))
            if not finished.done():
                finished.set_result(None)
            self._room_changed()

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


def _fail(work: Work, error: BaseException) -> None:
    """`work` fails with `error` (its requests learn it), and its judge requests end."""
    if not work.future.done():
        work.future.set_exception(error)
    work.deadline.cancel()


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
        loop.call_soon_threadsafe(fn, *args)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
