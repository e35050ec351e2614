"""How fast `stepgap serve` checks steps, so that admission can tell whether a request's traces
come back before its deadline (`serving/batching.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from stepgap.teacher.judges.concurrency import EngineLimit


@dataclass
class Pace:
    """How fast this server checks steps: enough to tell a new request whether its traces can
    come back before its deadline. Work is counted in cost (`MicroBatcher.cost_of`: its judge
    requests' prompt characters, from the checker, since prompts differ in length by several
    times; else its steps).

    A judge that measures its own requests (one behind a URL: its `EngineLimit`) gives the rate
    itself: the cost in flight over the requests' latency (Little's law), measured on the
    requests the engine served, never on time spent waiting in this server's queue, and read
    as at least the age of its oldest request in flight. Any other judge (a model in this
    process, one call at a time) is measured on whole calls: a call's cost over its seconds.
    Either way, an estimate is only asked while work is queued or in flight: an idle server
    admits what comes (the next request measures the judge again), so it never keeps refusing
    on an old figure.
    """

    judge: EngineLimit | None = None  # the judge's own measure, when it keeps one
    calls: float | None = None  # cost per second over whole calls (moving average)
    per_step: float | None = None  # cost per step of the calls seen (moving average)
    weight: float = 0.3  # of the newest call in the moving averages

    def observe(self, seconds: float, cost: float, steps: int) -> None:
        """A whole call of `steps` steps, costing `cost`, took `seconds`."""
        if steps <= 0 or seconds <= 0 or cost <= 0:
            return
        self.calls = self._averaged(self.calls, cost / seconds)
        self.per_step = self._averaged(self.per_step, cost / steps)

    def _averaged(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.weight) * old + self.weight * new

    def rate(self) -> tuple[float, float] | None:
        """(cost per second, seconds of one request's own round trip), or None before anything
        was measured."""
        if self.judge is not None and (per_second := self.judge.throughput()) is not None:
            return per_second, self.judge.typical_latency() or 0.0
        if self.calls is not None:
            return self.calls, (self.per_step or 1.0) / self.calls
        return None

    def seconds_per_step(self) -> float | None:
        """A step's share of the checking time (`stepgap_seconds_per_step`): the judge's
        latency over its requests in flight, or a call's time per step."""
        judge = self.judge
        if judge is not None and (latency := judge.typical_latency()):
            return latency / judge.served_at_once(judge.recent())
        if self.calls is not None:
            return (self.per_step or 1.0) / self.calls
        return None

    def estimate(self, ahead: float, cost: float) -> float | None:
        """Seconds until work costing `cost` is checked behind `ahead` queued or in flight;
        None before anything was measured."""
        rate = self.rate()
        if rate is None:
            return None
        per_second, round_trip = rate
        return (ahead + cost) / per_second + round_trip
