"""The time that deadlines and pacing are measured in: monotonic seconds, and waits on them.

`Clock` is the machine's (`time.monotonic`, asyncio's sleeps and waits). A test gives the reward
server's batcher and the traces' deadlines a clock of its own (`tests/fixtures/clock.py`'s
`ManualClock`, which moves only when the test says), so their logic is exact at any load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable
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
