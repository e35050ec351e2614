"""`stepgap serve`: the checker and the reward over HTTP, micro-batched across clients.

Requests from many rollout workers are queued per trace and checked in micro-batches (up to
`max_batch` traces, waiting at most `max_wait_ms` for more), so the judge and the NLI model see
large batches. Up to `max_inflight` such checker calls run at once, and each trace is answered as
soon as its own steps are checked, not when its whole batch is.

A reward is only worth something before its client stops waiting. Each request has a deadline:
its `X-Stepgap-Timeout` header (seconds), else the server's `client_timeout` (OpenRLHF waits 180 s
and sends no header). A request the server cannot answer in time gets a 503 with Retry-After, so
the client retries instead of timing out: at once when the queue is full or the measured pace
says its traces would come back too late, and just before its deadline if they have not. A trace
whose client has hung up or whose deadline has passed is dropped: a batch none of whose traces
are still wanted stops at the judge's next answer. Refusals and drops are counted in
`stepgap_rejected{reason}` and `stepgap_traces_dropped{reason}`. An oversized body gets 413.

SIGTERM (`serve`) stops taking requests, answers 503 to the queued ones, lets the checks in
flight finish for up to `grace` seconds, answers 503 to what is left, and exits.

Routes: `/check`, `/reward`, `/get_reward` (OpenRLHF's remote reward protocol), `/health`,
`/metrics` (Prometheus), `/view` (an HTML page of the last `view_keep` checked traces).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
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

from .api import (
    CheckRequest,
    CheckResponse,
    HealthResponse,
    OpenRLHFRequest,
    OpenRLHFResponse,
    RewardRequest,
    RewardResponse,
    rollout_traces,
    segmented_traces,
)
from .openrlhf import openrlhf_batch, openrlhf_response
from .reward import StepGapReward

log = logging.getLogger(__name__)

TIMEOUT_HEADER = "X-Stepgap-Timeout"
# OpenRLHF 0.11's remote reward client waits 180 s in all (aiohttp total=180), 5 tries 1 s apart
OPENRLHF_TIMEOUT = 180.0

Stream = Callable[[Sequence[Trace], threading.Event], Iterator[tuple[int, list[Verdict]]]]


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
    passes, and the workers skip (or stop checking) cancelled items."""

    trace: Trace
    future: asyncio.Future


