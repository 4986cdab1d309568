"""The control plane's rules, against the real single-process app over a real (unstarted) Runtime:
every error is JSON, unknown and repeated query parameters and request bodies are refused, and a
slow client cannot hold a connection open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from config import load_settings
from tests.unit.control_client import ControlClient
from voicegate.control.http_api import make_app
from voicegate.control.http_rules import CLIENT_MAX_SIZE, app_runner
from voicegate.runtime import Runtime


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """Built outside the event loop: opening the store waits for the writer thread."""
    runtime = Runtime(load_settings(environ={"VOICEGATE_STORAGE_DATA_DIR": str(tmp_path)}))
    yield runtime
    runtime.writer.close()
    runtime.reader.close()


@pytest.fixture
async def client(runtime: Runtime) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with ControlClient(TestServer(make_app(runtime))) as client:
        yield client


async def _json(response: Any) -> dict[str, Any]:
    assert response.content_type == "application/json", await response.text()
    body = await response.json()
    assert isinstance(body, dict) and isinstance(body["error"], str)
    return body


async def test_an_unknown_path_is_a_json_404(client: TestClient[Any, Any]) -> None:
    response = await client.get("/v2/nothing")
    assert response.status == 404
    assert (await _json(response))["path"] == "/v2/nothing"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/healthz", ["GET"]),
        ("POST", "/v1/sessions", ["GET"]),
        ("GET", "/v1/calls/abc/hangup", ["POST"]),
    ],
)
async def test_a_wrong_method_is_a_json_405_with_allow(
    client: TestClient[Any, Any], method: str, path: str, allowed: list[str]
) -> None:
    response = await client.request(method, path)
    assert response.status == 405
    assert response.headers["Allow"] == ",".join(allowed)
    body = await _json(response)
    assert body["method"] == method and body["allowed"] == allowed


async def test_head_is_not_served(client: TestClient[Any, Any]) -> None:
    response = await client.head("/healthz")
    assert response.status == 405
    assert response.headers["Allow"] == "GET"


@pytest.mark.parametrize(
    ("path", "parameter", "allowed"),
    [
        ("/healthz?verbose=1", "verbose", []),
        ("/v1/calls?limit=5", "limit", []),
        ("/v1/calls/abc?x=1", "x", []),
        (
            "/v1/sessions?limt=5&colour=blue",
            "colour",
            ["cursor", "limit", "state", "terminal_state"],
        ),
    ],
)
async def test_an_unknown_query_parameter_is_a_400_naming_it(
    client: TestClient[Any, Any], path: str, parameter: str, allowed: list[str]
) -> None:
    response = await client.get(path)
    assert response.status == 400
    body = await _json(response)
    assert body["parameter"] == parameter and body["allowed"] == allowed


async def test_every_unknown_parameter_is_named(client: TestClient[Any, Any]) -> None:
    response = await client.get("/v1/sessions?limt=5&colour=blue")
    assert (await _json(response))["unknown"] == ["colour", "limt"]


async def test_a_repeated_parameter_is_a_400_naming_it(client: TestClient[Any, Any]) -> None:
    response = await client.get("/v1/sessions?limit=5&limit=500")
    assert response.status == 400
    assert (await _json(response))["parameter"] == "limit"


async def test_the_known_parameters_still_work(client: TestClient[Any, Any]) -> None:
    response = await client.get("/v1/sessions?state=ended&limit=5")
    assert response.status == 200
    assert await response.json() == {"sessions": [], "next_cursor": None}
    bad = await client.get("/v1/sessions?limit=0")
    assert bad.status == 400 and (await _json(bad))["parameter"] == "limit"


async def test_the_hangup_takes_no_body(client: TestClient[Any, Any]) -> None:
    response = await client.post("/v1/calls/abc/hangup", data=b'{"reason": "x"}')
    assert response.status == 400
    assert (await _json(response))["field"] == "body"
    chunked = await client.post("/v1/calls/abc/hangup", data=_chunks())
    assert chunked.status == 400
    # An empty body is no body: the route answers as usual.
    empty = await client.post("/v1/calls/abc/hangup", data=b"")
    assert empty.status == 404
    assert (await _json(empty))["call_id"] == "abc"


async def _chunks() -> AsyncIterator[bytes]:
    yield b"a"


async def test_a_body_above_the_limit_is_a_json_413(client: TestClient[Any, Any]) -> None:
    response = await client.post("/v1/calls/abc/hangup", data=b"x" * (CLIENT_MAX_SIZE + 1))
    assert response.status == 413
    body = await _json(response)
    assert body["field"] == "body" and body["limit"] == CLIENT_MAX_SIZE


async def test_a_handler_that_fails_is_a_json_500(
    runtime: Runtime, client: TestClient[Any, Any]
) -> None:
    # The store's readers closed under a request (as at the end of a shutdown): a bug of ours.
    runtime.reader.close()
    response = await client.get("/v1/calls/abc")
    assert response.status == 500
    assert await _json(response) == {"error": "internal error"}


async def test_successes_are_untouched(client: TestClient[Any, Any]) -> None:
    health = await client.get("/healthz")
    assert health.status == 200 and (await health.json())["status"] == "ok"
    ready = await client.get("/readyz")  # SIP never started
    assert ready.status == 503 and (await ready.json())["sip_transports_up"] is False


async def _served(runtime: Runtime, keepalive_s: float) -> tuple[web.AppRunner, int]:
    runner = app_runner(make_app(runtime), keepalive_timeout_s=keepalive_s)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    return runner, server.sockets[0].getsockname()[1]


async def test_a_client_sending_its_headers_slowly_is_cut_off(runtime: Runtime) -> None:
    runner, port = await _served(runtime, keepalive_s=0.3)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never the blank line
        await writer.drain()
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        assert asyncio.get_running_loop().time() - started < 3
        writer.close()
    finally:
        await runner.cleanup()


async def test_an_idle_keep_alive_connection_is_closed(runtime: Runtime) -> None:
    runner, port = await _served(runtime, keepalive_s=0.3)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        assert answer.startswith(b"HTTP/1.1 200")
        length = int(answer.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        # Kept alive, then closed for idleness without another byte from us.
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        writer.close()
    finally:
        await runner.cleanup()
