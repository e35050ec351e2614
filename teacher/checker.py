"""The hybrid checker: judge (stages A-C) + NLI (stages D-E) + the decision tree, over traces.

Each verdict carries what it was decided from (the question, the step, the judge object, every
NLI call, and the NLI calls the `-A`/`-E` ablations would need), so `relabel` can re-decide any
file of verdicts under another ablation or threshold without calling a model.
"""

from __future__ import annotations

import heapq
import inspect
import logging
import queue
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, fields
from itertools import islice
from pathlib import Path
from typing import Any

from stepgap.io import ErrorReport, JsonlWriter, check_output, read_models
from stepgap.schema import NLICall, NLIProbs, Step, Trace, Verdict
from stepgap.tree import (
    JudgeResult,
    NLIError,
    Pair,
    TreeConfig,
    ablation_configs,
    decide_trace,
    hypothesis_for,
    nli_pairs_needed,
)

from .judges.base import JudgeBackend, JudgeRequest, JudgeStopped, TraceDeadline, close_judge
from .judges.replay import ReplayJudge
from .nli.base import NLIBackend
from .nli.replay import ReplayNLI
from .prompt import PROMPT_VERSION, build_requests

log = logging.getLogger(__name__)


class _ScoredPairs:
    """NLI answers for a batch, scored once; a pair that failed raises when the tree asks."""

    def __init__(self, backend: NLIBackend, pairs: Iterable[Pair]) -> None:
        unique = list(dict.fromkeys(pairs))
        self.probs: dict[Pair, NLIProbs] = {}
        self.errors: dict[Pair, str] = {}
        if not unique:
            return
        try:
            self.probs = dict(zip(unique, backend.predict(unique), strict=True))
        except NLIError:
            for pair in unique:  # isolate the failing pairs; the rest still get scored
                try:
                    self.probs[pair] = backend.predict([pair])[0]
                except NLIError as exc:
                    self.errors[pair] = str(exc)

    def __call__(self, pairs: Sequence[Pair]) -> list[NLIProbs]:
        for pair in pairs:
            if pair in self.errors:
                raise NLIError(self.errors[pair])
        return [self.probs[p] for p in pairs]


def provenance(backend: object) -> dict[str, str | None]:
    """`{"spec", "note"}` of a judge or NLI backend (see `Verdict.checker`)."""
    found = getattr(backend, "provenance", None)
    return dict(found) if found else {"spec": type(backend).__name__, "note": None}


def _decide_batch(
    items: Sequence[tuple[str, str, Sequence[Step], Sequence[JudgeResult]]],
    nli: NLIBackend,
    config: TreeConfig,
    prompt_version: str | None,
    checker: dict[str, object] | None = None,
) -> list[list[Verdict]]:
    """Decide a batch of judged traces with one batched NLI call for all their pairs."""
    needed: list[list[list[NLICall]]] = []  # per trace, per config, per step
    for trace_id, question, steps, judged in items:
        per_cfg = [
            nli_pairs_needed(trace_id, question, steps, judged, cfg)
            for cfg in ablation_configs(config)
        ]
        needed.append(per_cfg)
    scored = _ScoredPairs(
        nli,
        (
            (c.premise, c.hypothesis)
            for per_cfg in needed
            for calls_by_step in per_cfg
            for calls in calls_by_step
            for c in calls
        ),
    )
    out = []
    for (trace_id, question, steps, judged), per_cfg in zip(items, needed, strict=True):
        verdicts = decide_trace(trace_id, question, steps, judged, scored, config)
        for i, v in enumerate(verdicts):
            on_path = {(c.premise, c.hypothesis) for c in v.nli}
            extra: dict[Pair, NLICall] = {}
            for calls_by_step in per_cfg[1:]:
                for c in calls_by_step[i]:
                    pair = (c.premise, c.hypothesis)
                    if pair not in on_path and pair in scored.probs and pair not in extra:
                        extra[pair] = c.model_copy(update={"probs": scored.probs[pair]})
            v.nli_extra = list(extra.values())
            v.question = question
            v.step_data = steps[i]
            v.prompt_version = prompt_version
            v.checker = checker
            v.tree = asdict(config)
        out.append(verdicts)
    return out