@dataclass
class Pace:
    """How long this server's checker calls take, measured on its own finished calls: enough to
    tell a new request whether its traces can come back before its deadline. The queue is served
    in rounds of `calls` x `max_batch` traces, each round about one call long."""

    call_seconds: float | None = None  # moving average of a whole call's duration
    weight: float = 0.3  # of the newest call in the moving average

    def observe(self, seconds: float) -> None:
        w = self.weight
        self.call_seconds = (
            seconds if self.call_seconds is None else (1 - w) * self.call_seconds + w * seconds
        )

    def estimate(
        self, ahead: int, traces: int, calls: int, max_batch: int, busy: bool
    ) -> float | None:
        """Seconds until `traces` more are answered behind `ahead` queued ones, with `calls`
        checker calls of up to `max_batch` traces (`busy`: none free now); None before any call
        has been measured."""
        if self.call_seconds is None:
            return None
        rounds = math.ceil((ahead + traces) / (calls * max_batch)) + (0.5 if busy else 0.0)
        return rounds * self.call_seconds


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
    ) -> None:
        if (check is None) == (stream is None):
            raise ValueError("give one of check or stream")
        if max_inflight < 1 or max_batch < 1:
            raise ValueError("max_inflight and max_batch must be at least 1")
        if client_timeout <= 0:
            raise ValueError(f"client_timeout must be positive, got {client_timeout}")
        self.stream: Stream = stream or _stream_of(check)  # type: ignore[arg-type]
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.max_inflight = max_inflight
        self.client_timeout = client_timeout
        self.on_batch = on_batch
        self.on_drop = on_drop
        self.pace = Pace()
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.calls: set[_Call] = set()
        self.closing = False
        self._workers: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.max_inflight)]

    def close(self, grace: float = 30.0) -> None:
        """Stop taking traces: the queued ones are answered 503 now, the calls in flight may
        finish for `grace` seconds, then what is left is answered 503 too (on the loop)."""
        if self.closing:
            return
        self.closing = True
        queued = 0
        while not self.queue.empty():
            item = self.queue.get_nowait()
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
        for task in self._workers:
            task.cancel()
        for task in self._workers:
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
        `timeout` seconds (default `client_timeout`)."""
        budget = self.client_timeout if timeout is None else timeout
        if self.closing:
            raise Busy("shutdown", "the server is shutting down")
        if self.queue.qsize() + len(traces) > self.max_queue:
            raise Busy("queue_full", f"{self.queue.qsize()} traces queued (max {self.max_queue})")
        # answer a little before the client's own timeout, so that a 503 reaches it first; admit
        # only what the measured pace answers well inside that (the pace is an average)
        usable = budget - min(2.0, 0.1 * budget)
        expected = self.pace.estimate(
            self.queue.qsize(),
            len(traces),
            self.max_inflight,
            self.max_batch,
            busy=len(self.calls) >= self.max_inflight,
        )
        if expected is not None and expected > 0.8 * usable:
            raise Busy(
                "overloaded",
                f"{self.queue.qsize()} traces queued: about {expected:.1f} s to answer, "
                f"past this request's {budget:g} s deadline",
                retry_after=min(expected - 0.8 * usable, 60.0),
            )
        loop = asyncio.get_running_loop()
        items = [_Item(t, loop.create_future()) for t in traces]
        for item in items:
            self.queue.put_nowait(item)
        answers = asyncio.gather(*(i.future for i in items))
        answers.add_done_callback(_retrieve)
        waiting: set[asyncio.Future] = {answers}
        gone = asyncio.ensure_future(until_gone()) if until_gone is not None else None
        if gone is not None:
            waiting.add(gone)
        try:
            await asyncio.wait(waiting, timeout=usable, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the request's task itself (a forced shutdown)
            for item in items:
                item.future.cancel()
            raise
        finally:
            if gone is not None:
                gone.cancel()
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
        raise Busy("deadline", f"not checked within {usable:.1f} s of its {budget:g} s deadline")

    # ------------------------------------------------------------------ workers
    async def _next_batch(self) -> list[_Item]:
        loop = asyncio.get_running_loop()
        batch = [await self.queue.get()]
        until = loop.time() + self.max_wait
        while len(batch) < self.max_batch:
            timeout = until - loop.time()
            if timeout <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), timeout))
            except asyncio.TimeoutError:
                break
        # a client that hung up or timed out cancelled its items: they are not checked
        return [i for i in batch if not i.future.done()]

    async def _work(self) -> None:
        while True:
            batch = await self._next_batch()
            if batch:
                await self._run(batch)

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
                self.pace.observe(time.monotonic() - started)
            for item in batch:  # a trace the call never answered (a fault in the call itself)
                _fail(item, error or RuntimeError("the checker gave no verdicts for this trace"))
            if not finished.done():
                finished.set_result(None)

        def work() -> None:
            error: BaseException | None = None
            try:
                for position, verdicts in self.stream([i.trace for i in batch], call.stop):
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
        traces: Sequence[Trace], stop: threading.Event
    ) -> Iterator[tuple[int, list[Verdict]]]:
        yield from enumerate(check(traces))

    return stream


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


def default_inflight(reward: StepGapReward) -> int:
    """Checker calls in flight by default: 8 when the judge is a server (an OpenAI-compatible
    engine, or `stepgap serve` replicas), whose own concurrency does the work; 1 for a model in
    this process, which a second call would only slow down and double in memory."""
    judge = getattr(reward.checker, "judge", None)
    return 8 if judge is None or getattr(judge, "base_url", None) is not None else 1


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
        "outlasts the deadline), deadline (not checked in time), shutdown, client_gone",
        ["reason"],
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

    # a checker fault becomes error verdicts (bracket 0), never a 500
    batcher = MicroBatcher(
        stream=lambda traces, stop: reward.check_stream(traces, stop=stop),
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        max_inflight=max_inflight or default_inflight(reward),
        client_timeout=client_timeout,
        on_batch=on_batch,
        on_drop=lambda reason, n: dropped.labels(reason).inc(n),
    )
    queue_depth.set_function(batcher.queue.qsize)
    in_flight = Gauge("stepgap_checks_in_flight", "checker calls running", registry=registry)
    in_flight.set_function(lambda: len(batcher.calls))
    call_seconds = Gauge(
        "stepgap_call_seconds",
        "moving average of a whole checker call's duration (what admission plans with; 0 "
        "before the first)",
        registry=registry,
    )
    call_seconds.set_function(lambda: batcher.pace.call_seconds or 0.0)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        batcher.start()
        yield
        await batcher.stop()

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

    @app.post("/reward", response_model=RewardResponse, summary="rewards for rollouts")
    async def reward_route(body: RewardRequest, request: Request) -> dict[str, Any]:
        results = await rewards(
            body.responses, body.questions, body.golden_answers, "reward", request
        )
        return {"rewards": [r.reward for r in results], "results": [r.as_dict() for r in results]}

    @app.post(
        "/get_reward", response_model=OpenRLHFResponse, summary="OpenRLHF's remote reward protocol"
    )
    async def get_reward(body: OpenRLHFRequest, request: Request) -> dict[str, Any]:
        try:
            responses, questions, golden = openrlhf_batch(body.query, body.prompts, body.labels)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return openrlhf_response(await rewards(responses, questions, golden, "get_reward", request))

    @app.get("/health", response_model=HealthResponse, summary="liveness and queue depth")
    async def health() -> dict[str, Any]:
        return {
            "status": "closing" if batcher.closing else "ok",
            "variant": reward.variant,
            "lam": reward.lam,
            "queued": batcher.queue.qsize(),
            "in_flight": len(batcher.calls),
            "failed_checks": reward.failures["failed_checks"],
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
    )
    batcher: MicroBatcher = app.state.batcher

    class Server(uvicorn.Server):
        """uvicorn's server, which on SIGTERM/SIGINT also closes the batcher: the queued
        requests are answered 503 at once instead of being checked for nobody."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            batcher.close_threadsafe(grace)

    # uvicorn's own wait for open requests outlasts the batcher's grace by a little: by then
    # every request has its answer (verdicts or 503) and only the write is left
    config = uvicorn.Config(
        app, host=host, port=port, log_level="info", timeout_graceful_shutdown=grace + 2
    )
    Server(config).run()
