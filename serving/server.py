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
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

try:  # the `serve` extra; at module level so FastAPI can resolve the routes' annotations
    from starlette.requests import Request
except ImportError:  # pragma: no cover - without the extra, create_app says what to install
    Request = Any  # type: ignore[misc,assignment]

from stepgap.reward_arithmetic import RewardResult
from stepgap.schema import Trace, Verdict
from stepgap.teacher.checker import Checker
from stepgap.teacher.judges.base import TraceDeadline
from stepgap.teacher.judges.concurrency import EngineLimit

from .api import (
    CheckRequest,
    CheckResponse,
    HealthResponse,
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
from .batching import (
    FIRST,
    OPENRLHF_TIMEOUT,
    Busy,
    MicroBatcher,
    usable_seconds,
)
from .openrlhf import openrlhf_batch, openrlhf_response
from .reward_function import RewardUnavailable, StepGapReward, default_inflight
from .streaming import StreamingReward

log = logging.getLogger(__name__)

TIMEOUT_HEADER = "X-Stepgap-Timeout"


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
    judge = reward.checker.judge
    return judge.limit if judge is not None else None


def in_process_engine(reward: StepGapReward) -> Any:
    """vLLM's async engine when the judge runs on it in this process (its requests and aborts
    are metrics), else None."""
    from stepgap.teacher.judges.hf import HFJudge

    judge = reward.checker.judge
    return judge.engine if isinstance(judge, HFJudge) and judge.online else None


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
    engine = in_process_engine(reward)
    if engine is not None:  # vLLM's async engine in this process
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
        usable = usable_seconds(seconds)
        deadline = TraceDeadline.after(usable)
        work = asyncio.ensure_future(
            asyncio.gather(*(asyncio.to_thread(inline.finalize, t, deadline) for t in traces))
        )
        gone = asyncio.ensure_future(_until_disconnected(request))
        done, _ = await asyncio.wait({work, gone}, timeout=usable, return_when=FIRST)
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
    if not isinstance(reward.checker, Checker):  # a remote checker: its servers probe theirs
        return "the checker is remote; its servers report their own judges"
    ask = reward.checker.judge_traces
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
        at_once = limit.limit or batcher.max_inflight * int(reward.checker.judge.concurrency)
        per_second, how = at_once / latency, f"{latency:.1f} s a request, {limit.describe()}"
    else:
        per_second, how = len(verdicts) / seconds, f"{seconds / len(verdicts):.1f} s a step"
    steps = int(0.8 * usable_seconds(client_timeout) * per_second)
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

    if isinstance(reward.checker.judge, ReplayJudge):
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
            await asyncio.to_thread(reward.checker.close)

    # uvicorn's own wait for open requests outlasts the batcher's grace by a little: by then
    # every request has its answer (verdicts or 503) and only the write is left
    config = uvicorn.Config(
        app, host=host, port=port, log_level="info", timeout_graceful_shutdown=grace + 2
    )
    Server(config).run()
