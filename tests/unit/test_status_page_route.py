"""Both control apps serve GET /status: HTML that may load nothing from another origin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config import load_settings
from tests.unit.control_client import ControlClient
from voicegate.control.http_api import make_app
from voicegate.control.pool_api import make_pool_app
from voicegate.pool.supervisor import Supervisor
from voicegate.runtime import Runtime


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """Built outside the event loop: opening the store waits for the writer thread."""
    runtime = Runtime(load_settings(environ={"VOICEGATE_STORAGE_DATA_DIR": str(tmp_path)}))
    yield runtime
    runtime.writer.close()
    runtime.reader.close()


async def _check(app: web.Application) -> None:
    async with ControlClient(TestServer(app)) as client:
        response = await client.get("/status")
        assert response.status == 200
        assert response.content_type == "text/html"
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        assert "<title>voicegate status</title>" in await response.text()
        # Like every route: no HEAD, no query parameters.
        assert (await client.head("/status")).status == 405
        assert (await client.get("/status?x=1")).status == 400


async def test_the_process_app_serves_the_status_page(runtime: Runtime) -> None:
    await _check(make_app(runtime))


async def test_the_pool_app_serves_the_status_page(tmp_path: Path) -> None:
    settings = load_settings(environ={"VOICEGATE_STORAGE_DATA_DIR": str(tmp_path)})
    await _check(make_pool_app(Supervisor(settings, None)))
