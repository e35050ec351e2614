"""The reward server's Prometheus metrics (`GET /metrics`): requests, rejections, drops, batch
sizes, and gauges read off the batcher, the judge's limit and an in-process engine when scraped."""

from __future__ import annotations

from typing import Any

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
