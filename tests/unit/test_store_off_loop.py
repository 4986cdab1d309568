"""No store call runs on the event loop, with PostgreSQL 5 ms of round trip away.

A database on the same machine answers in microseconds, which would hide a synchronous call on
the loop; through tests/latency_proxy.py every round trip costs 5 ms, so a request that read the
store on the loop (a session's detail is several queries) would hold it past the suite's
blocked-loop limit (tests/conftest.py fails the test). And every store call records the thread
it ran on: none may be the loop's.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from config import load_settings
from session import events as sev
from session.durable import DurableSession
from session.store.postgres import PostgresSessionStore
from tests.latency_proxy import LatencyProxy
from tests.unit.control_client import ControlClient
from voicegate.control.http_api import make_app
from voicegate.runtime import Runtime

ROUND_TRIP_S = 0.005


@pytest.fixture
def slow_url(pg_url: str) -> Iterator[str]:
    host_port = pg_url.split("@", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    with LatencyProxy(host, int(port), delay_s=ROUND_TRIP_S / 2) as proxy:
        yield proxy.url_for(pg_url)


@pytest.fixture
def threads_used(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of every PostgreSQL transaction the store ran."""
    seen: list[int] = []
    real = PostgresSessionStore._run

    def recorded(self: PostgresSessionStore, *args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PostgresSessionStore, "_run", recorded)
    return seen


@pytest.fixture
def runtime(slow_url: str, tmp_path: Path) -> Iterator[Runtime]:
    # Sessions to read, written before the server's loop starts.
    # Old enough for the reaper (it runs on read): its take-overs and writes leave the loop too.
    store = PostgresSessionStore(slow_url)
    for n in range(3):
        session, _ = DurableSession.create(
            store, f"s{n}", owner="worker-0/old", meta={"n": n}, offered=sev.CallOffered(),
            now=1.0 + n,
        )  # fmt: skip
        session.apply(sev.CallAnswered(), 2.0 + n)
    store.close()
    env = {"VOICEGATE_STORAGE_DATA_DIR": str(tmp_path), "VOICEGATE_STORAGE_URL": slow_url}
    runtime = Runtime(load_settings(environ=env))
    yield runtime
    runtime.writer.close()
    runtime.reader.close()


@pytest.fixture
async def client(runtime: Runtime) -> AsyncIterator[TestClient[Any, Any]]:
    async with ControlClient(TestServer(make_app(runtime))) as client:
        yield client


async def test_the_api_reads_a_slow_store_without_holding_the_loop(
    client: TestClient[Any, Any], threads_used: list[int]
) -> None:
    loop_thread = threading.get_ident()
    listed = await client.get("/v1/sessions?limit=2")
    assert listed.status == 200
    body = await listed.json()
    assert [s["session_id"] for s in body["sessions"]] == ["s2", "s1"]
    page = await client.get(f"/v1/sessions?limit=2&cursor={body['next_cursor']}")
    assert [s["session_id"] for s in (await page.json())["sessions"]] == ["s0"]
    for path in ("/v1/sessions/s1", "/v1/sessions/s1/handoff", "/v1/calls/s1"):
        response = await client.get(path)
        assert response.status == 200, await response.text()
    detail = await (await client.get("/v1/sessions/s1")).json()
    assert detail["ended"]["terminal_state"] == "failed"  # reaped: its owner is long gone
    assert [e["seq"] for e in detail["events"]][:2] == [1, 2]
    refused = await client.post("/v1/sessions/s1/resume")  # ended: nothing to resume
    assert refused.status == 409, await refused.text()
    assert (await client.get("/v1/sessions/nope")).status == 404
    assert threads_used, "the requests read nothing from PostgreSQL"
    assert loop_thread not in threads_used
