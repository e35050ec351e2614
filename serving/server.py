"""`stepgap serve`: the checker and the reward over HTTP, micro-batched across clients.

Requests from many rollout workers are queued per trace and answered by one checker call per
micro-batch (up to `max_batch` traces, waiting at most `max_wait_ms` for more), so the judge and
the NLI model see large batches. A full queue answers 503 with Retry-After; an oversized body
413; a client that hangs up before its answer has its queued traces dropped (counted as
`stepgap_rejected{reason="client_gone"}`) while the rest of its batch is answered.
Routes: `/check`, `/reward`, `/get_reward` (OpenRLHF's remote reward protocol), `/health`,
`/metrics` (Prometheus), `/view` (an HTML page of the last `view_keep` checked traces).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

try:  # the `serve` extra; at module level so FastAPI can resolve the routes' annotations
    from starlette.requests import Request
except ImportError:  # pragma: no cover - without the extra, create_app says what to install
    Request = Any  # type: ignore[misc,assignment]

from stepgap.data_builders.schema import Trace, Verdict
from stepgap.data_builders.segment import SegmentationError, segment_trace

from .api import (
    CheckRequest,
    CheckResponse,
    HealthResponse,
    OpenRLHFRequest,
    OpenRLHFResponse,
    RewardRequest,
    RewardResponse,
)
from .inputs import golden_list
from .openrlhf import openrlhf_batch, openrlhf_response
from .reward import RewardResult, StepGapReward

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


class RecentTraces:
    """The last `keep` checked traces with their verdicts (and rewards, from the reward routes):
    what `GET /view` shows. Each is kept as the page draws it (`stepgap.eval.view.trace_view`:
    steps, evidence, verdicts, answer and EM; not the raw response) in a deque of at most `keep`,
    so a long-running server holds a bounded amount; older traces are dropped as new ones come."""

    def __init__(self, keep: int = 100) -> None:
        if keep < 0:
            raise ValueError(f"view_keep must be >= 0, got {keep}")
        self.items: deque[dict[str, Any]] = deque(maxlen=keep)
        self._seq = itertools.count(1)

    def add(self, trace: Trace, verdicts: Sequence[Verdict], result: RewardResult | None) -> None:
        from stepgap.eval.view import RewardLine, trace_view

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
        """The page (`stepgap.eval.view.render_html`), newest trace first."""
        from stepgap.eval.view import page_data, render_html

        items = list(reversed(self.items))
        title = f"stepgap serve: the last {len(items)} checked traces (of at most "
        return render_html(page_data(items, ["served"], title=f"{title}{self.items.maxlen})"))


def create_app(
    reward: StepGapReward,
    *,
    max_batch: int = 32,
    max_wait_ms: float = 10.0,
    max_queue: int = 1024,
    max_body_bytes: int = 8 * 1024 * 1024,
    view_keep: int = 100,
) -> Any:
    """The FastAPI app; `view_keep` bounds how many checked traces `GET /view` remembers."""
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

    from stepgap import __version__

    app = FastAPI(
        title="stepgap",
        version=__version__,
        description="Step-level gap checking (CC / IE / MB) and the typed GRPO process reward, "
        "micro-batched across clients. A full queue answers 503 with Retry-After.",
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
        results = [reward.result(t, v) for t, v in zip(traces, verdicts, strict=True)]
        for t, vs, r in zip(traces, verdicts, results, strict=True):
            recent.add(t, vs, r)
        return results

    @app.post("/check", response_model=CheckResponse, summary="verdicts for every step")
    async def check(body: CheckRequest, request: Request) -> dict[str, Any]:
        segmented = []
        for i, t in enumerate(body.traces):
            try:
                segmented.append(segment_trace(t))
            except SegmentationError as exc:
                raise HTTPException(422, f"traces[{i}] ({t.id!r}): {exc}") from None
        verdicts = await checked(segmented, "check", request)
        for t, vs in zip(segmented, verdicts, strict=True):
            recent.add(t, vs, None)
        return {"verdicts": [[v.model_dump(mode="json") for v in vs] for vs in verdicts]}

    @app.post("/reward", response_model=RewardResponse, summary="rewards for rollouts")
    async def reward_route(body: RewardRequest, request: Request) -> dict[str, Any]:
        if not len(body.responses) == len(body.questions) == len(body.golden_answers):
            raise HTTPException(
                422, "responses, questions and golden_answers must have equal lengths"
            )
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
            "status": "ok",
            "variant": reward.variant,
            "lam": reward.lam,
            "queued": batcher.queue.qsize(),
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
    max_body_mb: int = 8,
    view_keep: int = 100,
) -> None:
    """Run the app with uvicorn until interrupted (`stepgap serve`)."""
    from stepgap.teacher.judges.replay import ReplayJudge

    if isinstance(getattr(reward.checker, "judge", None), ReplayJudge):
        raise ValueError(
            "a replay judge answers by trace id, and the rollouts the server scores get new ids "
            "(reward-0, get_reward-0, ...): every step would fail. Serve a model judge "
            "(--judge openai:MODEL, hf:PATH, student:PATH) or an exported --bundle"
        )
    import uvicorn

    app = create_app(
        reward,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        max_body_bytes=max_body_mb * 1024 * 1024,
        view_keep=view_keep,
    )
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=30)
