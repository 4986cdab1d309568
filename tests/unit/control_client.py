"""An in-process client of voicegate's control apps whose every answer is checked against
docs/openapi.yaml (tests/contract.py), as the integration harness checks a real server's."""

from __future__ import annotations

import asyncio
from typing import Any

import yarl
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from tests.contract import check_answer


class ControlClient(TestClient[web.Request, web.Application]):
    """``TestClient`` for ``make_app`` or ``make_pool_app`` only: never another server's app."""

    async def _request(self, method: str, path: str | yarl.URL, **kwargs: Any) -> ClientResponse:
        response = await super()._request(method, path, **kwargs)
        # Read here so the check sees the body; aiohttp keeps it for the test's .json()/.text().
        body = await response.read()
        target = str(response.url.relative())
        # Off the loop: loading the document and validating a body take the CPU for tens of
        # milliseconds, which the loop watch (tests/conftest.py) would rightly call a block.
        await asyncio.to_thread(
            check_answer, method, target, response.status, response.content_type, body
        )
        return response
