"""A checker behind one or more `stepgap serve` replicas: the same `check(traces)` over HTTP.

Several replicas (one per GPU node, say) share the load: a batch is split across them and sent
concurrently, each part to the next replica in turn. A replica that cannot be reached, or
answers 5xx, is skipped for a while and its part goes to another; a 503 (queue full) is retried
on another replica, or after its `Retry-After` when all are busy. Only when every attempt fails
does `check` raise, and `StepGapReward` turns that into counted failures (bracket 0): a
rollout's reward is never lost, only its step terms.

Each process has its own HTTP client: a client inherited across `fork` (veRL's and PRIME's
process pools fork) shares its connections with the parent and mixes up their responses.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stepgap.schema import Trace, Verdict
from stepgap.teacher.checker import StepChecker

log = logging.getLogger(__name__)

DOWN_SECONDS = 5.0  # how long a replica that failed is skipped


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """`http://a:8000`, `http://a:8000,http://b:8000` or a list of them."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out = [u.strip().rstrip("/") for u in items if u and u.strip()]
    if not out:
        raise ValueError("RemoteChecker needs at least one `stepgap serve` URL")
    return out


class RemoteChecker(StepChecker):
    """POSTs traces to `URL/check` on one or more replicas, balanced, with failover. Its judges
    live in the replicas (`judge` is None); each verdict carries the provenance they record."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: float = 300.0,
        retries: int = 5,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`now` and `sleep` are the clock its waits for a busy replica are measured and spent
        in: the machine's (a test gives its own)."""
        self.urls = parse_urls(urls)
        self.now, self.sleep = now, sleep
        self.timeout = timeout
        self.retries = retries
        self.stats: Counter[str] = Counter()  # requests, failovers, busy_waits, failed
        self._lock = threading.Lock()
        self._turn = 0
        self._unavailable: dict[str, float] = {}  # url -> monotonic time it may be tried again
        self._client: Any = None
        self._pid: int | None = None

    @property
    def provenance(self) -> dict[str, object]:
        return {"remote": self.urls}

    @property
    def client(self) -> Any:
        """This process's HTTP client (a new one after a fork)."""
        import httpx

        with self._lock:
            if self._client is None or self._pid != os.getpid():
                self._client = httpx.Client(timeout=self.timeout)
                self._pid = os.getpid()
            return self._client

    def _order(self) -> list[str]:
        """The replicas to try, starting with the next in turn, available ones first."""
        with self._lock:
            start = self._turn
            self._turn = (self._turn + 1) % len(self.urls)
            now = self.now()
            turn = self.urls[start:] + self.urls[:start]
            return sorted(turn, key=lambda u: self._unavailable.get(u, 0.0) > now)

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    def _set_unavailable(self, url: str, seconds: float) -> None:
        with self._lock:
            self._unavailable[url] = self.now() + seconds

    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        traces = list(traces)
        parts = min(len(self.urls), len(traces))
        if parts <= 1:
            return self._check_part(traces)
        size = -(-len(traces) // parts)
        chunks = [traces[i : i + size] for i in range(0, len(traces), size)]
        with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
            return [v for chunk in pool.map(self._check_part, chunks) for v in chunk]

    def _check_part(self, traces: list[Trace]) -> list[list[Verdict]]:
        import httpx

        payload = {"traces": [t.model_dump(mode="json") for t in traces]}
        problems: list[str] = []
        for attempt in range(self.retries + 1):
            order = self._order()
            for url in order:
                self._count("requests")
                try:
                    resp = self.client.post(
                        f"{url}/check",
                        json=payload,
                        # the server answers 503 rather than let this client time out
                        headers={"X-Stepgap-Timeout": f"{self.timeout:g}"},
                    )
                except httpx.TransportError as exc:  # refused, reset, timed out
                    problems.append(f"{url}: {type(exc).__name__}")
                    self._set_unavailable(url, DOWN_SECONDS)
                    self._count("failovers")
                    log.warning("stepgap replica %s failed (%s); trying another", url, exc)
                    continue
                if resp.status_code == 503:  # busy or closing: another replica, or wait
                    wait = float(resp.headers.get("Retry-After", "1"))
                    self._set_unavailable(url, wait)
                    problems.append(f"{url}: 503")
                    continue
                if resp.status_code >= 500:
                    problems.append(f"{url}: {resp.status_code}")
                    self._set_unavailable(url, DOWN_SECONDS)
                    self._count("failovers")
                    continue
                resp.raise_for_status()  # 4xx: the request itself is wrong; no retry helps
                return [[Verdict.model_validate(v) for v in vs] for vs in resp.json()["verdicts"]]
            if attempt < self.retries:  # every replica down or busy: wait for the first back
                self._count("busy_waits")
                with self._lock:
                    soonest = min(self._unavailable.get(u, 0.0) for u in self.urls)
                self.sleep(min(max(soonest - self.now(), 0.1), 30.0))
        self._count("failed")
        raise RuntimeError(f"no stepgap replica answered: {'; '.join(problems[-len(self.urls) :])}")

    def close(self) -> None:
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = None
