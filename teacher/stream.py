"""`Checker.check_stream`: one stream of judge requests across traces, each trace decided as
soon as its own answers are in. A worker thread feeds the judge chunks of whole traces; the
judge's `on_result` hook reports each answer as it arrives (the rest arrive with the call's
return value); the reading thread decides the finished traces in NLI batches."""

from __future__ import annotations

import contextlib
import heapq
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from stepgap.clock import TraceDeadline
from stepgap.schema import Trace, Verdict
from stepgap.tree import JudgeResult

from .judges.base import JudgeBackend, JudgeRequest, JudgeStopped, ResultHook

RequestsOf = Callable[[Trace], list[JudgeRequest]]
"""A trace's judge requests, one per step (`Checker.judge_requests`)."""
DecideJudged = Callable[[Sequence[tuple[Trace, list[JudgeResult]]]], list[list[Verdict]]]
"""Verdicts of judged traces, decided together (`Checker.decide_judged`)."""


class _Stopped(Exception):
    """Raised from the judge's result hook to end a stream whose reader has gone."""


class _Waiting:
    """A trace whose judge answers are coming in."""

    __slots__ = ("position", "trace", "results", "missing")

    def __init__(self, position: int, trace: Trace, steps: int) -> None:
        self.position = position
        self.trace = trace
        self.results: list[JudgeResult | None] = [None] * steps
        self.missing = steps


class _ResultHooks:
    """The `on_result` hook of a judge that streams run on: it fans each answer out to every
    stream in flight (and to the hook the judge had before), so concurrent streams on one judge
    neither replace nor outlive each other's hooks."""

    def __init__(self, original: ResultHook | None) -> None:
        self.original = original
        self.streams: list[ResultHook] = []

    def __call__(self, request: JudgeRequest, result: JudgeResult) -> None:
        if self.original is not None:
            self.original(request, result)
        for hook in list(self.streams):
            hook(request, result)

    @classmethod
    def attach(cls, judge: JudgeBackend, hook: ResultHook) -> None:
        with _HOOKS_LOCK:
            current = judge.on_result
            hooks = current if isinstance(current, cls) else cls(current)
            hooks.streams.append(hook)
            judge.on_result = hooks

    @classmethod
    def detach(cls, judge: JudgeBackend, hook: ResultHook) -> None:
        with _HOOKS_LOCK:
            hooks = judge.on_result
            if not isinstance(hooks, cls):
                return
            hooks.streams = [h for h in hooks.streams if h != hook]
            if not hooks.streams:  # the last stream gone: the judge's own hook again
                judge.on_result = hooks.original


_HOOKS_LOCK = threading.Lock()


@contextlib.contextmanager
def hearing_answers(judge: JudgeBackend | None, hook: ResultHook) -> Iterator[None]:
    """`hook` hears each answer of `judge` (if any) as it comes, beside the streams and the
    judge's own hook, until the block ends."""
    if judge is None:
        yield
        return
    _ResultHooks.attach(judge, hook)
    try:
        yield
    finally:
        _ResultHooks.detach(judge, hook)


