"""The reward server's routes (`stepgap serve`; see `server.py` for what they promise). Each
route reads the server's parts from `request.app.state.stepgap` (`ServerState`), which
`create_app` sets; nothing here holds state of its own."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request

from stepgap.clock import TraceDeadline
from stepgap.feedback import Told
from stepgap.schema import Trace, Verdict
from stepgap.teacher.judges.concurrency import EngineLimit

from .api import (
    CheckRequest,
    CheckResponse,
    HealthResponse,
    OpenRLHFRequest,
    OpenRLHFResponse,
    RewardRequest,
    RewardResponse,
    SlimeRequest,
    StepsRequest,
    StepsResponse,
    reward_response,
    rollout_traces,
    segmented_traces,
)
from .batching import Busy, MicroBatcher, usable_seconds
from .metrics import ServerMetrics
from .openrlhf import UnrewardedBatch, openrlhf_batch, openrlhf_response
from .recent import RecentTraces
from .reward_function import RewardUnavailable, StepGapReward, failed_verdicts
from .slime import SLIME_SECONDS, slime_answer, slime_inputs
from .streaming import StreamingReward

TIMEOUT_HEADER = "X-Stepgap-Timeout"


@dataclass
class ServerState:
    """What the routes share: the reward, the batcher in front of its checker, the metrics,
    the steps checked while rollouts run (`inline`: None where the checker cannot check them
    one by one), the traces `/view` shows, and the limits the server was made with."""

    reward: StepGapReward
    batcher: MicroBatcher
    metrics: ServerMetrics
    inline: StreamingReward | None
    recent: RecentTraces
    client_timeout: float
    max_body_bytes: int
    judge_limit: EngineLimit | None


def state_of(request: Request) -> ServerState:
    return request.app.state.stepgap


router = APIRouter()


async def limit_body(request: Request, call_next: Any) -> Any:
    """Middleware: a body over the server's limit is answered 413 before it is read."""
    state = state_of(request)
    length = request.headers.get("content-length")
    if length is not None and int(length) > state.max_body_bytes:
        state.metrics.rejected.labels("too_large").inc()
        return JSONResponse(
            {"detail": f"request body over {state.max_body_bytes} bytes"}, status_code=413
        )
    return await call_next(request)


async def until_disconnected(request: Any) -> None:
    """Returns when the client hangs up (the body is already read, so the next ASGI message
    is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def timeout_of(request: Any) -> float | None:
    """The client's own deadline in seconds (`X-Stepgap-Timeout`), if it sent one."""
    value = request.headers.get(TIMEOUT_HEADER)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise HTTPException(422, f"{TIMEOUT_HEADER} must be a positive number of seconds")
    return seconds


async def checked(
    traces: list[Trace], route: str, request: Request, known_wait: float | None = None
) -> list[list[Verdict]]:
    """The traces' verdicts through the batcher, under the request's deadline (its header, else
    `known_wait` where the route knows its client's, else the server's `--client-timeout`): 503
    with Retry-After when they cannot come in time, 499 when the client left."""
    state = state_of(request)
    state.metrics.requests.labels(route).inc()
    try:
        verdicts = await state.batcher.submit(
            traces, lambda: until_disconnected(request), timeout_of(request), known_wait
        )
        if verdicts is not None:
            state.batcher.health.observe(verdicts)
    except Busy as exc:
        if exc.reason == "judge_down" and state.reward.on_failed_check == "zero":
            # scoring a failed check (exact match alone) was chosen explicitly: a judge that is
            # down fails every step, at once
            return [failed_verdicts(t.id, t.steps or [], str(exc)) for t in traces]
        state.metrics.rejected.labels(exc.reason).inc()
        raise HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after)}) from None
    if verdicts is None:  # nobody is listening any more; nginx's "client closed request"
        state.metrics.rejected.labels("client_gone").inc()
        raise HTTPException(499, "client disconnected")
    return verdicts


async def rewards(
    responses: list[str],
    questions: list[str],
    golden: list[Any],
    route: str,
    request: Request,
    known_wait: float | None = None,
) -> list[Any]:
    """The rollouts' rewards: segmented, checked through the batcher (`checked`), scored."""
    state = state_of(request)
    reward = state.reward
    try:
        traces = rollout_traces(reward, responses, questions, golden, route)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    if reward.variant == "search_only":
        return reward.score_traces(traces)
    verdicts = await checked(traces, route, request, known_wait)
    results = [reward.result(t, v) for t, v in zip(traces, verdicts, strict=True)]
    for t, vs, r in zip(traces, verdicts, results, strict=True):
        state.recent.add(t, vs, r)
    state.metrics.on_results(results)
    return results


