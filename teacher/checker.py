"""The checker interface (`StepChecker`) and the hybrid checker (`Checker`): the judge (stages
A-C), the NLI model (stages D-E) and the decision tree, over traces.

How a batch of judged traces is decided lives in `decide.py`, the stream that decides each trace
as soon as its answers are in in `stream.py`, re-deciding stored verdicts in `relabel.py`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from stepgap.clock import TraceDeadline
from stepgap.schema import Trace, Verdict
from stepgap.tree import JudgeResult, TreeConfig

from .decide import decide_batch, step_nli_features
from .judges.base import JudgeBackend, JudgeRequest
from .nli.base import NLIBackend
from .prompt import PROMPT_VERSION, build_requests
from .stream import JudgeStream


class StepChecker(ABC):
    """What labels every step of segmented traces with a typed gap verdict: the hybrid checker
    here, a bundle's offline checker, a pool of Ray actors, replicas behind a URL.

    `check` and `provenance` are what a checker must write; `check_stream` (in batches of
    `check`), `check_trace` and `close` have defaults. `judge` is the checker's own judge in
    this process (None for one whose judges live elsewhere)."""

    judge: JudgeBackend | None = None

    @abstractmethod
    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        """Verdicts per trace, per step; traces must be segmented (`steps` set)."""

    @property
    @abstractmethod
    def provenance(self) -> dict[str, object]:
        """What every verdict of this checker records about what decided it."""

    def check_stream(
        self,
        traces: Iterable[Trace],
        *,
        batch_size: int = 16,
        chunk_requests: int = 4096,
        stop: threading.Event | None = None,
        deadlines: Sequence[TraceDeadline | None] | None = None,
    ) -> Iterator[tuple[Trace, list[Verdict]]]:
        """(trace, its verdicts) for every trace: here `check` over batches of `batch_size`
        traces in input order, until `stop` is set. `chunk_requests` and `deadlines` are for a
        checker that feeds its own judge (`Checker`)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        it = iter(traces)
        while not (stop is not None and stop.is_set()) and (batch := list(islice(it, batch_size))):
            yield from zip(batch, self.check(batch), strict=True)

    def check_trace(self, trace: Trace) -> list[Verdict]:
        return self.check([trace])[0]

    def request_sizes(self, trace: Trace) -> list[float]:
        """What checking each step costs, in the unit its judge's `EngineLimit` measures: one
        a step here (a checker whose judge, if any, is elsewhere)."""
        return [1.0] * len(trace.steps or [])

    def close(self) -> None:
        """Free what the checker holds (a vLLM engine and its GPU memory); it is not used
        after. Nothing, by default."""
        return None  # noqa: B027 - a default, not an abstract method


class Checker(StepChecker):
    """The hybrid checker: a judge and an NLI model in this process, one decision tree.

    A judge with `nli_features = True` (a student trained with them) gets each step's NLI
    features in its prompt, computed with the checker's own NLI backend. A subclass that
    changes the judge's answers before the tree sees them overrides `revise` (both `check` and
    the stream apply it).
    """

    judge: JudgeBackend

    def __init__(
        self, judge: JudgeBackend, nli: NLIBackend, config: TreeConfig | None = None
    ) -> None:
        self.judge = judge
        self.nli = nli
        self.config = config or TreeConfig()

    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        """Verdicts per trace, per step; traces must be segmented (`steps` set)."""
        return self.decide_judged(list(zip(traces, self.judge_traces(traces), strict=True)))

    def close(self) -> None:
        self.judge.close()

    @property
    def provenance(self) -> dict[str, object]:
        """What every verdict of this checker records about the models that decided it."""
        return {"judge": self.judge.provenance, "nli": self.nli.provenance}

    def judge_traces(self, traces: Sequence[Trace]) -> list[list[JudgeResult]]:
        """Stages A-C for every step of every trace, in one call to the judge backend."""
        requests = [r for t in traces for r in self.judge_requests(t)]
        results = iter(self.judge.judge(requests))
        return [[next(results) for _ in t.steps or []] for t in traces]

    def revise(self, trace: Trace, judged: list[JudgeResult]) -> list[JudgeResult]:
        """The judge's answers for a trace's steps as the tree sees them: unchanged here."""
        return judged

    def decide_judged(
        self, judged: Sequence[tuple[Trace, list[JudgeResult]]]
    ) -> list[list[Verdict]]:
        """Stages D-E and the tree for judged traces (each with its judge's answers, one per
        step, through `revise`), with one batched NLI call for all of them."""
        items = [(t.id, t.question, t.steps or [], self.revise(t, list(r))) for t, r in judged]
        return decide_batch(items, self.nli, self.config, PROMPT_VERSION, self.provenance)

    def judge_requests(self, trace: Trace) -> list[JudgeRequest]:
        """The judge requests of a trace's steps (with NLI features for a judge that wants them).
        Step i's request reads only steps 0..i, so a rollout's step can be asked about before
        the rollout ends (`serving.streaming`)."""
        if trace.steps is None:
            raise ValueError(f"trace {trace.id!r} is not segmented; run segment_trace first")
        features = (
            step_nli_features(trace.question, trace.steps, self.nli, self.config)
            if self.judge.nli_features
            else None
        )
        return build_requests(
            trace.id,
            trace.question,
            trace.steps,
            features,
            earlier_evidence_chars=self.judge.earlier_evidence_chars,
        )

    def request_sizes(self, trace: Trace) -> list[float]:
        """Each step's judge request size (`JudgeRequest.size`, its prompt's characters; the
        NLI features a judge may add are left out), as its judge's limit measures them."""
        chars = self.judge.earlier_evidence_chars
        requests = build_requests(trace.id, trace.question, trace.steps or [],
                                  earlier_evidence_chars=chars)  # fmt: skip
        return [float(r.size) for r in requests]

    def decide(self, trace: Trace, judged: Sequence[JudgeResult]) -> list[Verdict]:
        """Stages D-E and the tree for a segmented trace whose judge answers (one per step, in
        step order) are in: the verdicts `check` would give with those answers."""
        return self.decide_judged([(trace, list(judged))])[0]

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
        which bounds the prompts held in memory.

        `stop`, set from another thread, ends the stream early (a server whose clients have all
        gone): the judge call in flight ends (closing its requests at once, or at its next
        answer), and nothing more is yielded. `deadlines`, one per trace in input order, go with
        each trace's judge requests (`JudgeRequest.deadline`). Several streams may run on one
        judge at once (each in its own thread).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        stream = JudgeStream(
            self.judge, self.judge_requests, self.decide_judged, traces, batch_size,
            chunk_requests, stop, deadlines,
        )  # fmt: skip
        yield from stream.run()
