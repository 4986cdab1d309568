"""The write path end to end: a SIPp caller pays through the demo agent, against the real
reference payment provider, including the provider being slow, failing and saying "unknown";
each on the embedded SQLite store and on the shared PostgreSQL one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Provider, Server, ServerFactory, Sipp, wait_for


@pytest.fixture(params=["sqlite", "postgresql"])
def server_factory(
    request: pytest.FixtureRequest, server_factory: ServerFactory
) -> ServerFactory:
    """Every payment test on both stores: the shared one keeps the same promises."""
    if request.param == "sqlite":
        return server_factory
    # A database of the process's cluster that outlives the servers (pg_url would be dropped
    # before server_factory stops them and checks what they left in the store).
    cluster = request.getfixturevalue("pg_cluster")
    database = f"payments_{uuid.uuid4().hex[:12]}"
    cluster.create_database(database)
    url = cluster.url(database)

    def on_postgres(name: str = "server", wait_ready: bool = True, **env: str) -> Server:
        return server_factory(name, wait_ready, **{"VOICEGATE_STORAGE_URL": url, **env})

    return on_postgres


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[Provider]:
    p = Provider(tmp_path / "provider").start()
    yield p
    p.stop()


def _session(server: Server) -> dict[str, Any]:
    (session,) = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]] or None, 30, "the session to end"
    )
    return session


def _receipts(session: dict[str, Any]) -> list[dict[str, Any]]:
    return [e["payload"] for e in session["events"] if e["type"] == "tool_receipt"]


def test_a_payment_is_charged_once_and_read_back(
    server_factory: ServerFactory, provider: Provider, tmp_path: Path
) -> None:
    server = server_factory(**provider.tool_env())
    sipp = Sipp("uac-payment.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _session(server)
    (charge,) = provider.charges()
    assert (charge["amount_cents"], charge["currency"]) == (59, "EUR")
    (receipt,) = _receipts(session)
    assert receipt["outcome"] == "committed"
    intent = next(e["payload"] for e in session["events"] if e["type"] == "tool_intent")
    assert intent["key"] == charge["key"] == receipt["key"]
    # The log is the truth for tools: the intent event carries the request the provider got.
    assert intent["arguments"]["amount_cents"] == 59
    assert intent["arguments"]["currency"] == "EUR"
    # The approval came from the caller's key press, before the intent.
    types = [e["type"] for e in session["events"]]
    assert types.index("approval_given") < types.index("tool_intent")
    assert types.index("tool_intent") < types.index("tool_request_sent")
    assert types.index("tool_request_sent") < types.index("tool_receipt")
    assert session["ended"]["terminal_state"] == "completed"
    assert server.metric("voicegate_tool_calls_total", tool="charge", outcome="committed") == 1
    payments = [e for e in server.log_events() if e.get("event") == "demo.payment"]
    assert [p["outcome"] for p in payments] == ["committed"]


def test_a_slow_provider_is_reconciled_by_status_not_by_resending(
    server_factory: ServerFactory,
    provider: Provider,
    tmp_path: Path,
) -> None:
    # The charge takes 3 s; voicegate gives up on the response after 1 s, then asks the status
    # endpoint (in progress... committed) instead of sending the charge again.
    provider.set_faults(charge_delay_s=3.0)
    server = server_factory(**provider.tool_env(timeout_s=1.0))
    sipp = Sipp("uac-payment.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _session(server)
    assert len(provider.charges()) == 1
    (receipt,) = _receipts(session)
    assert receipt["outcome"] == "committed"
    assert server.metric("voicegate_reconciliations_total", outcome="committed") == 1
    assert session["ended"]["terminal_state"] == "completed"


def test_a_failing_provider_ends_as_confirmed_not_started(
    server_factory: ServerFactory,
    provider: Provider,
    tmp_path: Path,
) -> None:
    provider.set_faults(fail_status=503, fail_count=1)
    server = server_factory(**provider.tool_env())
    sipp = Sipp("uac-payment.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _session(server)
    assert provider.charges() == []
    (receipt,) = _receipts(session)
    # 503 says nothing definite; the status endpoint then says it never started.
    assert receipt["outcome"] == "not_started"
    assert session["ended"]["terminal_state"] == "completed"
    payments = [e for e in server.log_events() if e.get("event") == "demo.payment"]
    assert [p["outcome"] for p in payments] == ["not_started"]


def test_an_unknown_outcome_sends_the_session_to_needs_human(
    server_factory: ServerFactory,
    provider: Provider,
    tmp_path: Path,
) -> None:
    provider.set_faults(charge_delay_s=6.0, status_unknown=True)
    server = server_factory(
        **provider.tool_env(timeout_s=1.0),
        VOICEGATE_SESSION_RECONCILE_TIMEOUT_S="2",
        VOICEGATE_SESSION_STATUS_ATTEMPTS="3",
    )
    # The caller hears "I cannot confirm yet whether your request went through" and gets a BYE.
    sipp = Sipp("uac-payment.xml", server.sip_target, tmp_path)
    sipp.run()  # the server hangs up during the caller's wait: SIPp reports the unexpected BYE
    session = _session(server)
    ended = session["ended"]
    assert (ended["terminal_state"], ended["stage"]) == ("needs_human", "reconciliation")
    last = session["events"][-1]
    assert last["type"] == "tool_receipt" and last["payload"]["outcome"] == "unknown"
    assert {"kind": "say", "prompt": "outcome_unknown"} in last["effects"]
    assert any(effect["kind"] == "hang_up" for effect in last["effects"])
    # The intent is kept for a person to resolve, never assumed either way.
    assert [i["stage"] for i in session["outstanding_intents"]] == ["unknown"]
    assert server.metric("voicegate_needs_human_total", reason="reconciliation") == 1
    # The provider did charge (late): the session never claimed otherwise.
    wait_for(lambda: len(provider.charges()) == 1, 10, "the slow charge to land")
