"""How fast `stepgap serve` checks steps, so that admission can tell whether a request's traces
come back before its deadline (`serving/batching.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from stepgap.teacher.judges.concurrency import EngineLimit


@dataclass
class Pace:
    """How fast this server checks steps: enough to tell a new request whether its traces can
    come back before its deadline.

    A judge that measures its own requests (one behind a URL: its `EngineLimit`) gives the rate
    itself: its requests in flight over their latency (Little's law), measured on the requests
    the engine served, never on time spent waiting in this server's queue. Any other judge (a
    model in this process, one call at a time) is measured on whole calls: a call's steps over
    its seconds. Either way, an estimate is only asked while work is queued or in flight: an
    idle server admits what comes (the next request measures the judge again), so it never
    keeps refusing on an old figure.
    """

    judge: EngineLimit | None = None  # the judge's own measure, when it keeps one
    calls: float | None = None  # steps per second over whole calls (moving average)
    weight: float = 0.3  # of the newest call in the moving average

    def observe(self, seconds: float, steps: int) -> None:
        """A whole call of `steps` steps took `seconds`."""
        if steps <= 0 or seconds <= 0:
            return
        rate, w = steps / seconds, self.weight
        self.calls = rate if self.calls is None else (1 - w) * self.calls + w * rate

    def rate(self) -> tuple[float, float] | None:
        """(steps per second, seconds of one step's own round trip), or None before anything
        was measured."""
        if self.judge is not None and (per_second := self.judge.throughput()) is not None:
            return per_second, self.judge.typical_latency() or 0.0
        if self.calls is not None:
            return self.calls, 1 / self.calls
        return None

    def seconds_per_step(self) -> float | None:
        rate = self.rate()
        return None if rate is None else 1 / rate[0]

    def estimate(self, ahead: int, steps: int) -> float | None:
        """Seconds until `steps` more steps are checked behind `ahead` queued or in flight;
        None before anything was measured."""
        rate = self.rate()
        if rate is None:
            return None
        per_second, round_trip = rate
        return (ahead + steps) / per_second + round_trip
