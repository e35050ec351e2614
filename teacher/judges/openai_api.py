"""`openai:MODEL`: any OpenAI-compatible chat completions server as the judge.

Strict `json_schema` structured output, token log-probabilities for stage confidences when the
server returns them, and the SDK's retries (exponential backoff with jitter; 408/409/429/5xx,
timeouts and dropped connections; `Retry-After` honoured). A refusal, a truncated answer or JSON
that violates the schema is asked again a bounded number of times and then becomes an error
result, never a label. Bad credentials or an unknown model stop the run instead of turning
every step into an error.

Every call of a judge runs on one event loop of its own (a daemon thread, one per process), so
all its requests share one HTTP client. Each call keeps at most `concurrency` requests in
flight, and all calls together at most what the engine serves at once, where the engine says so
or its latencies show it (`EngineLimit`). A request's trace may carry a
deadline (`JudgeRequest.deadline`): its requests time out at it instead of after the fixed
`timeout`, none is sent once it has passed, and a cancel closes the ones in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stepgap.options import at_least_one, more_than_zero, one_of, option
from stepgap.redact import redact
from stepgap.schema import Judge
from stepgap.tree import JudgeResult

from ..prompt import PROMPT_VERSION
from .base import (
    JUDGE_GROUP,
    JudgeBackend,
    JudgeConfigError,
    JudgeParseError,
    JudgeRequest,
    JudgeStopped,
    answer_json_schema,
    answer_params,
    judge_json_schema,
    parse_answer,
    parse_judge,
)
from .cache import JudgeCache, cache_key
from .concurrency import EngineLimit, answers, continuous_batching, engine_slots
from .confidence import stage_confidences
from .cost import CostMeter
from .model_judge import ModelJudgeOptions, with_cache_and_meter
from .openai_wire import (
    DEFAULT_API_KEY_ENV,
    DEFAULT_ENDPOINT,
    RESPONSE_FORMATS,
    Completion,
    JudgeLoop,
    format_messages,
    format_params,
    openai_client,
    server_and_key,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 1024  # the answer budget when `max_tokens` is not set


@dataclass(frozen=True)
class OpenAIJudgeOptions(ModelJudgeOptions):
    """The options of `openai:MODEL`, a judge behind an OpenAI-compatible server."""

    base_url: str | None = option(
        None, "openai judge: its server, e.g. http://127.0.0.1:8000/v1", group=JUDGE_GROUP
    )
    api_key_env: str = option(
        DEFAULT_API_KEY_ENV,
        "openai judge: environment variable holding the API key (keys are never read from the "
        "command line or a file)",
        metavar="NAME",
        group=JUDGE_GROUP,
    )
    response_format: Literal["auto", "json_schema", "json_object", "none"] = option(
        "auto",
        "openai judge: how to ask for JSON. json_schema (strict; OpenAI, vLLM, SGLang, "
        "llama.cpp), json_object with the schema (llama-cpp-python, Ollama), none (schema in the "
        "prompt); auto tries them in that order until the server takes one",
        group=JUDGE_GROUP,
    )
    concurrency: int = option(
        8, "openai judge: requests in flight per checker call", group=JUDGE_GROUP
    )
    engine_slots: str = option(
        "auto",
        "openai judge: requests its server serves at once (not --engine, which is a local "
        "judge's): all checker calls together send it at most that plus one. auto: what the "
        "server says (llama.cpp's /props), else what the latencies show; a number; none: no "
        "limit beyond --concurrency per call",
        metavar="auto|N|none",
        group=JUDGE_GROUP,
    )
    max_retries: int = option(
        6, "openai judge: API retries (backoff, Retry-After)", group=JUDGE_GROUP
    )
    timeout: float = option(
        120.0,
        "openai judge: seconds per API request (a served trace's deadline replaces it)",
        group=JUDGE_GROUP,
    )
    invalid_retries: int = option(
        2,
        "openai judge: re-asks after a refusal, a truncated answer or schema-violating JSON",
        group=JUDGE_GROUP,
    )
    no_logprobs: bool = option(
        False, "openai judge: do not request token log-probabilities", group=JUDGE_GROUP
    )

    def __post_init__(self) -> None:
        at_least_one("concurrency", self.concurrency)
        one_of("response_format", self.response_format, ("auto", *RESPONSE_FORMATS))
        slots = str(self.engine_slots).strip().lower()
        if slots not in ("auto", "none") and not (slots.isdigit() and int(slots) > 0):
            raise ValueError(
                f"engine_slots must be auto, none or a number, got {self.engine_slots!r}"
            )
        more_than_zero("timeout", self.timeout)
        if self.max_retries < 0 or self.invalid_retries < 0:
            raise ValueError("max_retries and invalid_retries must be 0 or more")
        super().__post_init__()


class OpenAIJudge(JudgeBackend):
    name = "openai"
    options_class = OpenAIJudgeOptions

    def __init__(
        self,
        model: str,
        options: OpenAIJudgeOptions | None = None,
        *,
        cache: JudgeCache | None = None,
        meter: CostMeter | None = None,
        on_result: Callable[[JudgeRequest, JudgeResult], None] | None = None,
        temperature: float = 0.0,
        stop_after: int = 3,
    ) -> None:
        """`options`: its flags; `cache` and `meter` are made from them by `from_spec` (a
        spec's judge), or given here; `on_result` sees each answer as it arrives;
        `stop_after` identical failures in a row before any answer worked stop the run."""
        if not model:
            raise ValueError("openai judge needs a model name, e.g. openai:gpt-4.1-mini")
        options = options or OpenAIJudgeOptions()
        self.options = options
        self.model = model
        self.base_url, _ = server_and_key("the openai judge", options.base_url, options.api_key_env)
        self.api_key_env = options.api_key_env
        self.concurrency = options.concurrency
        self.max_retries = options.max_retries
        self.timeout = options.timeout
        self.invalid_retries = options.invalid_retries
        # auto: strict json_schema first; a server that refuses it (llama-cpp-python's answers
        # 500) is asked again with json_object, then with the schema in the prompt alone.
        fmt = options.response_format
        self.formats = list(RESPONSE_FORMATS) if fmt == "auto" else [fmt]
        self.params: dict[str, Any] = {
            "temperature": temperature,
            "max_tokens": options.max_tokens or DEFAULT_MAX_TOKENS,
        }
        self.logprobs = not options.no_logprobs
        self.cache = cache
        self.meter = meter or CostMeter(model=model)
        self.on_result = on_result
        # Until one answer has worked, requests go one at a time, and `stop_after` identical
        # failures in a row stop the run: a server that refuses every request (a wrong model, an
        # unsupported parameter) costs a few requests, not every step times every retry.
        self.stop_after = stop_after
        self.working = False
        self._schemas: dict[object, dict[str, Any]] = {}  # per answer schema, built once
        # OpenAI's API has no slots to learn and nothing to adapt to; `engine_slots` may say
        slots = str(options.engine_slots).strip().lower()
        self.limit = EngineLimit(adapt=slots == "auto" and self.base_url is not None)
        if slots.isdigit():
            self.limit.learned(int(slots), "--engine-slots")
        self._loop = JudgeLoop()
        self._probed = slots != "auto" or self.base_url is None

    @classmethod
    def from_spec(
        cls, arg: str, options: OpenAIJudgeOptions, *, online: bool = False
    ) -> OpenAIJudge:
        """`openai:MODEL` with its answer cache and cost meter made from its options."""
        return with_cache_and_meter(cls, arg, options)

    @property
    def provenance(self) -> dict[str, str | None]:
        return {"spec": f"openai:{self.model}", "note": None}

    def schema(self) -> dict[str, Any]:
        """The JSON schema the server is asked to follow (see `format_params`)."""
        return judge_json_schema()

    def parse(self, text: str) -> tuple[Judge, dict[str, Any]]:
        """(judge object, anything the answer holds beyond it)."""
        return parse_judge(text), {}

    def _schema_for(self, answer: type | None) -> dict[str, Any]:
        """The schema a request is asked to follow (its own answer schema wins), built once per
        judge: pydantic's schema walk was a quarter of the client's CPU per request at
        concurrency 32 (bench/labeling.py profile)."""
        key = answer if answer is not None else "judge"
        if key not in self._schemas:
            self._schemas[key] = self.schema() if answer is None else answer_json_schema(answer)
        return self._schemas[key]

    def _parse(self, request: JudgeRequest, text: str) -> tuple[Any, dict[str, Any]]:
        """The backend's own parse, or the request's answer schema when it names one."""
        if request.answer is None:
            return self.parse(text)
        return parse_answer(text, request.answer), {}

    def judge(
        self, requests: Sequence[JudgeRequest], *, stop: threading.Event | None = None
    ) -> list[JudgeResult]:
        """Judge every request; results come back in request order. `stop`, set from another
        thread, ends the call at once: its requests in flight are closed (`JudgeStopped`)."""
        future = asyncio.run_coroutine_threadsafe(self._judge_all(requests), self._loop.get())
        try:
            while not future.done():
                concurrent.futures.wait([future], timeout=None if stop is None else 0.05)
                if stop is not None and stop.is_set() and not future.done():
                    raise JudgeStopped("the judge call was stopped")
            return future.result()
        except BaseException:  # stopped, Ctrl-C in this thread: close what is in flight
            future.cancel()
            raise

    async def _judge_all(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        client = await self._loop.client(self._new_client)
        if not self._probed:
            self._probed = True
            if (said := await engine_slots(self._loop.http, self.base_url or "")) is not None:
                self.limit.learned(*said)
            elif self.limit.adapt and (
                engine := await continuous_batching(self._loop.http, self.base_url or "")
            ):
                self.limit.adapt = False
                log.info("judge server is %s, which batches continuously: no limit is learned "
                         "from its latencies; %d requests in flight at most a call",
                         engine, self.concurrency)  # fmt: skip

        call = asyncio.Semaphore(self.concurrency)  # this call's own; `self.limit` is all calls'

        async def bounded(request: JudgeRequest) -> JudgeResult:
            async with call:
                result = await self._judge_within_deadline(client, request)
            if self.on_result is not None:
                self.on_result(request, result)
            return result

        first = []
        while not self.working and len(first) < len(requests):
            result = await bounded(requests[len(first)])
            first.append(result)
            self.working = result.judge is not None
            self._stop_if_always_failing(first)
        rest = await asyncio.gather(*(bounded(r) for r in requests[len(first) :]))
        return [*first, *rest]

    def _new_client(self) -> Any:
        watch = self.limit if self.base_url is not None else None  # a server of one's own
        if watch is not None:
            watch.prober = self._answers
        return openai_client(
            "the openai judge", base_url=self.base_url, api_key_env=self.api_key_env,
            timeout=self.timeout, max_retries=self.max_retries, asynchronous=True,
            reach=watch,
        )  # fmt: skip

    def _answers(self) -> bool:
        """Whether the judge server answers now (any HTTP answer to `GET /models`): the reward
        server's probe while the judge is down. Blocking, from a thread of the caller's."""
        future = asyncio.run_coroutine_threadsafe(
            answers(self._loop.http, self.base_url or ""), self._loop.get()
        )
        return future.result()

    async def _judge_within_deadline(self, client: Any, request: JudgeRequest) -> JudgeResult:
        """`_judge_one`, unless the trace is past its deadline; a cancel of the deadline (its
        client left) cancels this, closing the request in flight."""
        deadline = request.deadline
        if deadline is None:
            return await self._judge_one(client, request)
        if why := deadline.over():
            return JudgeResult.failed(f"not judged: {why}")
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        remove = deadline.on_cancel(lambda: loop.call_soon_threadsafe(task.cancel))  # type: ignore[union-attr]
        try:
            left = deadline.remaining()
            return await asyncio.wait_for(self._judge_one(client, request), left)
        except (asyncio.CancelledError, asyncio.TimeoutError):
            if why := deadline.over():  # its own deadline or cancel, not the whole call's
                return JudgeResult.failed(f"not judged: {why}")
            raise
        finally:
            remove()

    def _stop_if_always_failing(self, results: list[JudgeResult]) -> None:
        tail = results[-self.stop_after :]
        if self.working or len(tail) < self.stop_after:
            return
        kinds = {r.extra.get("failure", r.error) for r in tail}
        if len(kinds) == 1:
            raise JudgeConfigError(
                f"the judge failed its first {self.stop_after} requests the same way, so it "
                f"would fail them all; stopping. Last error: {tail[-1].error}"
            )

    def _key(self, request: JudgeRequest) -> str:
        # not the response format: every format yields the same validated judge object. The
        # endpoint and the schema are: one model name on two servers is two models, and an
        # answer to another schema is no answer to this one (a request's own answer schema is
        # keyed by answer_params, the judge's own here)
        params = {
            **self.params,
            "logprobs": self.logprobs,
            "endpoint": self.base_url or DEFAULT_ENDPOINT,
            "schema": self._schema_digest,
            **answer_params(request),
        }
        return cache_key(self.name, self.model, PROMPT_VERSION, params, request)

    @functools.cached_property
    def _schema_digest(self) -> str:
        """A digest of the judge's own answer schema (`schema()`), computed once."""
        text = json.dumps(self._schema_for(None), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def response_format(self) -> str:
        """The format in use (the first of the candidates until one has worked)."""
        return self.formats[0]

    async def _create(self, client: Any, request: JudgeRequest) -> Completion:
        """One chat completion, in the response format that works with this server.

        Until an answer has worked, a refusal of the format itself (400, 422 or 5xx; not a rate
        limit or a timeout) moves on to the next format, with one retry each, so a server that
        does not take `json_schema` costs two requests, not every retry of every step.
        The SDK sends the request (retries, errors); the answer's JSON is read here
        (`Completion.of`), not into the SDK's models: building a model per log-probability
        token was a third of the client's CPU per request.
        """
        import openai

        schema = self._schema_for(request.answer)
        while True:
            fmt = self.formats[0]
            probing = not self.working and len(self.formats) > 1
            try:
                options: dict[str, Any] = {"max_retries": 1} if probing else {}
                if request.deadline is not None and (left := request.deadline.remaining()):
                    options["timeout"] = left  # the trace's deadline, not the fixed timeout
                messages = format_messages(request.messages, fmt, schema)
                raw = await (
                    client.with_options(**options) if options else client
                ).chat.completions.with_raw_response.create(
                    model=self.model,
                    messages=messages,
                    logprobs=self.logprobs or None,
                    **self.params,
                    **format_params(fmt, schema),
                )
                completion = Completion.of(raw.content)
                self.answered(messages, completion)
                return completion
            except openai.APIStatusError as exc:
                refused = exc.status_code in (400, 422) or exc.status_code >= 500
                if not (probing and refused) or exc.status_code == 503:
                    raise
                log.warning(
                    "the judge server refused response_format %s (%s %s); trying %s",
                    fmt, exc.status_code, redact(str(exc))[:200], self.formats[1],
                )  # fmt: skip
                self.formats.pop(0)

    def answered(self, messages: list[dict[str, Any]], completion: Completion) -> None:
        """Each completion, with the messages that asked for it: a judge that knows how its
        model tokenizes checks here that the server runs that model (a JudgeConfigError)."""

    async def _judge_one(self, client: Any, request: JudgeRequest) -> JudgeResult:
        import openai

        key = self._key(request) if self.cache is not None else ""
        if self.cache is not None and (hit := self.cache.get(key, request.answer)) is not None:
            self.meter.hit()
            return JudgeResult(judge=hit.judge, confidences=hit.confidences)
        usage: dict[str, int] = {}
        problem = "no attempt made"
        for _attempt in range(1 + self.invalid_retries):
            if request.deadline is not None and (why := request.deadline.over()):
                problem = f"not asked again: {why}"
                break
            position, ticket = await self.limit.acquire()
            started = time.monotonic()
            try:
                resp = await self._create(client, request)
                self.limit.observe(position, time.monotonic() - started, request.size)
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
                failed = JudgeResult.failed(f"judge API error: {redact(str(exc))}", usage)
                status = exc.status_code if isinstance(exc, openai.APIStatusError) else ""
                failed.extra["failure"] = f"{type(exc).__name__} {status}".strip()
                return failed
            finally:
                self.limit.release(ticket)
            for k, v in resp.usage.items():
                usage[k] = usage.get(k, 0) + v
            self.meter.add(resp.usage)
            if resp.problem:
                problem = resp.problem
            elif resp.refusal:
                problem = f"the judge refused: {redact(resp.refusal)[:200]}"
            elif resp.finish_reason == "length":
                problem = f"the answer was truncated at max_tokens={self.params['max_tokens']}"
            else:
                try:
                    judge, extra = self._parse(request, resp.content)
                except JudgeParseError as exc:
                    problem = str(exc)
                else:
                    result = JudgeResult(
                        judge=judge,
                        confidences=(
                            stage_confidences(resp.logprobs) if request.answer is None else {}
                        ),
                        usage=dict(usage),
                        extra=extra,
                    )
                    if len(self.formats) > 1:  # the format that worked stays for the run
                        del self.formats[1:]
                    if self.cache is not None:
                        self.cache.put(key, self.model, result)
                    return result
            log.info("judge %s step %s: %s; asking again", request.trace_id, request.step, problem)
        self.meter.failed()
        return JudgeResult.failed(
            f"judge gave no valid answer in {1 + self.invalid_retries} attempt(s): {problem}",
            usage,
        )
