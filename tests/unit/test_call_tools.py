"""CallTools against the real reference provider (in-process aiohttp server) and a real store:
asking twice for the same intent gets the original outcome and sends one request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from config.tools import ToolSettings
from session import effects as fx
from session import events as sev
from session.durable import DurableSession
from session.ledger import intent_digest, intent_key
from session.store import ToolIntent, ToolReceipt
from session.store.reader import StoreReader
from session.store.sqlite import SqliteSessionStore
from session.store.writer import StoreWriter
from tests.payment_app import payment_app
from voicegate.faults import Faults
from voicegate.observe.metrics import Metrics
from voicegate.tools.call_tools import CallTools, ToolDone, ToolRefused
from voicegate.tools.client import ToolClient


@dataclass
class Services:
    reader: StoreReader
    writer: StoreWriter
    tool_client: ToolClient
    tools: Mapping[str, ToolSettings]
    metrics: Metrics = field(default_factory=Metrics)
    faults: Faults = field(default_factory=lambda: Faults(""))
    reconcile_timeout_s: float = 5.0
    status_attempts: int = 4


def in_task(then: Callable[[Future[Any]], None], done: Future[Any]) -> None:
    """What the call's steps do with a store job's answer: ``then`` on the loop, in order."""
    loop = asyncio.get_running_loop()
    done.add_done_callback(lambda f: loop.call_soon_threadsafe(then, f))


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[TestServer]:
    server = TestServer(await payment_app(tmp_path / "ledger.sqlite3"))
    await server.start_server()
    yield server
    await server.close()


async def test_the_same_intent_twice_is_one_charge_and_the_original_outcome(
    tmp_path: Path, provider: TestServer
) -> None:
    base = str(provider.make_url(""))
    tool = ToolSettings(
        "charge", "write", f"{base}/v1/charges", f"{base}/v1/charges/{{key}}", 2.0, "dtmf"
    )
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    async with aiohttp.ClientSession() as http:
        writer = StoreWriter(lambda: SqliteSessionStore(tmp_path / "s.sqlite3"))
        reader = StoreReader(lambda: SqliteSessionStore(tmp_path / "s.sqlite3"))
        services = Services(reader, writer, ToolClient(http), {"charge": tool})
        session, _ = DurableSession.create(
            store, "s1", owner="w/1", meta={}, offered=sev.CallOffered(), now=time.time()
        )
        queue: asyncio.Queue[object] = asyncio.Queue()

        def apply(event: sev.Event) -> list[fx.Effect]:
            effects = session.apply(event, time.time())
            for effect in effects:  # what LiveCall does with SendToolRequest
                if isinstance(effect, fx.SendToolRequest):
                    intent = next(o for o in session.state.outstanding if o.key == effect.key)
                    tools.send(intent, tools.persist_intent(intent))
            return effects

        tools = CallTools(
            "s1",
            services,
            apply=apply,
            post=queue.put_nowait,
            current_turn=lambda: "t1",
            find_outstanding=lambda key: next(
                (o for o in session.state.outstanding if o.key == key), None
            ),
            durable=lambda: None,  # this test's session writes synchronously
            wall=time.time,
            in_task=in_task,
        )
        apply(sev.CallAnswered())
        apply(sev.TurnStarted("t1"))
        apply(sev.TurnCommitted("t1"))
        args: dict[str, Any] = {"amount_cents": 250, "currency": "EUR", "account": "a1"}

        # Without the caller's key press a dtmf-approved write is refused, nothing sent.
        tools.request("charge", args, None, approved=False)
        refused = await asyncio.wait_for(queue.get(), 5)
        assert isinstance(refused, ToolRefused) and refused.result.outcome == "refused"

        key = tools.request("charge", args, None, approved=True)
        done = await asyncio.wait_for(queue.get(), 5)
        assert isinstance(done, ToolDone) and done.outcome.outcome == "committed"
        # The log is the truth for tools: the intent event carries the real arguments, and the
        # intent row is written from it.
        intents = [e for e in store.events("s1") if e.type == "tool_intent"]
        assert [e.payload["arguments"] for e in intents] == [args]
        row = store.intent(key)
        assert row is not None and dict(row.arguments) == args
        first = tools.record(done, "charge")
        await asyncio.to_thread(writer.flush)

        # The agent asks again for the same thing (same tool, arguments, session, turn).
        again = tools.request("charge", args, None, approved=True)
        duplicate = await asyncio.wait_for(queue.get(), 5)
        assert again == key
        assert isinstance(duplicate, ToolRefused)
        assert duplicate.result.duplicate and duplicate.result.outcome == "committed"
        assert duplicate.result.detail["charge_id"] == first.detail["charge_id"]

        # A different request under the same key is refused with a clear reason.
        tools.request("charge", {**args, "amount_cents": 999}, key, approved=True)
        conflict = await asyncio.wait_for(queue.get(), 5)
        assert isinstance(conflict, ToolRefused) and conflict.result.outcome == "refused"
        assert "different request" in conflict.result.detail["reason"]

        async with http.get(f"{base}/v1/ledger") as resp:
            rows = (await resp.json())["rows"]
        assert [(r["key"], r["status"]) for r in rows] == [(key, "committed")]
        assert services.metrics.tool_duplicates_prevented.labels("charge")._value.get() == 1
    writer.close()
    reader.close()
    store.close()


@pytest.mark.parametrize(("approval", "sent"), [("dtmf", False), ("caller", True)])
async def test_a_spoken_yes_approves_only_a_tool_that_takes_the_callers_voice(
    tmp_path: Path, provider: TestServer, approval: str, sent: bool
) -> None:
    base = str(provider.make_url(""))
    tool = ToolSettings(
        "charge", "write", f"{base}/v1/charges", f"{base}/v1/charges/{{key}}", 2.0, approval
    )
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    async with aiohttp.ClientSession() as http:
        writer = StoreWriter(lambda: SqliteSessionStore(tmp_path / "s.sqlite3"))
        reader = StoreReader(lambda: SqliteSessionStore(tmp_path / "s.sqlite3"))
        services = Services(reader, writer, ToolClient(http), {"charge": tool})
        session, _ = DurableSession.create(
            store, "s1", owner="w/1", meta={}, offered=sev.CallOffered(), now=time.time()
        )
        queue: asyncio.Queue[object] = asyncio.Queue()

        def apply(event: sev.Event) -> list[fx.Effect]:
            effects = session.apply(event, time.time())
            for effect in effects:
                if isinstance(effect, fx.SendToolRequest):
                    intent = next(o for o in session.state.outstanding if o.key == effect.key)
                    tools.send(intent, tools.persist_intent(intent))
            return effects

        tools = CallTools(
            "s1", services, apply=apply, post=queue.put_nowait, current_turn=lambda: "t1",
            find_outstanding=lambda key: next(
                (o for o in session.state.outstanding if o.key == key), None
            ),
            durable=lambda: None, wall=time.time, in_task=in_task,
        )  # fmt: skip
        apply(sev.CallAnswered())
        apply(sev.TurnStarted("t1"))
        apply(sev.TurnCommitted("t1"))
        args: dict[str, Any] = {"amount_cents": 59, "currency": "EUR", "account": "a1"}
        tools.request("charge", args, None, approved=False, spoken=True)
        result = await asyncio.wait_for(queue.get(), 5)
        if sent:
            assert isinstance(result, ToolDone) and result.outcome.outcome == "committed"
            assert [e.type for e in store.events("s1")].count("approval_given") == 1
        else:
            assert isinstance(result, ToolRefused) and result.result.outcome == "refused"
            assert "by key press" in result.result.detail["reason"]
            assert not [e for e in store.events("s1") if e.type == "tool_intent"]
        await asyncio.to_thread(writer.flush)


async def test_a_receipt_that_contradicts_the_one_on_record_ends_the_session_needs_human(
    tmp_path: Path, provider: TestServer
) -> None:
    """Seed 000's "conflicting receipt": another writer (a stalled owner, a provider whose
    answers disagree) already recorded committed for the key; this call's answer says failed.
    Neither is picked: the conflict is the session's own event, and a person settles it."""
    base = str(provider.make_url(""))
    tool = ToolSettings(
        "charge", "write", f"{base}/v1/charges", f"{base}/v1/charges/{{key}}", 2.0, "none"
    )
    db = tmp_path / "s.sqlite3"
    store = SqliteSessionStore(db)
    args: dict[str, Any] = {"amount_cents": 0, "currency": "EUR", "account": "a1"}  # refused
    digest = intent_digest("charge", args, "s1", "t1")
    key = intent_key("s1", digest)
    async with aiohttp.ClientSession() as http:
        writer = StoreWriter(lambda: SqliteSessionStore(db))
        reader = StoreReader(lambda: SqliteSessionStore(db))
        services = Services(reader, writer, ToolClient(http), {"charge": tool})
        session, _ = DurableSession.create(
            store, "s1", owner="w/1", meta={}, offered=sev.CallOffered(), now=time.time()
        )
        store.record_intent(ToolIntent(key, "s1", "t1", "charge", "write", digest, args, 1.0))
        store.record_receipt(ToolReceipt(key, "committed", {"via": "elsewhere"}, 2.0))
        queue: asyncio.Queue[object] = asyncio.Queue()

        def apply(event: sev.Event) -> list[fx.Effect]:
            effects = session.apply(event, time.time())
            for effect in effects:
                if isinstance(effect, fx.SendToolRequest):
                    intent = next(o for o in session.state.outstanding if o.key == effect.key)
                    tools.send(intent, tools.persist_intent(intent))
            return effects

        tools = CallTools(
            "s1", services, apply=apply, post=queue.put_nowait, current_turn=lambda: "t1",
            find_outstanding=lambda k: next(
                (o for o in session.state.outstanding if o.key == k), None
            ),
            durable=lambda: None, wall=time.time, in_task=in_task,
        )  # fmt: skip
        apply(sev.CallAnswered())
        apply(sev.TurnStarted("t1"))
        apply(sev.TurnCommitted("t1"))
        assert tools.request("charge", args, None, approved=False) == key
        done = await asyncio.wait_for(queue.get(), 5)
        assert isinstance(done, ToolDone) and done.outcome.outcome == "failed"
        tools.record(done, "charge")
        await asyncio.to_thread(writer.flush)
        await wait_until(lambda: session.state.terminal, "the conflict to end the session")
        ended = session.state.ended
        assert ended is not None
        assert (ended.terminal_state, ended.stage) == ("needs_human", "reconciliation")
        types = [e.type for e in store.events("s1")]
        assert types[-1] != "tool_receipt" and "tool_receipt_conflicted" in types
        receipt = store.receipt(key)
        assert receipt is not None and receipt.outcome == "committed"  # the record stays
        assert [o.key for o in session.state.outstanding] == [key]  # nothing assumed
        assert services.metrics.tool_receipt_conflicts.labels("charge")._value.get() == 1
    writer.close()
    reader.close()
    store.close()


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Let the loop run the call's callbacks until ``condition`` holds, at most ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
