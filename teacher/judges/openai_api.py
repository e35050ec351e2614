"""`openai:MODEL`: any OpenAI-compatible chat completions server as the judge.

Strict `json_schema` structured output, token log-probabilities for stage confidences when the
server returns them, a bounded number of requests in flight, and the SDK's retries (exponential
backoff with jitter; 408/409/429/5xx, timeouts and dropped connections; `Retry-After` honoured).
A refusal, a truncated answer or JSON that violates the schema is asked again a bounded number of
times and then becomes an error result, never a label. Bad credentials or an unknown model stop
the run instead of turning every step into an error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from stepgap.redact import redact

from ..prompt import PROMPT_VERSION
from .base import (
    JudgeConfigError,
    JudgeParseError,
    JudgeRequest,
    JudgeResult,
    parse_judge,
    response_format,
)
from .cache import JudgeCache, cache_key
from .confidence import stage_confidences
from .cost import CostMeter

log = logging.getLogger(__name__)

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


class OpenAIJudge:
    name = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        concurrency: int = 8,
        max_retries: int = 6,
        timeout: float = 120.0,
        invalid_retries: int = 2,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        logprobs: bool = True,
        cache: JudgeCache | None = None,
        meter: CostMeter | None = None,
        on_result: Callable[[JudgeRequest, JudgeResult], None] | None = None,
    ) -> None:
        if not model:
            raise ValueError("openai judge needs a model name, e.g. openai:gpt-4.1-mini")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        self.api_key_env = api_key_env
        if not os.environ.get(api_key_env) and self.base_url is None:
            raise JudgeConfigError(
                f"the openai judge reads its API key from ${api_key_env}; set it in the "
                "environment (or pass --base-url for a local server that needs none)"
            )
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.timeout = timeout
        self.invalid_retries = invalid_retries
        self.params: dict[str, Any] = {
            "temperature": temperature,
            "max_tokens": max_tokens,
            "response_format": response_format(),
        }
        self.logprobs = logprobs
        self.cache = cache
        self.meter = meter or CostMeter(model=model)
        self.on_result = on_result

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Judge every request; results come back in request order."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._judge_all(requests))
        box: list[list[JudgeResult]] = []  # inside a running loop (notebooks): use a thread
        worker = threading.Thread(target=lambda: box.append(asyncio.run(self._judge_all(requests))))
        worker.start()
        worker.join()
        return box[0]

    async def _judge_all(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        import openai

        limit = asyncio.Semaphore(self.concurrency)
        async with openai.AsyncOpenAI(
            api_key=os.environ.get(self.api_key_env) or "not-needed",
            base_url=self.base_url,
            max_retries=self.max_retries,
            timeout=self.timeout,
        ) as client:

            async def bounded(request: JudgeRequest) -> JudgeResult:
                async with limit:
                    result = await self._judge_one(client, request)
                if self.on_result is not None:
                    self.on_result(request, result)
                return result

            return list(await asyncio.gather(*(bounded(r) for r in requests)))

    def _key(self, request: JudgeRequest) -> str:
        params = {**self.params, "logprobs": self.logprobs}
        return cache_key(self.name, self.model, PROMPT_VERSION, params, request)

    async def _judge_one(self, client: Any, request: JudgeRequest) -> JudgeResult:
        import openai

        key = self._key(request) if self.cache is not None else ""
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            self.meter.hit()
            return JudgeResult(judge=hit.judge, confidences=hit.confidences)
        usage: dict[str, int] = {}
        problem = "no attempt made"
        for _attempt in range(1 + self.invalid_retries):
            try:
                resp = await client.chat.completions.create(
                    model=self.model,
                    messages=request.messages,
                    logprobs=self.logprobs or None,
                    **self.params,
                )
            except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
                raise JudgeConfigError(
                    f"the judge server refused the credentials in ${self.api_key_env}: "
                    f"{redact(str(exc))}"
                ) from None
            except openai.NotFoundError as exc:
                raise JudgeConfigError(
                    f"model {self.model!r} not found at the judge server: {redact(str(exc))}"
                ) from None
            except openai.APIError as exc:  # retries exhausted, or not retryable
                self.meter.failed()
                return JudgeResult.failed(f"judge API error: {redact(str(exc))}", usage)
            _add_usage(usage, resp.usage)
            self.meter.add(_usage_dict(resp.usage))
            if not resp.choices:
                problem = "the server returned no choices"
                continue
            choice = resp.choices[0]
            refusal = getattr(choice.message, "refusal", None)
            if refusal:
                problem = f"the judge refused: {redact(refusal)[:200]}"
            elif choice.finish_reason == "length":
                problem = f"the answer was truncated at max_tokens={self.params['max_tokens']}"
            else:
                try:
                    judge = parse_judge(choice.message.content or "")
                except JudgeParseError as exc:
                    problem = str(exc)
                else:
                    result = JudgeResult(
                        judge=judge, confidences=_confidences(choice), usage=dict(usage)
                    )
                    if self.cache is not None:
                        self.cache.put(key, self.model, result)
                    return result
            log.info("judge %s step %s: %s; asking again", request.trace_id, request.step, problem)
        self.meter.failed()
        return JudgeResult.failed(
            f"judge gave no valid answer in {1 + self.invalid_retries} attempt(s): {problem}",
            usage,
        )


def _usage_dict(usage: Any) -> dict[str, int]:
    if usage is None:
        return {}
    details = getattr(usage, "prompt_tokens_details", None)
    return {
        "prompt_tokens": int(usage.prompt_tokens or 0),
        "completion_tokens": int(usage.completion_tokens or 0),
        "cached_tokens": int(getattr(details, "cached_tokens", 0) or 0) if details else 0,
    }


def _add_usage(total: dict[str, int], usage: Any) -> None:
    for k, v in _usage_dict(usage).items():
        total[k] = total.get(k, 0) + v


def _confidences(choice: Any) -> dict[str, float]:
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if not content:
        return {}
    return stage_confidences([(t.token, t.logprob) for t in content])


def load_openai_judge(model: str, **options: Any) -> OpenAIJudge:
    known = {
        "base_url", "api_key_env", "concurrency", "max_retries", "timeout", "invalid_retries",
        "temperature", "max_tokens", "logprobs", "cache", "meter", "on_result",
    }  # fmt: skip
    return OpenAIJudge(model, **{k: v for k, v in options.items() if k in known and v is not None})