class JudgeStream:
    """`Checker.check_stream` (see the module docstring): `run()` yields (trace, verdicts)."""

    def __init__(
        self,
        judge: JudgeBackend,
        requests_of: RequestsOf,
        decide: DecideJudged,
        traces: Iterable[Trace],
        batch_size: int,
        chunk_requests: int,
        stop: threading.Event | None = None,
        deadlines: Sequence[TraceDeadline | None] | None = None,
    ) -> None:
        self.judge, self.requests_of, self.decide = judge, requests_of, decide
        self.deadlines = deadlines
        self.traces = iter(traces)
        self.batch_size = batch_size
        # at least a few rounds of the judge's concurrency per call, so a call's last,
        # slowest answers are a small part of it
        concurrency = max(1, judge.concurrency)
        self.chunk_requests = max(chunk_requests, 16 * concurrency)
        self.events: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self.chunks: queue.Queue[list[JudgeRequest] | None] = queue.Queue()
        self.stop = stop if stop is not None else threading.Event()
        self.current: frozenset[int] = frozenset()  # ids of the requests of the call in flight
        self.owner: dict[int, tuple[JudgeRequest, _Waiting, int]] = {}
        self.ready: list[tuple[int, _Waiting]] = []  # a heap by input position
        self.position = 0
        self.exhausted = False

    def _hook(self, request: JudgeRequest, result: JudgeResult) -> None:
        if id(request) in self.current:
            if self.stop.is_set():
                raise _Stopped
            self.events.put(("result", request, result))

    def _work(self) -> None:
        judge = self.judge
        try:
            while (requests := self.chunks.get()) is not None and not self.stop.is_set():
                self.current = frozenset(map(id, requests))
                try:  # a judge closes its requests in flight at once when stopped
                    results = judge.judge(requests, stop=self.stop)
                except (_Stopped, JudgeStopped):
                    return
                except BaseException as exc:  # JudgeConfigError and the like: the reader raises
                    self.events.put(("error", exc, None))
                    return
                self.events.put(("done", requests, results))
        finally:
            self.current = frozenset()
            _ResultHooks.detach(judge, self._hook)

    def _submit_chunk(self) -> int:
        """Build the next chunk of requests (whole traces) and queue it: 1 judge call queued,
        or 0 at the end of the input."""
        requests: list[JudgeRequest] = []
        while not self.exhausted and len(requests) < self.chunk_requests:
            trace = next(self.traces, None)
            if trace is None:
                self.exhausted = True
                break
            own = self.requests_of(trace)
            if self.deadlines is not None:
                for request in own:
                    request.deadline = self.deadlines[self.position]
            waiting = _Waiting(self.position, trace, len(own))
            self.position += 1
            for i, request in enumerate(own):
                self.owner[id(request)] = (request, waiting, i)
            if not own:
                heapq.heappush(self.ready, (waiting.position, waiting))
            requests.extend(own)
        if not requests:
            return 0
        self.chunks.put(requests)
        return 1

    def _deliver(self, request: JudgeRequest, result: JudgeResult) -> None:
        found = self.owner.pop(id(request), None)
        if found is None or found[0] is not request:
            return  # already delivered by the hook
        _, waiting, i = found
        waiting.results[i] = result
        waiting.missing -= 1
        if waiting.missing == 0:
            heapq.heappush(self.ready, (waiting.position, waiting))

    def _handle(self, kind: str, a: Any, b: Any) -> int:
        """One event from the worker; returns how many judge calls it finished."""
        if kind == "error":
            raise a
        if kind == "result":
            self._deliver(a, b)
            return 0
        for request, result in zip(a, b, strict=True):  # "done": what no hook reported
            self._deliver(request, result)
        return 1

    def run(self) -> Iterator[tuple[Trace, list[Verdict]]]:
        _ResultHooks.attach(self.judge, self._hook)
        worker = threading.Thread(target=self._work, name="stepgap-judge-stream", daemon=True)
        worker.start()
        calls = 0  # judge calls queued or running
        finished = failed = False
        try:
            while not self.stop.is_set():
                # two calls queued: the judge starts the next one as soon as one returns
                while calls < 2 and not self.exhausted:
                    calls += self._submit_chunk()
                if not calls and not self.ready:
                    finished = True
                    break
                if not self.ready:
                    try:  # in slices, so that a stop set from outside is seen
                        calls -= self._handle(*self.events.get(timeout=0.05))
                    except queue.Empty:
                        continue
                while True:  # everything that has arrived meanwhile
                    try:
                        calls -= self._handle(*self.events.get_nowait())
                    except queue.Empty:
                        break
                while self.ready:
                    batch = [
                        heapq.heappop(self.ready)[1]
                        for _ in range(min(self.batch_size, len(self.ready)))
                    ]
                    yield from self._decide(batch)
        except KeyboardInterrupt:  # the command ends the process at once (`stepgap.cli.console`)
            raise
        except BaseException:  # an error, or the reader closing the stream
            failed = True
            raise
        finally:
            self.stop.set()
            self.chunks.put(None)
            if finished or failed:
                # the judge call in flight ends at its next answer: an error reaches the caller
                # only once no thread of the stream is left inside a native call (torch's, say),
                # which would abort the process as it exits
                worker.join()

    def _decide(self, batch: list[_Waiting]) -> Iterator[tuple[Trace, list[Verdict]]]:
        decided = self.decide([(w.trace, w.results) for w in batch])  # type: ignore[misc]
        for w, verdicts in zip(batch, decided, strict=True):
            yield w.trace, verdicts
