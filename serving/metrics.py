"""The reward server's Prometheus metrics (`GET /metrics`): requests, rejections, drops, batch
sizes, and gauges read off the batcher, the judge's limit and an in-process engine when scraped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepgap.reward_arithmetic import RewardResult
from stepgap.teacher.judges.concurrency import EngineLimit

from .batching import MicroBatcher


class ServerMetrics:
    """One registry of the server's metrics; the routes count into it, the batcher reports its
    batches and drops to it (`on_batch`, `on_drop`), and `watch` binds the gauges."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "stepgap_requests", "HTTP requests by route", ["route"], registry=registry
        )
        self.rejected = Counter(
            "stepgap_rejected",
            "requests not answered with rewards: too_large, queue_full, overloaded (the backlog "
            "outlasts the deadline), deadline (not checked in time), shutdown, client_gone, "
            "no_reward (a step check failed: OpenRLHF's route)",
            ["reason"],
            registry=registry,
        )
        self.failed_traces = Counter(
            "stepgap_traces_failed",
            "traces with a failed step check (a judge that is down, an answer that cannot be "
            "parsed): no reward, unless on_failed_check=zero",
            registry=registry,
        )
        self.dropped = Counter(
            "stepgap_traces_dropped",
            "traces whose request ended before they were checked (client_gone, deadline); "
            "their check goes on --keep-for-retry s for the client's retry",
            ["reason"],
            registry=registry,
        )
        self.traces = Counter("stepgap_traces_checked", "traces checked", registry=registry)
        self.steps = Counter(
            "stepgap_steps",
            "steps of the rewarded rollouts by label (failed: its check failed); a label's rate "
            "is its share of the sum",
            ["label"],
            registry=registry,
        )
        self.repair_chances = Counter(
            "stepgap_repair_chances",
            "steps of rewarded rollouts that follow a gap",
            registry=registry,
        )
        self.repairs = Counter(
            "stepgap_repairs",
            "steps that follow a gap and made its repair (the repair rate: over repair_chances)",
            registry=registry,
        )
        self.batch_size = Histogram(
            "stepgap_batch_size",
            "traces per checker call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=registry,
        )

    def on_batch(self, traces: int) -> None:
        """A checker call of `traces` traces started."""
        self.batch_size.observe(traces)
        self.traces.inc(traces)

    def on_results(self, results: Sequence[RewardResult]) -> None:
        """Rollouts scored: their steps by label, their repairs, those with a failed check."""
        for r in results:
            for step in r.steps:
                self.steps.labels(step.label or "failed").inc()
            chances, made = r.repairs()
            self.repair_chances.inc(chances)
            self.repairs.inc(made)
        self.failed_traces.inc(sum(r.failed_checks > 0 for r in results))

    def on_drop(self, reason: str, traces: int) -> None:
        """`traces` traces' request ended before they were checked (`client_gone`,
        `deadline`)."""
        self.dropped.labels(reason).inc(traces)

    def watch(self, batcher: MicroBatcher, judge_limit: EngineLimit | None, engine: Any) -> None:
        """The gauges, read when scraped: the batcher's queue, calls and pace; the judge's limit
        of requests in flight, where it keeps one; vLLM's async engine in this process."""
        from prometheus_client import Gauge

        def gauge(name: str, help: str, read: Any) -> None:
            Gauge(name, help, registry=self.registry).set_function(read)

        gauge("stepgap_queue_depth", "traces waiting for a batch", batcher.queue.qsize)
        gauge("stepgap_checks_in_flight", "checker calls running", lambda: len(batcher.calls))
        gauge(
            "stepgap_seconds_per_step",
            "seconds the server needs per step at its measured rate (what admission plans with; "
            "0 before the first measure)",
            lambda: batcher.pace.seconds_per_step() or 0.0,
        )
        if judge_limit is not None:
            gauge(
                "stepgap_judge_limit",
                "judge requests in flight at most over all calls (the engine's slots plus a "
                "margin, where known; 0: no limit beyond each call's --concurrency)",
                lambda: judge_limit.limit or 0,
            )
        if engine is not None:
            gauge(
                "stepgap_engine_requests",
                "judge requests in the in-process engine now (running or waiting)",
                engine.unfinished,
            )
            gauge(
                "stepgap_engine_aborted",
                "judge requests aborted inside the engine (deadline passed, client gone, shutdown)",
                lambda: engine.aborted,
            )

    def render(self) -> tuple[bytes, str]:
        """(the exposition text, its content type)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