def step_nli_features(
    question: str, steps: Sequence[Step], nli: NLIBackend, config: TreeConfig | None = None
) -> list[list[dict[str, object]]]:
    """Per step, the NLI probabilities of each of its own snippets against its hypothesis.

    The input of the paper's "with NLI features" student; scored in one batched NLI call.
    """
    config = config or TreeConfig()
    pairs = [
        (snip.text, hypothesis_for(step, question, config.hypothesis))
        for step in steps
        for snip in step.evidence
    ]
    probs = iter(nli.predict(pairs) if pairs else [])
    out = []
    for step in steps:
        feats: list[dict[str, object]] = []
        for snip in step.evidence:
            p = next(probs)
            feats.append(
                {
                    "title": snip.title,
                    "entailment": round(p.entailment, 3),
                    "neutral": round(p.neutral, 3),
                    "contradiction": round(p.contradiction, 3),
                }
            )
        out.append(feats)
    return out


class Checker:
    """Labels every step of segmented traces with a typed gap verdict.

    A judge with `nli_features = True` (a student trained with them) gets each step's NLI
    features in its prompt, computed with the checker's own NLI backend.
    """

    def __init__(
        self, judge: JudgeBackend, nli: NLIBackend, config: TreeConfig | None = None
    ) -> None:
        self.judge = judge
        self.nli = nli
        self.config = config or TreeConfig()

    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        """Verdicts per trace, per step; traces must be segmented (`steps` set)."""
        items = [
            (t.id, t.question, t.steps, judged)
            for t, judged in zip(traces, self.judge_traces(traces), strict=True)
        ]
        return _decide_batch(items, self.nli, self.config, PROMPT_VERSION, self.provenance)  # type: ignore[arg-type]

    def close(self) -> None:
        """Free what the judge holds (a vLLM engine and its GPU memory); the checker is not
        used after."""
        close_judge(self.judge)

    @property
    def provenance(self) -> dict[str, object]:
        """What every verdict of this checker records about the models that decided it."""
        return {"judge": provenance(self.judge), "nli": provenance(self.nli)}

    def judge_traces(self, traces: Sequence[Trace]) -> list[list[JudgeResult]]:
        """Stages A-C for every step of every trace, in one call to the judge backend."""
        requests = [r for t in traces for r in self.judge_requests(t)]
        results = iter(self.judge.judge(requests))
        return [[next(results) for _ in t.steps] for t in traces]  # type: ignore[union-attr]

    def judge_requests(self, trace: Trace) -> list[JudgeRequest]:
        """The judge requests of a trace's steps (with NLI features for a judge that wants them).
        Step i's request reads only steps 0..i, so a rollout's step can be asked about before
        the rollout ends (`serving.streaming`)."""
        if trace.steps is None:
            raise ValueError(f"trace {trace.id!r} is not segmented; run segment_trace first")
        features = (
            step_nli_features(trace.question, trace.steps, self.nli, self.config)
            if getattr(self.judge, "nli_features", False)
            else None
        )
        return build_requests(
            trace.id,
            trace.question,
            trace.steps,
            features,
            earlier_evidence_chars=getattr(self.judge, "earlier_evidence_chars", None),
        )

    def decide(self, trace: Trace, judged: Sequence[JudgeResult]) -> list[Verdict]:
        """Stages D-E and the tree for a segmented trace whose judge answers (one per step, in
        step order) are in: the verdicts `check` would give with those answers."""
        return _decide_batch(
            [(trace.id, trace.question, trace.steps or [], judged)],
            self.nli,
            self.config,
            PROMPT_VERSION,
            self.provenance,  # type: ignore[arg-type]
        )[0]

    def check_stream(
        self,
        traces: Iterable[Trace],
        *,
        batch_size: int = 16,
        chunk_requests: int = 4096,
        stop: threading.Event | None = None,
        deadlines: Sequence[TraceDeadline | None] | None = None,
    ) -> Iterator[tuple[Trace, list[Verdict]]]:
        """(trace, its verdicts) for every trace, as soon as its own judge answers are in.

        Unlike `check` over batches, no trace waits for another trace's answers: the judge is
        fed one stream of requests (a concurrent backend keeps its `concurrency` requests in
        flight across traces), and each trace whose answers are complete is decided at once,
        with at most `batch_size` such traces sharing one NLI call, while the judge goes on.
        Traces come out in the order they finish (input order among those finishing
        together). The judge is called on `chunk_requests` requests at a time (whole traces),
        which bounds the prompts held in memory. A subclass that changes `check` or
        `judge_traces` is checked in batches of `batch_size` traces, in input order.

        `stop`, set from another thread, ends the stream early (a server whose clients have all
        gone): the judge call in flight ends (a judge that takes `stop` closes its requests at
        once, another at its next answer), and nothing more is yielded. `deadlines`, one per
        trace in input order, go with each trace's judge requests (`JudgeRequest.deadline`).
        Several streams may run on one judge at once (each in its own thread).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        cls = type(self)
        if cls.check is not Checker.check or cls.judge_traces is not Checker.judge_traces:
            it = iter(traces)
            while not (stop is not None and stop.is_set()) and (
                batch := list(islice(it, batch_size))
            ):
                yield from zip(batch, self.check(batch), strict=True)
            return
        yield from _JudgeStream(self, traces, batch_size, chunk_requests, stop, deadlines).run()

    def check_trace(self, trace: Trace) -> list[Verdict]:
        return self.check([trace])[0]


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

    def __init__(self, original: Any) -> None:
        self.original = original
        self.streams: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, request: JudgeRequest, result: JudgeResult) -> None:
        if self.original is not None:
            self.original(request, result)
        for hook in list(self.streams):
            hook(request, result)

    @classmethod
    def attach(cls, judge: Any, hook: Any) -> None:
        with _HOOKS_LOCK:
            current = getattr(judge, "on_result", None)
            hooks = current if isinstance(current, cls) else cls(current)
            hooks.streams.append(hook)
            judge.on_result = hooks

    @classmethod
    def detach(cls, judge: Any, hook: Any) -> None:
        with _HOOKS_LOCK:
            hooks = getattr(judge, "on_result", None)
            if not isinstance(hooks, cls):
                return
            hooks.streams = [h for h in hooks.streams if h != hook]
            if not hooks.streams:  # the last stream gone: the judge's own hook again
                judge.on_result = hooks.original


_HOOKS_LOCK = threading.Lock()


class _JudgeStream:
    """`Checker.check_stream`: a worker thread feeds the judge chunks of requests; the judge's
    `on_result` hook (OpenAI and HF judges) reports each answer as it arrives, and the rest
    arrive with the call's return value; the reading thread decides the finished traces."""

    def __init__(
        self,
        checker: Checker,
        traces: Iterable[Trace],
        batch_size: int,
        chunk_requests: int,
        stop: threading.Event | None = None,
        deadlines: Sequence[TraceDeadline | None] | None = None,
    ) -> None:
        self.checker = checker
        self.deadlines = deadlines
        self.traces = iter(traces)
        self.batch_size = batch_size
        # at least a few rounds of the judge's concurrency per call, so a call's last,
        # slowest answers are a small part of it
        concurrency = int(getattr(checker.judge, "concurrency", 1) or 1)
        self.chunk_requests = max(chunk_requests, 16 * concurrency)
        self.events: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self.chunks: queue.Queue[list[JudgeRequest] | None] = queue.Queue()
        self.stop = stop if stop is not None else threading.Event()
        self.current: frozenset[int] = frozenset()  # ids of the requests of the call in flight
        self.owner: dict[int, tuple[JudgeRequest, _Waiting, int]] = {}
        self.ready: list[tuple[int, _Waiting]] = []  # a heap by input position
        self.position = 0
        self.exhausted = False
        self.hooked = hasattr(checker.judge, "on_result")

    def _hook(self, request: JudgeRequest, result: JudgeResult) -> None:
        if id(request) in self.current:
            if self.stop.is_set():
                raise _Stopped
            self.events.put(("result", request, result))

    def _work(self) -> None:
        judge = self.checker.judge
        try:
            takes_stop = "stop" in inspect.signature(judge.judge).parameters
            while (requests := self.chunks.get()) is not None and not self.stop.is_set():
                self.current = frozenset(map(id, requests))
                try:
                    if takes_stop:  # closes its requests in flight at once when stopped
                        results = judge.judge(requests, stop=self.stop)
                    else:
                        results = judge.judge(requests)
                except (_Stopped, JudgeStopped):
                    return
                except BaseException as exc:  # JudgeConfigError and the like: the reader raises
                    self.events.put(("error", exc, None))
                    return
                self.events.put(("done", requests, results))
        finally:
            self.current = frozenset()
            if self.hooked:
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
            own = self.checker.judge_requests(trace)
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
        judge = self.checker.judge
        if self.hooked:
            _ResultHooks.attach(judge, self._hook)
        worker = threading.Thread(target=self._work, name="stepgap-judge-stream", daemon=True)
        worker.start()
        calls = 0  # judge calls queued or running
        finished = False
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
        finally:
            self.stop.set()
            self.chunks.put(None)
            if finished:
                worker.join()

    def _decide(self, batch: list[_Waiting]) -> Iterator[tuple[Trace, list[Verdict]]]:
        checker = self.checker
        items = [(w.trace.id, w.trace.question, w.trace.steps, w.results) for w in batch]
        decided = _decide_batch(
            items,  # type: ignore[arg-type]
            checker.nli,
            checker.config,
            PROMPT_VERSION,
            checker.provenance,
        )
        for w, verdicts in zip(batch, decided, strict=True):
            yield w.trace, verdicts