async def finalized(body: RewardRequest, request: Request) -> list[Any]:
    """`/reward` for rollouts whose steps came to `/steps`: each finalized, reusing the answers
    made while it ran; the deadline and a gone client hold as for `/reward`."""
    state = state_of(request)
    inline, metrics = state.inline, state.metrics
    assert inline is not None and body.trace_ids is not None
    metrics.requests.labels("reward").inc()
    try:
        traces = rollout_traces(state.reward, body.responses, body.questions,
                                body.golden_answers, "reward", body.trace_ids)  # fmt: skip
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    seconds = timeout_of(request) or state.client_timeout
    clock = state.batcher.clock
    until = clock.now() + usable_seconds(seconds)
    deadline = TraceDeadline(until, clock.now)
    work = asyncio.ensure_future(
        asyncio.gather(*(asyncio.to_thread(inline.finalize, t, deadline) for t in traces))
    )
    gone = asyncio.ensure_future(until_disconnected(request))
    done = await clock.wait({work, gone}, until)
    gone.cancel()
    if work not in done:
        deadline.cancel()  # the judge sends nothing more for these rollouts
        if gone in done:
            metrics.rejected.labels("client_gone").inc()
            raise HTTPException(499, "client disconnected")
        metrics.rejected.labels("deadline").inc()
        raise HTTPException(
            503, f"not checked within the request's {seconds:g} s deadline",
            headers={"Retry-After": "1"},
        )  # fmt: skip
    results = work.result()
    for t, r in zip(traces, results, strict=True):
        state.recent.add(t, [], r)
    metrics.on_results(results)
    return results


@router.post("/check", response_model=CheckResponse, summary="verdicts for every step")
async def check(body: CheckRequest, request: Request) -> dict[str, Any]:
    try:
        segmented = segmented_traces(body.traces)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    verdicts = await checked(segmented, "check", request)
    for t, vs in zip(segmented, verdicts, strict=True):
        state_of(request).recent.add(t, vs, None)
    return {"verdicts": [[v.model_dump(mode="json") for v in vs] for vs in verdicts]}


@router.post("/reward", response_model=RewardResponse, summary="rewards for rollouts")
async def reward_route(body: RewardRequest, request: Request) -> dict[str, Any]:
    if body.trace_ids is not None and state_of(request).inline is not None:
        return reward_response(await finalized(body, request))
    results = await rewards(body.responses, body.questions, body.golden_answers, "reward", request)
    return reward_response(results)


@router.post(
    "/steps",
    response_model=StepsResponse,
    summary="a rollout's text so far: its complete steps are checked while it goes on",
)
async def steps(body: StepsRequest, request: Request) -> dict[str, Any]:
    state = state_of(request)
    state.metrics.requests.labels("steps").inc()
    inline = state.inline
    if inline is None:
        raise HTTPException(
            404,
            "this server checks whole rollouts only: its checker cannot check steps one by "
            "one (the search_only variant, or a checker without its own judge)",
        )
    try:
        if body.feedback_wait is None:
            told = Told(new_steps=await asyncio.to_thread(
                inline.submit_response, body.trace_id, body.question, body.response
            ))  # fmt: skip
        else:
            told = await asyncio.to_thread(
                inline.tell, body.trace_id, body.question, body.response, body.feedback_wait
            )
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return {"trace_id": body.trace_id, "submitted": told.new_steps,
            "rollouts": inline.unfinished(), "note": told.note, "late": told.late,
            "waited_s": round(told.waited, 3)}  # fmt: skip


@router.delete("/steps/{trace_id}", summary="forget a rollout whose reward will not be asked")
async def drop_steps(trace_id: str, request: Request) -> dict[str, Any]:
    state = state_of(request)
    state.metrics.requests.labels("steps").inc()
    dropped_now = state.inline.drop(trace_id) if state.inline is not None else 0
    if dropped_now:
        state.metrics.on_drop("abandoned", dropped_now)
    return {"trace_id": trace_id, "dropped": dropped_now}


@router.post(
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
    except UnrewardedBatch as exc:  # OpenRLHF's "no reward": it retries, then gives None
        state_of(request).metrics.rejected.labels("no_reward").inc()
        raise HTTPException(503, exc.detail(), headers={"Retry-After": "1"}) from None


@router.post(
    "/remote_rm",
    response_model=float,
    summary="slime's remote reward protocol (--rm-type remote_rm)",
)
async def remote_rm(body: SlimeRequest, request: Request) -> Any:
    try:
        response, question, golden = slime_inputs(body.prompt, body.response, body.label)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    (result,) = await rewards([response], [question], [golden], "remote_rm", request, SLIME_SECONDS)
    try:
        return slime_answer(result)
    except RewardUnavailable as exc:  # slime retries a non-2xx answer, then fails the rollout
        state_of(request).metrics.rejected.labels("no_reward").inc()
        raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None


@router.get("/health", response_model=HealthResponse, summary="liveness and queue depth")
async def health(request: Request) -> dict[str, Any]:
    state = state_of(request)
    batcher, reward, judge_limit = state.batcher, state.reward, state.judge_limit
    status = "closing" if batcher.closing else batcher.health.status()
    return {
        "status": status,
        "variant": reward.variant,
        "lam": reward.lam,
        "on_failed_check": reward.on_failed_check,
        "queued": batcher.queue.qsize(),
        "in_flight": len(batcher.calls),
        "failed_checks": reward.failures["failed_checks"],
        "judge_failure": batcher.health.problem(),
        "judge_limit": None if judge_limit is None else judge_limit.describe(),
    }


@router.get(
    "/view", response_class=HTMLResponse, summary="the last checked traces as a page (stepgap view)"
)
async def view(request: Request):  # no return annotation: FastAPI would read it as a body model
    state = state_of(request)
    state.metrics.requests.labels("view").inc()
    return HTMLResponse(state.recent.render())


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics: requests, batch sizes, queue depth, rejections",
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
async def metrics(request: Request):  # no return annotation: FastAPI would read it as a body
    body, media_type = state_of(request).metrics.render()
    return Response(body, media_type=media_type)
