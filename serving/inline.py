"""Inline checking from inside a trainer's rollout loop: the loop hands over the rollout's text
each time a search result comes back, and asks for the reward when the rollout ends.

Two checkers answer the same four calls (all async, for the agent loops of veRL and OpenRLHF):

- `LocalInline`: a `StreamingReward` in this process, over the process's reward
  (`process_reward.get_reward`: a reward config file, or `configure(reward)`);
- `ServedInline`: `stepgap serve` (`POST /steps`, `POST /reward` with the rollout's id,
  `DELETE /steps/{id}`); with several replicas each rollout always goes to the same one, where
  its answers are kept.

`send` never fails a rollout: a step that could not be sent is checked at the end instead.
`tell` is `send` with typed feedback (`stepgap.feedback`): it also gives the note for the
newest step when its verdict comes within the wait.
`inline_checker(url=..., config=...)` gives this process's checker (one per setting), from the
arguments or from `STEPGAP_REWARD_URL` / `STEPGAP_REWARD_CONFIG`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
import zlib
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from stepgap.feedback import FeedbackSource, Told
from stepgap.reward_arithmetic import RewardResult, StepReward

from .remote import parse_urls
from .streaming import StreamingReward

log = logging.getLogger(__name__)


class InlineChecker(FeedbackSource):
    """A checker of a rollout's steps as they come: `send`, `finalize`, and the feedback
    source's `tell` and `drop`."""

    @abstractmethod
    async def send(self, trace_id: str, question: str, text: str) -> int:
        """The rollout's text so far: its complete steps not sent before are checked from now
        on. Returns how many were new."""

    @abstractmethod
    async def finalize(
        self, trace_id: str, question: str, text: str, golden: Sequence[str]
    ) -> RewardResult:
        """The finished rollout's reward, reusing every answer made while it ran."""


class LocalInline(InlineChecker):
    """Inline checking in this process, on `streaming`'s workers."""

    def __init__(self, streaming: StreamingReward) -> None:
        self.streaming = streaming

    async def send(self, trace_id: str, question: str, text: str) -> int:
        try:
            return await asyncio.to_thread(self.streaming.submit_response, trace_id, question, text)
        except (ValueError, RuntimeError) as exc:  # checked at the end instead
            log.warning("rollout %s: its steps could not be sent (%s)", trace_id, exc)
            return 0

    async def tell(self, trace_id: str, question: str, text: str, wait: float = 0.0) -> Told:
        try:
            return await asyncio.to_thread(self.streaming.tell, trace_id, question, text, wait)
        except (ValueError, RuntimeError) as exc:  # checked at the end instead
            log.warning("rollout %s: its steps could not be sent (%s)", trace_id, exc)
            return Told()

    async def finalize(
        self, trace_id: str, question: str, text: str, golden: Sequence[str]
    ) -> RewardResult:
        return await asyncio.to_thread(self.streaming.score, text, question, list(golden), trace_id)

    async def drop(self, trace_id: str) -> None:
        self.streaming.drop(trace_id)


