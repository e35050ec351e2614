"""A checker that lives behind `stepgap serve`: the same `check(traces)` over HTTP."""

from __future__ import annotations

from collections.abc import Sequence

from stepgap.data_builders.schema import Trace, Verdict


class RemoteChecker:
    """POSTs traces to `URL/check`; retries 503 (server queue full) honouring Retry-After."""

    def __init__(self, url: str, *, timeout: float = 300.0, retries: int = 5) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.retries = retries
        self._client = httpx.Client(timeout=timeout)

    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        import time

        payload = {"traces": [t.model_dump(mode="json") for t in traces]}
        for attempt in range(self.retries + 1):
            resp = self._client.post(f"{self.url}/check", json=payload)
            if resp.status_code == 503 and attempt < self.retries:
                time.sleep(float(resp.headers.get("Retry-After", "1")))
                continue
            resp.raise_for_status()
            return [[Verdict.model_validate(v) for v in vs] for vs in resp.json()["verdicts"]]
        raise RuntimeError("unreachable")

    def close(self) -> None:
        self._client.close()
