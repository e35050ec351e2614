"""The time that deadlines and pacing are measured in: monotonic seconds, and waits on them;
and a trace's deadline (`TraceDeadline`), which judges, checkers and the reward server share.

`Clock` is the machine's (`time.monotonic`, asyncio's sleeps and waits). A test gives the reward
server's batcher and the traces' deadlines a clock of its own (`tests/fixtures/clock.py`'s
`ManualClock`, which moves only when the test says), so their logic is exact at any load.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any


class Clock:
    """Monotonic seconds (`now`), and asyncio waits measured in them."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait(
        self, futures: Iterable[Awaitable[Any]], until: float | None
    ) -> set[asyncio.Future]:
        """Wait until one of `futures` is done or `now()` reaches `until` (None: no limit);
        returns the done ones (empty when the time ran out). Written on `sleep`, so a clock
        that changes `now` and `sleep` waits in its own time."""
        waiting = {asyncio.ensure_future(f) for f in futures}
        timer = asyncio.ensure_future(self.sleep(until - self.now())) if until is not None else None
        if timer is None and not waiting:
            return set()
        try:
            done, _ = await asyncio.wait(
                waiting | ({timer} if timer else set()), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if timer is not None:
                timer.cancel()
        return done - {timer}


SYSTEM = Clock()  # the machine's, the default everywhere


class TraceDeadline:
    """Until when a trace's answer is worth something: a time (`clock()` seconds, by default
    `time.monotonic()`: the reward server gives its own clock's), and a cancel for a client that
    left. Thread-safe: the reward server cancels it from its event loop, a judge reads it from
    its own. A judge sends no request for a trace that is past its deadline or cancelled, and a
    cancel closes the requests already in flight."""

    def __init__(
        self, at: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.at = at
        self.clock = clock
        self._cancelled = False
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    @classmethod
    def after(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> TraceDeadline:
        return cls(clock() + seconds, clock)

    def remaining(self) -> float | None:
        """Seconds left (None: no deadline); 0 once cancelled."""
        if self._cancelled:
            return 0.0
        return None if self.at is None else max(0.0, self.at - self.clock())

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def over(self) -> str | None:
        """Why the trace is no longer wanted (cancelled, past its deadline), or None."""
        if self._cancelled:
            return "its client no longer waits for it"
        if self.at is not None and self.clock() >= self.at:
            return "its deadline passed"
        return None

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when cancelled (at once if it is already); returns its remover."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)
                return lambda: self._forget(callback)
        callback()
        return lambda: None

    def _forget(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)