class ServedInline(InlineChecker):
    """Inline checking by `stepgap serve` at `urls` (one or more replicas)."""

    def __init__(
        self, urls: str | Sequence[str], *, timeout: float = 300.0, retries: int = 5
    ) -> None:
        self.urls = parse_urls(urls)
        self.timeout = timeout
        self.retries = retries
        # one client (its connections kept open) per event loop: a client is bound to its loop
        self._clients: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def url_of(self, trace_id: str) -> str:
        """The replica that keeps this rollout's answers (the same in every process)."""
        return self.urls[zlib.crc32(trace_id.encode("utf-8")) % len(self.urls)]

    def _client(self) -> Any:
        import httpx

        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = httpx.AsyncClient(timeout=self.timeout)
        return self._clients[loop]

    async def send(self, trace_id: str, question: str, text: str) -> int:
        answer = await self._steps(trace_id, {"question": question, "response": text})
        return int(answer.get("submitted", 0))

    async def tell(self, trace_id: str, question: str, text: str, wait: float = 0.0) -> Told:
        body = {"question": question, "response": text, "feedback_wait": wait}
        answer = await self._steps(trace_id, body, timeout=self.timeout + wait)
        return Told(answer.get("note"), bool(answer.get("late")), float(answer.get("waited_s", 0)),
                    int(answer.get("submitted", 0)))  # fmt: skip

    async def _steps(
        self, trace_id: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        """`POST /steps` of the rollout's replica; {} when it could not be sent."""
        import httpx

        url = f"{self.url_of(trace_id)}/steps"
        try:
            resp = await self._client().post(
                url, json={"trace_id": trace_id, **body}, timeout=timeout or self.timeout
            )
            resp.raise_for_status()
            answer = resp.json()
            if not isinstance(answer, dict) or not isinstance(answer.get("submitted"), int):
                raise ValueError(f"not an answer of /steps: {str(answer)[:200]}")
            return answer
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("rollout %s: its steps could not be sent (%s)", trace_id, exc)
            return {}

    async def finalize(
        self, trace_id: str, question: str, text: str, golden: Sequence[str]
    ) -> RewardResult:
        import httpx

        url = f"{self.url_of(trace_id)}/reward"
        body = {"responses": [text], "questions": [question], "golden_answers": [list(golden)],
                "trace_ids": [trace_id]}  # fmt: skip
        problem = ""
        client = self._client()
        for attempt in range(self.retries + 1):
            try:
                resp = await client.post(
                    url, json=body, headers={"X-Stepgap-Timeout": f"{self.timeout:g}"}
                )
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(min(2.0**attempt, 30.0))
                continue
            if resp.status_code == 503:  # busy or past the deadline: its Retry-After
                problem = "503"
                await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))
                continue
            resp.raise_for_status()
            return result_of(resp.json()["results"][0])
        raise RuntimeError(f"{url} gave no reward for rollout {trace_id}: {problem}")

    async def drop(self, trace_id: str) -> None:
        import httpx

        try:
            await self._client().delete(f"{self.url_of(trace_id)}/steps/{trace_id}")
        except httpx.HTTPError as exc:  # the server forgets it after a while anyway
            log.info("rollout %s: could not drop its steps (%s)", trace_id, exc)


def result_of(data: dict[str, Any]) -> RewardResult:
    """A `RewardResult` from its JSON form (`/reward`'s `results`); one marked `unavailable`
    has no reward, whatever number a server of an earlier version put beside it."""
    steps = [StepReward(**s) for s in data.get("steps", [])]
    reward = None if data.get("unavailable") is not None else data["reward"]
    return RewardResult(**{**data, "steps": steps, "reward": reward})


_CHECKERS: dict[tuple[str | None, str | None], InlineChecker] = {}
_LOCK = threading.Lock()


def inline_checker(url: str | None = None, config: str | None = None) -> InlineChecker:
    """This process's inline checker: `stepgap serve` at `url` (comma-separated replicas), or a
    `StreamingReward` over the reward of the config file `config`; with neither, the same from
    `STEPGAP_REWARD_URL` or `STEPGAP_REWARD_CONFIG`, else over a reward set by `configure`."""
    url = url or (None if config else os.environ.get("STEPGAP_REWARD_URL"))
    config = config or (None if url else os.environ.get("STEPGAP_REWARD_CONFIG"))
    key = (url, config)
    with _LOCK:
        if key not in _CHECKERS:
            if url:
                _CHECKERS[key] = ServedInline(url)
            else:
                from .process_reward import get_reward

                reward = get_reward({"config": config} if config else None)
                _CHECKERS[key] = LocalInline(StreamingReward(reward))
        return _CHECKERS[key]


def reset() -> None:
    """Forget this process's inline checkers (tests), closing those in this process."""
    with _LOCK:
        for checker in _CHECKERS.values():
            if isinstance(checker, LocalInline):
                checker.streaming.close(wait=False)
        _CHECKERS.clear()
