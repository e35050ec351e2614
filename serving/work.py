"""A trace's checking in `stepgap serve`, shared by every request that sends the same trace.

A trainer's client re-sends a rollout its last request got no answer for (OpenRLHF's: 5 tries
of 180 s, 1 s apart, each with a new trace id). The judge's work for it is worth finishing when
its request ends unanswered: the retry finds it under way, or finished, and waits for that
rather than starting over. `Works` keys each trace's checking by its content (everything but
its id), counts the requests that wait for it, and keeps work nobody waits for `keep_for`
seconds of the server's clock: a retry within that time claims it again; after it, the work is
abandoned (its judge requests closed, a queued one never sent). Finished verdicts nobody
claimed are kept as long, then dropped; a failed check is never kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field

from stepgap.clock import Clock, TraceDeadline
from stepgap.schema import Trace, Verdict

KEEP_FOR_RETRY = 10.0  # seconds work nobody waits for is kept for a retry (OpenRLHF's: 1 s later)


def content_key(trace: Trace) -> str:
    """What makes two traces the same work: everything but the id."""
    data = trace.model_dump(mode="json", exclude={"id"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass(eq=False)
class Work:
    """One trace's checking. `future` gets its verdicts (or the error every waiting request
    learns), and is cancelled only when the work is abandoned; `deadline` is the judge's: never
    a time (a request's deadline is the request's, not its work's), cancelled with `future`."""

    key: str
    trace: Trace
    future: asyncio.Future
    deadline: TraceDeadline = field(default_factory=TraceDeadline)
    cost: float = 0.0  # what checking it costs the judge (`MicroBatcher.cost_of`)
    wanted: int = 0  # requests waiting for it now
    kept_until: float | None = None  # when wanted fell to 0: kept until then for a retry

    @property
    def steps(self) -> int:
        return len(self.trace.steps or [])

    def verdicts_for(self, trace_id: str) -> list[Verdict]:
        """The verdicts, under the id the asking request gave its trace."""
        verdicts: list[Verdict] = self.future.result()
        if all(v.trace_id == trace_id for v in verdicts):
            return verdicts
        return [v.model_copy(update={"trace_id": trace_id}) for v in verdicts]


class Works:
    """The traces being checked, or kept for a retry, by content."""

    def __init__(self, clock: Clock, keep_for: float = KEEP_FOR_RETRY) -> None:
        if keep_for < 0:
            raise ValueError(f"keep_for must be 0 or more seconds, got {keep_for}")
        self.clock = clock
        self.keep_for = keep_for
        self.by_key: dict[str, Work] = {}
        self._timers: set[asyncio.Task] = set()

    def find(self, key: str) -> Work | None:
        """The live work for a trace's `content_key`, if any."""
        return self.by_key.get(key)

    def claim(self, trace: Trace, key: str) -> tuple[Work, bool]:
        """(the work for `trace`, whose `content_key` is `key`; whether it is new and must be
        queued); the caller waits for it and `release`s it when its request ends."""
        work = self.by_key.get(key)
        new = work is None
        if work is None:
            work = Work(key, trace, asyncio.get_running_loop().create_future())
            work.future.add_done_callback(lambda _: self._settled(work))
            self.by_key[key] = work
        elif work.future.done():  # finished in its keep time: this request takes it
            self._forget(work)
        work.wanted += 1
        work.kept_until = None
        return work, new

    def release(self, work: Work) -> None:
        """A request that waited for `work` ended (answered or not)."""
        work.wanted -= 1
        if work.wanted > 0:
            return
        if work.future.done():  # its settling kept it for a retry, or forgot it
            return
        if self.keep_for <= 0:
            self.abandon(work)
            return
        self._keep(work)

    def abandon(self, work: Work) -> None:
        """Nobody waits for `work`, nor will: its judge requests end and it is forgotten."""
        self._forget(work)
        work.future.cancel()
        work.deadline.cancel()

    def fail_all(self, error: BaseException) -> list[Work]:
        """Every live work fails with `error` (its requests learn it) and its judge requests
        end: the judge is down, or the server is closing. Returns those that were unfinished."""
        failed = []
        for work in list(self.by_key.values()):
            self._forget(work)
            if not work.future.done():
                work.future.set_exception(error)
                failed.append(work)
            work.deadline.cancel()
        return failed

    def close(self) -> None:
        for timer in list(self._timers):
            timer.cancel()

    async def _abandon_later(self, work: Work, at: float) -> None:
        await self.clock.sleep(at - self.clock.now())
        if work.wanted == 0 and work.kept_until == at:
            if work.future.done():
                self._forget(work)
            else:
                self.abandon(work)

    def _settled(self, work: Work) -> None:
        """`work` has its answer: kept for a retry only when nobody has it yet and it is whole
        (a cancelled, failed or partly failed check is asked again, not kept)."""
        future = work.future
        clean = (
            not future.cancelled()
            and future.exception() is None
            and all(v.error is None for v in future.result())
        )
        if work.wanted > 0 or not clean:  # delivered, or not worth keeping
            self._forget(work)
        # else it finished in its keep time: a retry in it takes the verdicts at once

    def _keep(self, work: Work) -> None:
        work.kept_until = self.clock.now() + self.keep_for
        timer = asyncio.ensure_future(self._abandon_later(work, work.kept_until))
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

    def _forget(self, work: Work) -> None:
        if self.by_key.get(work.key) is work:
            del self.by_key[work.key]
