"""The judge's HTTP client under the OpenAI SDK: built from the SDK's own HTTP package (httpx
through openai 2.x, httpx2 from 3.0), and telling the judge's limit when its server is down."""

from __future__ import annotations

import asyncio
import socket

import pytest

pytest.importorskip("openai")


def _declared_requirements(dist: str) -> set[str]:
    """The names of what `dist` requires outside its extras."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    return {r.name for r in map(Requirement, requires(dist) or []) if r.marker is None}


def test_the_http_package_is_the_one_the_installed_sdk_requires():
    """The package chosen by the SDK's major version is the one its distribution declares,
    and the SDK's default client is a client of that package: fails when a release of openai
    moves to another HTTP package."""
    import openai

    from stepgap.teacher.judges.openai_wire import sdk_http_package

    http = sdk_http_package()
    assert http.__name__ in _declared_requirements("openai")
    assert issubclass(openai.DefaultAsyncHttpxClient, http.AsyncClient)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    await writer.drain()
    writer.close()


def test_the_watched_client_tells_the_limit_when_its_server_is_down_and_up():
    """A refused connection marks the server down (and still fails the request, for the SDK's
    retries); the next answer marks it up again."""
    from stepgap.teacher.judges.concurrency import EngineLimit
    from stepgap.teacher.judges.openai_wire import sdk_http_package, watched_http_client

    refused = sdk_http_package().ConnectError
    reach = EngineLimit()
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1/models"

    async def run() -> list[str | None]:
        seen = []
        client = watched_http_client(reach)
        with pytest.raises(refused):
            await client.get(url)
        seen.append(reach.down)
        server = await asyncio.start_server(_answer, "127.0.0.1", port)
        async with server:
            assert (await client.get(url)).status_code == 200
        seen.append(reach.down)
        await client.aclose()
        return seen

    down, up = asyncio.run(run())
    assert down is not None and down.startswith("ConnectError")
    assert up is None
