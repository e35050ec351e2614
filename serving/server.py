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
answers its batch 503, its JSON detail naming each such rollout (index in the batch, trace id,
why); `/reward` gives `null` and the reason; `/health` says `degraded` while the judge fails. At
start, `serve` probes the judge and prints what it can answer in a client's time.

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
import logging
import sys
import time
from typing import Any

from stepgap.clock import SYSTEM, Clock
from stepgap.schema import Trace
from stepgap.teacher.checker import Checker
from stepgap.teacher.judges.concurrency import EngineLimit

from .batching import OPENRLHF_TIMEOUT, MicroBatcher, usable_seconds
from .metrics import ServerMetrics
from .recent import RecentTraces
from .reward_function import StepGapReward, default_inflight
from .streaming import StreamingReward
from .work import KEEP_FOR_RETRY

log = logging.getLogger(__name__)


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
    when_judge_down: str = "refuse",
    keep_for_retry: float = KEEP_FOR_RETRY,
    clock: Clock = SYSTEM,
) -> Any:
    """The FastAPI app (see the module docstring); `max_inflight` defaults to
    `default_inflight(reward)`, `view_keep` bounds how many checked traces `GET /view` keeps;
    `clock` is what the deadlines, holds and pace are measured in (the machine's). Its parts are
    `app.state.stepgap` (`routes.ServerState`)."""
    from fastapi_offline import FastAPIOffline

    from stepgap import __version__

    from .routes import TIMEOUT_HEADER, ServerState, limit_body, router

    metrics = ServerMetrics()
    judge_limit = judge_limit_of(reward)
    batcher = MicroBatcher(  # a checker fault becomes error verdicts, never a 500
        stream=lambda traces, stop, deadlines: reward.check_stream(
            traces, stop=stop, deadlines=deadlines
        ),
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        max_inflight=max_inflight or default_inflight(reward),
        client_timeout=client_timeout,
        on_batch=metrics.on_batch,
        on_drop=metrics.on_drop,
        judge_limit=judge_limit,
        when_overloaded=when_overloaded,
        when_judge_down=when_judge_down,
        keep_for_retry=keep_for_retry,
        cost_of=lambda trace: sum(reward.checker.request_sizes(trace)),
        clock=clock,
    )
    metrics.watch(batcher, judge_limit, in_process_engine(reward))
    # steps checked while the rollout runs (/steps), where the checker can check them one by one
    inline = (
        StreamingReward(reward)
        if reward.variant != "search_only" and StreamingReward.supports(reward.checker)
        else None
    )
    recent = RecentTraces(view_keep, reward.on_failed_check)
    state = ServerState(
        reward, batcher, metrics, inline, recent, client_timeout, max_body_bytes, judge_limit,
    )  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        batcher.start()
        yield
        await batcher.stop()
        if inline is not None:  # the steps not yet sent are dropped: nobody waits for them
            inline.close(wait=False)

    # /docs and /redoc from the Swagger UI and ReDoc files a package ships: they need no
    # network, where FastAPI's own load them from a CDN (a blank page on a cluster without one)
    app = FastAPIOffline(
        title="stepgap",
        version=__version__,
        description="Step-level gap checking (CC / IE / MB) and the typed GRPO process reward, "
        "micro-batched across clients. A request that cannot be answered before its deadline "
        f"(the `{TIMEOUT_HEADER}` header in seconds, else {client_timeout:g} s) is answered 503 "
        "with Retry-After.",
        lifespan=lifespan,
    )
    app.state.stepgap = state
    app.middleware("http")(limit_body)
    app.include_router(router)
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
    from stepgap.student.prm import PRMChecker

    trace = segment_trace(PROBE)
    if isinstance(reward.checker, PRMChecker):
        return probe_prm(reward.checker, trace, client_timeout)
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


def probe_prm(checker: Any, trace: Trace, client_timeout: float) -> str:
    """A PRM has no judge to wait for: one forward pass over `trace` says what a step costs.
    A PRM that cannot run it is named (every request would fail the same way)."""
    started = time.monotonic()
    try:
        verdicts = checker.check([trace])[0]
    except Exception as exc:  # noqa: BLE001 - reported, as a judge's failure is
        return f"the PRM ({checker.runner.name}) failed a probe trace: {type(exc).__name__}: {exc}"
    seconds = time.monotonic() - started
    steps = int(0.8 * usable_seconds(client_timeout) * len(verdicts) / max(seconds, 1e-6))
    return (
        f"a PRM checker ({checker.runner.name}; no judge, no NLI model): a probe trace of "
        f"{len(verdicts)} steps took {seconds:.2f} s in one forward pass; about {steps} steps "
        f"are answered within the {client_timeout:g} s a client waits"
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
    when_judge_down: str = "refuse",
    keep_for_retry: float = KEEP_FOR_RETRY,
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
        when_judge_down=when_judge_down,
        keep_for_retry=keep_for_retry,
    )
    batcher: MicroBatcher = app.state.stepgap.batcher
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