def group_by_trace(verdicts: Iterable[Verdict]) -> dict[str, list[Verdict]]:
    """Verdicts per trace id, in step order."""
    groups: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        groups[v.trace_id].append(v)
    return {k: sorted(vs, key=lambda v: v.step) for k, vs in groups.items()}


class RelabelError(ValueError):
    pass


def recorded_config(verdicts: Sequence[Verdict], **overrides: Any) -> TreeConfig:
    """The tree config the verdicts of one trace were decided with (`Verdict.tree`; the
    defaults for verdicts written before it was recorded), with `overrides` applied."""
    names = {f.name for f in fields(TreeConfig)}
    recorded = {k: v for k, v in (verdicts[0].tree or {}).items() if k in names}
    return TreeConfig(**{**recorded, **overrides})


def relabel(
    verdicts: Sequence[Verdict], config: TreeConfig | None = None, **overrides: Any
) -> Iterator[Verdict]:
    """Re-decide stored verdicts from their stored judge and NLI outputs: under `config` when
    given, else under the config each trace recorded with `overrides` applied (no overrides:
    the same verdicts again)."""
    nli = ReplayNLI.from_verdicts(verdicts)
    judge = ReplayJudge.from_verdicts(verdicts)
    for trace_id, group in group_by_trace(verdicts).items():
        cfg = config or recorded_config(group, **overrides)
        question = group[0].question
        steps = [v.step_data for v in group]
        if question is None or any(s is None for s in steps):
            raise RelabelError(
                f"trace {trace_id!r}: verdicts lack 'question'/'step_data'; "
                "relabel needs verdicts written by stepgap check or label"
            )
        judged = [
            judge.table.get((trace_id, v.step)) or JudgeResult.failed(v.error or "no judge output")
            for v in group
        ]
        (new,) = _decide_batch([(trace_id, question, steps, judged)], nli, cfg, None)  # type: ignore[list-item]
        for old, v in zip(group, new, strict=True):
            v.prompt_version = old.prompt_version
            v.checker = old.checker  # the stored answers came from the original models
            yield v


def relabel_file(
    input_path: str | Path,
    output: str | Path,
    config: TreeConfig | None = None,
    report: ErrorReport | None = None,
    **overrides: Any,
) -> int:
    """`relabel` over a verdicts file (`stepgap relabel`); returns the verdicts written."""
    check_output(output, input_path)
    verdicts = [v for _, v in read_models(input_path, Verdict, report)]
    n = 0
    with JsonlWriter(output, input_path) as out:
        for v in relabel(verdicts, config, **overrides):
            out.write(v)
            n += 1
    return n
