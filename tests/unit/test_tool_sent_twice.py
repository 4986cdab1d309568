"""A write sent twice is counted: the reference payment provider (its real app, on a loopback
socket) answers the second send of a key as a replay, and the tool client counts that in
``voicegate_tool_sends_repeated_total`` (the VoicegateToolWriteSentTwice alert), while the
provider's idempotency keeps it to one charge."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from config.tools import ToolSettings
from session.vocabulary import Outcome
from tests.payment_app import payment_app
from voicegate.observe.metrics import Metrics
from voicegate.tools.client import ToolClient

CHARGE = {"amount_cents": 59, "currency": "EUR", "account": "acct_ok"}


def repeated(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value(
        "voicegate_tool_sends_repeated_total", {"tool": "charge"}
    )
    return value or 0.0


async def test_a_key_sent_a_second_time_is_counted_and_charged_once(tmp_path: Path) -> None:
    server = TestServer(await payment_app(tmp_path / "ledger.sqlite3"))
    await server.start_server()
    metrics = Metrics()
    try:
        base = str(server.make_url(""))
        tool = ToolSettings(
            "charge", "write", f"{base}/v1/charges", f"{base}/v1/charges/{{key}}", 5.0, "dtmf"
        )
        async with aiohttp.ClientSession() as http:
            client = ToolClient(http, metrics)
            first = await client.request(tool, "vg-test-key-1", CHARGE)
            assert first.outcome == Outcome.COMMITTED
            assert repeated(metrics) == 0
            # What voicegate never does on purpose: the same key once more.
            second = await client.request(tool, "vg-test-key-1", CHARGE)
            assert second.outcome == Outcome.COMMITTED
            assert second.detail["charge_id"] == first.detail["charge_id"]
            assert repeated(metrics) == 1
            async with http.get(f"{base}/v1/ledger") as response:
                rows = (await response.json())["rows"]
            assert [r["status"] for r in rows] == ["committed"]
    finally:
        await server.close()
