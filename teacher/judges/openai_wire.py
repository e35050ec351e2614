"""The OpenAI-compatible API on the wire, as the `openai:` judge and policy use it: the server
and its key (read from the environment only), the SDK client, the event loop a judge's calls
share, the response formats a server may take, and what is read of a chat completion."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from stepgap.redact import redact

from .base import JudgeConfigError, judge_json_schema, response_format
from .concurrency import EngineLimit

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_ENDPOINT = "https://api.openai.com/v1"  # the SDK's, when no base URL is given


class MissingAPIKeyError(JudgeConfigError, ValueError):
    """No API key in the environment for a server that needs one."""


def server_and_key(who: str, base_url: str | None, api_key_env: str) -> tuple[str | None, str]:
    """The server (`base_url`, else `$OPENAI_BASE_URL`, else OpenAI's) and its API key, read
    from `$api_key_env` only, never from a flag or a file. A server given by URL (a local
    engine) may need no key; OpenAI's does: `MissingAPIKeyError` naming the variable."""
    base_url = base_url or os.environ.get("OPENAI_BASE_URL")
    key = os.environ.get(api_key_env)
    if not key and base_url is None:
        raise MissingAPIKeyError(
            f"{who} reads its API key from ${api_key_env}; set it in the environment (or "
            "pass --base-url for a local server that needs none)"
        )
    return base_url, key or "not-needed"


def openai_client(
    who: str,
    *,
    base_url: str | None,
    api_key_env: str = DEFAULT_API_KEY_ENV,
    timeout: float,
    max_retries: int,
    asynchronous: bool = False,
    reach: EngineLimit | None = None,
) -> Any:
    """An OpenAI SDK client for `who` (the judge, a policy) on `server_and_key`'s server;
    an asynchronous one tells `reach` whether its server can be reached, as it finds out."""
    import openai

    base_url, key = server_and_key(who, base_url, api_key_env)
    if not asynchronous:
        return openai.OpenAI(api_key=key, base_url=base_url, timeout=timeout,
                             max_retries=max_retries)  # fmt: skip
    http = None if reach is None else watched_http_client(reach)
    return openai.AsyncOpenAI(api_key=key, base_url=base_url, timeout=timeout,
                              max_retries=max_retries, http_client=http)  # fmt: skip


async def connects(host: str, port: int, seconds: float = 1.0, settle: float = 0.2) -> bool:
    """Whether a TCP connection to `host:port` opens within `seconds` and stays open `settle`
    seconds (a server killed that moment may still take one into its backlog, then reset it)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), seconds)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        open_ = await asyncio.wait_for(reader.read(1), settle) != b""
    except asyncio.TimeoutError:
        open_ = True  # nothing said and nothing closed: a server waiting for a request
    except OSError:
        open_ = False
    writer.close()
    return open_


def sdk_http_package() -> ModuleType:
    """The HTTP package the installed OpenAI SDK is built on, by the SDK's major version, as
    its releases document it: `httpx` through openai 2.x, its successor `httpx2` from 3.0 on
    (openai 3's README: "HTTPX2 is the default HTTP client"). A transport or client given to
    the SDK must come from that package; the `teacher` extra declares both."""
    from importlib.metadata import version

    major = int(version("openai").split(".", 1)[0])
    return importlib.import_module("httpx" if major < 3 else "httpx2")


def watched_http_client(reach: EngineLimit) -> Any:
    """The SDK's own async HTTP client (`openai.DefaultAsyncHttpxClient`: its defaults kept),
    through a transport that tells `reach` of each connection refused or timed out (the server
    is down) and of each answer (it is up) as it happens: the SDK's retries, with their backoff,
    would otherwise hide an outage for seconds a request. The transport is built from the
    SDK's HTTP package (`sdk_http_package`)."""
    import openai

    http = sdk_http_package()

    class Watched(http.AsyncBaseTransport):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            limits = http.Limits(max_connections=1000, max_keepalive_connections=100)  # the SDK's
            self.inner = http.AsyncHTTPTransport(limits=limits)

        async def handle_async_request(self, request: Any) -> Any:
            try:
                response = await self.inner.handle_async_request(request)
            except (http.ConnectError, http.ConnectTimeout) as exc:
                reach.unreachable(f"{type(exc).__name__}: {redact(str(exc)) or 'no connection'}")
                raise
            except (http.RemoteProtocolError, http.ReadError, http.WriteError) as exc:
                # a connection dropped mid-request: down if a new one is refused too
                url = request.url
                if not await connects(url.host, url.port or (443 if url.scheme == "https" else 80)):
                    reach.unreachable(f"{type(exc).__name__}, and a new connection is refused")
                raise
            reach.reachable()
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    return openai.DefaultAsyncHttpxClient(transport=Watched())


class JudgeLoop:
    """The judge's event loop in a daemon thread, with the HTTP clients bound to it: one per
    process (a forked reward worker starts its own; a loop and its sockets do not survive a
    fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self.http: Any = None  # an httpx.AsyncClient for the engine's own routes (/props)

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="stepgap-judge-loop", daemon=True
                ).start()
                self._pid, self._loop, self._client, self.http = os.getpid(), loop, None, None
            return self._loop

    async def client(self, make: Callable[[], Any]) -> Any:
        """The judge's API client (made on first use, on this loop)."""
        if self._client is None:
            import httpx

            self._client = make()
            self.http = httpx.AsyncClient()
        return self._client


RESPONSE_FORMATS = ("json_schema", "json_object", "none")


def format_params(fmt: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request parameters of a response format.

    json_schema: OpenAI's strict structured output (vLLM, SGLang and llama.cpp's server take it
    too); json_object: JSON mode with the schema alongside, as llama-cpp-python and Ollama take
    it; none: no parameter at all (the schema is in the prompt, and invalid JSON is asked again).
    """
    schema = schema if schema is not None else judge_json_schema()
    if fmt == "json_schema":
        return {"response_format": response_format(schema)}
    if fmt == "json_object":
        return {"response_format": {"type": "json_object", "schema": schema}}
    return {}


def format_messages(
    messages: list[dict[str, str]], fmt: str, schema: dict[str, Any] | None = None
) -> list[dict[str, str]]:
    """Without a response format, the system message also carries the JSON schema."""
    if fmt != "none":
        return messages
    schema_text = json.dumps(
        schema if schema is not None else judge_json_schema(), separators=(",", ":")
    )
    note = (
        "\n\nReply with the JSON object only: no prose, no code fence. It must validate "
        f"against this JSON schema: {schema_text}"
    )
    return [{**m, "content": m["content"] + note} if m["role"] == "system" else m for m in messages]


@dataclass
class Completion:
    """What the judge reads of a chat completion: the first choice, its token log-probabilities
    and the usage; `problem` when the body is not a usable completion."""

    content: str = ""
    refusal: str | None = None
    finish_reason: str | None = None
    logprobs: list[tuple[str, float]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    problem: str | None = None

    @classmethod
    def of(cls, body: bytes | str) -> Completion:
        try:
            data = json.loads(body)
        except ValueError as exc:
            return cls(problem=f"the server's answer is not JSON: {exc}")
        if not isinstance(data, dict):
            return cls(problem="the server's answer is not a JSON object")
        try:
            return cls._read(data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            return cls(problem=f"the server's answer is not a chat completion ({exc!r})")

    @classmethod
    def _read(cls, data: dict[str, Any]) -> Completion:
        raw_usage = data.get("usage")
        usage: dict[str, int] = {}
        if raw_usage:
            details = raw_usage.get("prompt_tokens_details") or {}
            usage = {
                "prompt_tokens": int(raw_usage.get("prompt_tokens") or 0),
                "completion_tokens": int(raw_usage.get("completion_tokens") or 0),
                "cached_tokens": int(details.get("cached_tokens") or 0),
            }
        choices = data.get("choices") or []
        if not choices:
            return cls(usage=usage, problem="the server returned no choices")
        choice = choices[0]
        message = choice.get("message") or {}
        tokens = (choice.get("logprobs") or {}).get("content") or []
        return cls(
            content=message.get("content") or "",
            refusal=message.get("refusal"),
            finish_reason=choice.get("finish_reason"),
            logprobs=[(t["token"], float(t["logprob"])) for t in tokens],
            usage=usage,
        )
