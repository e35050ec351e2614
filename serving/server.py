"""`stepgap serve`: the checker and the reward over HTTP, micro-batched across clients.

Requests from many rollout workers are queued per trace and answered by one checker call per
micro-batch (up to `max_batch` traces, waiting at most `max_wait_ms` for more), so the judge and
the NLI model see large batches. A full queue answers 503 with Retry-After; an oversized body
413; a client that hangs up before its answer has its queued traces dropped (counted as
`stepgap_rejected{reason="client_gone"}`) while the rest of its batch is answered.
Routes: `/check`, `/reward`, `/get_reward` (OpenRLHF's remote reward protocol), `/health`,
`/metrics` (Prometheus).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

try:  # the `serve` extra; at module level so FastAPI can resolve the routes' annotations
    from starlette.requests import Request
except ImportError:  # pragma: no cover - without the extra, create_app says what to install
    Request = Any  # type: ignore[misc,assignment]

from stepgap.data_builders.schema import Trace, Verdict
from stepgap.data_builders.segment import SegmentationError, segment_trace

from .inputs import golden_list, question_from_prompt
from .reward import StepGapReward

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    pass


@dataclass
class _Item:
    trace: Trace
    future: asyncio.Future


class MicroBatcher:
    """Collects traces from concurrent requests into batches for one `check` call each."""

    def __init__(
        self,
        check: Any,
        *,
        max_batch: int = 32,
        max_wait_ms: float = 10.0,
        max_queue: int = 1024,
        on_batch: Any = None,
    ) -> None:
        self.check = check
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.on_batch = on_batch
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Finish what is queued, then stop."""
        while not self.queue.empty():
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def submit(
        self, traces: Sequence[Trace], until_gone: Callable[[], Awaitable[None]] | None = None
    ) -> list[list[Verdict]] | None:
        """Verdicts per trace. With `until_gone` (returns an awaitable that finishes when the
        client hangs up), a client that leaves first gets None and its queued traces are dropped."""
        if self.queue.qsize() + len(traces) > self.max_queue:
            raise QueueFull(f"{self.queue.qsize()} traces queued (max {self.max_queue})")
        loop = asyncio.get_running_loop()
        items = [_Item(t, loop.create_future()) for t in traces]
        for item in items:
            self.queue.put_nowait(item)
        answers = asyncio.gather(*(i.future for i in items))
        if until_gone is None:
            return list(await answers)
        gone = asyncio.ensure_future(until_gone())
        try:
            await asyncio.wait({answers, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not answers.done():
            answers.cancel()  # cancels the items' futures: the batch loop skips them
            answers.add_done_callback(_retrieve)  # nobody awaits it: no "never retrieved" log
            return None
        return list(answers.result())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + self.max_wait
            while len(batch) < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), timeout))
                except asyncio.TimeoutError:
                    break
            # A client that disconnected cancelled its futures: its traces are not checked, and
            # the rest of the batch is answered as usual.
            batch = [i for i in batch if not i.future.done()]
            if not batch:
                continue
            if self.on_batch is not None:
                self.on_batch(len(batch))
            try:
                results = await loop.run_in_executor(None, self.check, [i.trace for i in batch])
            except Exception as exc:  # every waiting request learns of the failure
                log.exception("checker failed on a batch of %d", len(batch))
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            for item, verdicts in zip(batch, results, strict=True):
                if not item.future.done():
                    item.future.set_result(verdicts)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def _until_disconnected(request: Any) -> None:
    """Returns when the client hangs up (the body is already read, so the next ASGI message
    is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class CheckRequest(BaseModel):
    traces: list[Trace] = Field(min_length=1)


class RewardRequest(BaseModel):
    responses: list[str] = Field(min_length=1)
    questions: list[str]
    golden_answers: list[Any]


class OpenRLHFRequest(BaseModel):
    """OpenRLHF's remote reward model payload: full texts, their prompts, and the labels."""

    query: list[str] = Field(min_length=1)
    prompts: list[str] | None = None
    labels: list[Any] | None = None


def create_app(
    reward: StepGapReward,
    *,
    max_batch: int = 32,
    max_wait_ms: float = 10.0,
    max_queue: int = 1024,
    max_body_bytes: int = 8 * 1024 * 1024,
) -> Any:
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, Response
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
        "requests refused (queue full or too large)",
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

    batcher = MicroBatcher(
        reward.check,  # a checker fault becomes error verdicts (bracket 0), never a 500
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        on_batch=on_batch,
    )
    queue_depth.set_function(batcher.queue.qsize)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="stepgap", lifespan=lifespan)
    app.state.batcher = batcher

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
            verdicts = await batcher.submit(traces, lambda: _until_disconnected(request))
        except QueueFull as exc:
            rejected.labels("queue_full").inc()
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None
        if verdicts is None:  # nobody is listening any more; nginx's "client closed request"
            rejected.labels("client_gone").inc()
            raise HTTPException(499, "client disconnected")
        return verdicts

    async def rewards(
        responses: list[str], questions: list[str], golden: list[Any], route: str, request: Request
    ) -> list[Any]:
        traces = [
            reward.trace(r, q, golden_list(g), f"{route}-{i}")
            for i, (r, q, g) in enumerate(zip(responses, questions, golden, strict=True))
        ]
        if reward.variant == "search_only":
            return reward.score_traces(traces)
        verdicts = await checked(traces, route, request)
        return [reward.result(t, v) for t, v in zip(traces, verdicts, strict=True)]

    @app.post("/check")
    async def check(body: CheckRequest, request: Request) -> dict[str, Any]:
        segmented = []
        for i, t in enumerate(body.traces):
            try:
                segmented.append(segment_trace(t))
            except SegmentationError as exc:
                raise HTTPException(422, f"traces[{i}] ({t.id!r}): {exc}") from None
        verdicts = await checked(segmented, "check", request)
        return {"verdicts": [[v.model_dump(mode="json") for v in vs] for vs in verdicts]}

    @app.post("/reward")
    async def reward_route(body: RewardRequest, request: Request) -> dict[str, Any]:
        if not len(body.responses) == len(body.questions) == len(body.golden_answers):
            raise HTTPException(
                422, "responses, questions and golden_answers must have equal lengths"
            )
        results = await rewards(
            body.responses, body.questions, body.golden_answers, "reward", request
        )
        return {"rewards": [r.reward for r in results], "results": [r.as_dict() for r in results]}

    @app.post("/get_reward")
    async def get_reward(body: OpenRLHFRequest, request: Request) -> dict[str, Any]:
        n = len(body.query)
        prompts = body.prompts or [""] * n
        if body.labels is None or len(body.labels) != n or len(prompts) != n:
            raise HTTPException(
                422, "query, prompts and labels must have equal lengths (labels = golden answers)"
            )
        responses = [
            q[len(p) :] if p and q.startswith(p) else q
            for q, p in zip(body.query, prompts, strict=True)
        ]
        questions = [question_from_prompt(p or q) for q, p in zip(body.query, prompts, strict=True)]
        results = await rewards(responses, questions, body.labels, "get_reward", request)
        breakdowns = [r.scalars() for r in results]
        extra = {k: [b[k] for b in breakdowns] for k in breakdowns[0] if k != "score"}
        scores = [r.reward for r in results]
        return {"rewards": scores, "scores": scores, "extra_logs": extra}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "variant": reward.variant,
            "lam": reward.lam,
            "queued": batcher.queue.qsize(),
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
