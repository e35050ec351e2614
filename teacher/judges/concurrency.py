"""How many requests a judge server gets at once: what it serves at once, plus a small margin.

An inference engine serves a fixed number of requests at once (llama-server's slots, vLLM's
running batch). What is sent beyond that waits in the engine's queue: the latency grows with no
gain in throughput, and a client timeout that counts the wait cancels work the engine had
already started. Each judge call keeps at most the judge's `concurrency` requests in flight;
`EngineLimit` is one more limit, over every call of a judge together (a reward server runs
several at once), and it is set only where there is evidence for it:

- the engine's own number, where the engine says it: llama.cpp's server answers `GET /props`
  with `total_slots` (else `GET /slots` lists them): the limit is that plus the margin;
- no limit for an engine that batches continuously (vLLM, SGLang: `GET /v1/models` names
  them as the models' owner): its latency grows with its running batch by design, which the
  latency estimate below would read as queueing and throttle to a request or two, so each
  call's `concurrency` alone bounds what is sent;
- else, for a server of its own (not a hosted API), what the latencies it measures show
  (Little's law): with `S` slots serving requests of `T` seconds and `C > S` requests in
  flight, a request waits for the ones ahead, and the typical latency is about `C * T / S`.
  `T` is what a request sent alone takes (the median of those; the judge's first request goes
  alone); when the median of the recent latencies is more than `QUEUEING` times that, the
  engine is queueing, and serves about `C * T / median` at once. The limit becomes that plus
  the margin. Answers of different lengths spread the latencies, but not that far. When the
  limit is full and the mean latency stays within a tenth of `T`, it grows back by one at a
  time.

`EngineLimit` also says whether the judge server can be reached (`down`): a judge reports each
connection refused (`unreachable`) and each answer (`reachable`), and a reward server listens
(`on_change`) to fail its queued work at once while the judge is down, and asks `probe()` on a
schedule to find it again.

The limit itself runs on the judge's own event loop (one thread). The latencies are also read
from other threads (a reward server's pacing asks `throughput()` from its own loop), so they
change and are copied under a lock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from statistics import median_high as _median  # the upper middle: an actual sample
from typing import Any

log = logging.getLogger(__name__)

MARGIN = 1  # requests beyond the engine's slots: the next one is ready when a slot frees
WINDOW = 64  # recent answers the latency estimate looks at
MIN_SAMPLES = 8  # answers before the latency estimate is trusted
QUEUEING = 2.0  # a median latency this many times a lone request's means the engine queues


class EngineLimit:
    """At most `limit` requests in flight over all of a judge's calls (None: no limit beyond
    each call's own); `acquire` before each request, `release` after."""

    def __init__(
        self,
        *,
        margin: int = MARGIN,
        adapt: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.margin = margin
        self.clock = clock  # when requests are sent; how long those in flight have run
        self.adapt = adapt  # from latencies: not for a hosted API, which has no fixed slots
        self.limit: int | None = None
        self.slots: int | None = None  # what the engine said it serves at once
        self.source = "none"  # where `limit` comes from: none, the engine's route, latency
        self.in_flight = 0
        self.latencies: deque[tuple[int, float]] = deque(maxlen=WINDOW)  # (c, seconds)
        self.sizes: deque[float] = deque(maxlen=WINDOW)  # the same answers' request sizes
        self.alone: deque[float] = deque(maxlen=WINDOW // 4)  # latencies of lone requests
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._lock = threading.Lock()  # over `latencies`, which other threads read
        self._started: dict[int, float] = {}  # when each request in flight was sent
        self._next_ticket = 0
        self.down: str | None = None  # why the judge server cannot be reached, while it cannot
        self._listeners: list[Callable[[], None]] = []
        self.prober: Callable[[], bool] | None = None  # the judge's: True when its server answers

    # ------------------------------------------------------------------ the limit itself
    def _full(self) -> bool:
        return self.limit is not None and self.in_flight >= self.limit

    async def acquire(self) -> tuple[int, int]:
        """Wait for a free place; returns (the number in flight with this request, its ticket
        for `release`)."""
        while self._full():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                self._wake()  # pass the place on if it was given to this one
                raise
        self.in_flight += 1
        self._next_ticket += 1
        with self._lock:
            self._started[self._next_ticket] = self.clock()
        return self.in_flight, self._next_ticket

    def release(self, ticket: int) -> None:
        self.in_flight -= 1
        with self._lock:
            self._started.pop(ticket, None)
        self._wake()

    def _wake(self) -> None:
        free = len(self._waiters) if self.limit is None else self.limit - self.in_flight
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1

    # ------------------------------------------------------------------ learning it
    def learned(self, slots: int, source: str) -> None:
        """The engine serves `slots` at once: the limit is that plus the margin."""
        self.slots = slots
        self.source = source
        self._set(slots + self.margin)
        log.info("judge server serves %d request(s) at once (%s): %d in flight at most",
                 slots, source, self.limit)  # fmt: skip

    def observe(self, position: int, seconds: float, size: float = 1.0) -> None:
        """A request of `size` (its prompt's characters, for a judge that counts them), sent as
        the `position`-th in flight, was answered in `seconds`."""
        seconds = max(seconds, 1e-6)
        with self._lock:
            self.latencies.append((position, seconds))
            self.sizes.append(size)
        if position == 1:
            self.alone.append(seconds)
        if not self.adapt or self.slots is not None or not self.alone:
            return
        if len(self.latencies) < MIN_SAMPLES:
            return
        service, typical = _median(list(self.alone)), _median([s for _, s in self.latencies])
        if typical > QUEUEING * service:
            sent = self.limit or _median([c for c, _ in self.latencies])
            served = max(1, math.floor(sent * service / typical + 0.5))
            if self.limit is None or served + self.margin < self.limit:
                self.source = "latency"
                self._set(served + self.margin)
                with self._lock:  # what the new limit gives is measured afresh
                    self.latencies.clear()
                    self.sizes.clear()
                log.info("judge latencies show about %d request(s) served at once: %d in "
                         "flight at most", served, self.limit)  # fmt: skip
        elif self.limit is not None and position >= self.limit:
            mean = sum(s for _, s in self.latencies) / len(self.latencies)
            if mean < 1.1 * service:  # full, and answered as fast as alone: there is room
                self._set(self.limit + 1)

    def recent(self) -> list[tuple[int, float]]:
        """A copy of the recent (position, seconds) answers, safe from any thread."""
        with self._lock:
            return list(self.latencies)

    def typical_latency(self) -> float | None:
        """The median latency of the recent answers (None before any), or longer while a
        request in flight has run longer than that: a judge that slows down (its host got busy,
        its prompts grew) is seen as soon as its requests run late, not when they end."""
        recent = self.recent()
        if not recent:
            return None
        with self._lock:
            oldest = min(self._started.values(), default=None)
        running = 0.0 if oldest is None else self.clock() - oldest
        return max(_median([s for _, s in recent]), running)

    def throughput(self) -> float | None:
        """Work answered per second, in the requests' sizes (Little's law: the size in flight
        over the latency), from the recent answers; None before any. Prompts differ in length
        by several times, and so does what a request costs the engine."""
        recent = self.recent()
        latency = self.typical_latency()
        if not recent or not latency:
            return None
        with self._lock:
            size = sum(self.sizes) / len(self.sizes) if self.sizes else 1.0
        return self.served_at_once(recent) * size / latency

    def served_at_once(self, recent: list[tuple[int, float]]) -> int:
        """Requests in flight as the engine serves them: the limit, else the typical number in
        flight of the `recent` answers (non-empty)."""
        return self.limit or _median([c for c, _ in recent])

    # ------------------------------------------------------------------ reaching it
    def unreachable(self, why: str) -> None:
        """A connection to the judge server was refused or timed out: it is down."""
        changed, self.down = self.down is None, why
        if changed:
            log.warning("the judge server cannot be reached: %s", why)
            self._changed()

    def reachable(self) -> None:
        """The judge server answered (any HTTP answer): it is up."""
        if self.down is not None:
            self.down = None
            log.warning("the judge server answers again")
            self._changed()

    def probe(self) -> bool:
        """Whether the judge server answers now (the judge's own probe; True when it has
        none, so that requests find out); marks it up when it does. Blocking: call it from a
        thread other than the judge's loop."""
        answers = True if self.prober is None else self.prober()
        if answers:
            self.reachable()
        return answers

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` (from whichever thread saw it) when `down` changes; returns its
        remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def _set(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._wake()

    def describe(self) -> str:
        """Judge requests in flight at most, and why: for logs and /health."""
        if self.limit is None:  # `--engine-slots none`, a hosted API, or nothing learned yet
            watched = " (none known yet; its latencies are watched)" if self.adapt else ""
            return f"no limit beyond each call's --concurrency{watched}"
        if self.slots is not None:
            return f"{self.limit}: {self.slots} slot(s) ({self.source}) + {self.margin}"
        return f"{self.limit}: what its latencies show ({self.source})"


async def engine_slots(http: Any, base_url: str) -> tuple[int, str] | None:
    """(requests the engine serves at once, where it said so), asked of a llama.cpp server's
    `/props` and `/slots`; None for an engine that does not say (vLLM, SGLang, a hosted API).
    `http` is an `httpx.AsyncClient`; every failure means "does not say"."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        props = await http.get(f"{root}/props", timeout=5.0)
        if props.status_code == 200:
            total = props.json().get("total_slots")
            if isinstance(total, int) and total > 0:
                return total, "llama-server /props"
        slots = await http.get(f"{root}/slots", timeout=5.0)
        if slots.status_code == 200 and isinstance(listed := slots.json(), list) and listed:
            return len(listed), "llama-server /slots"
    except Exception as exc:  # noqa: BLE001 - an engine that does not answer says nothing
        log.debug("judge server slots not known: %s", exc)
    return None


CONTINUOUS_BATCHING = ("vllm", "sglang")  # `owned_by` of the models such an engine serves


async def continuous_batching(http: Any, base_url: str) -> str | None:
    """The engine's name where the server at `base_url` batches continuously (its `/models`
    lists models owned by vLLM or SGLang), else None; every failure means None."""
    try:
        listed = await http.get(f"{base_url.rstrip('/')}/models", timeout=5.0)
        if listed.status_code == 200:
            for model in listed.json().get("data") or []:
                if (owner := str(model.get("owned_by", "")).lower()) in CONTINUOUS_BATCHING:
                    return owner
    except Exception as exc:  # noqa: BLE001 - a server that does not answer says nothing
        log.debug("judge server models not listed: %s", exc)
    return None


async def answers(http: Any, base_url: str) -> bool:
    """Whether the server at `base_url` gives any HTTP answer to `GET /models` within 2 s."""
    try:
        await http.get(f"{base_url.rstrip('/')}/models", timeout=2.0)
    except Exception as exc:  # noqa: BLE001 - no answer, whatever the reason
        log.debug("judge server does not answer: %s", exc)
        return False
    return True
