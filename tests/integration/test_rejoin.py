"""Rejoin by resume handle end to end (issue 18; docs/tenants.md, "Coming back"): a real SIPp
caller pays through the demo agent against the real reference payment provider, is transferred
out blind, and the "call centre" sends them back with the handle from the REFER. One server for
the module, two tenants (the caller's and another), a few seconds of call each.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from session.resume import issue
from session.store.sqlite import SqliteSessionStore
from tests.integration.harness import ROOT, Provider, Server, ServerFactory, Sipp, wait_for
from tests.integration.resume_handles import away_session
from tests.integration.test_pool import pool_env, ready_workers, workers
from tests.secret_audit import AUDIT

CC = "sip:desk@cc.example.com"
# The caller's tenant answers any number; "other" owns 200 (a handle of the first is refused
# there as another tenant's).
TENANTS = """
[tenants.main]
numbers = []
[tenants.other]
numbers = ["200"]
"""


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    p = Provider(tmp_path_factory.mktemp("provider")).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, provider: Provider) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("rejoin")
    config = root / "tenants.toml"
    config.write_text(TENANTS)
    env = {
        **provider.tool_env(),
        "VOICEGATE_CONFIG": str(config),
        "PYTHONPATH": str(ROOT),
        "VOICEGATE_TRANSFER_ALLOWED_TARGETS": "sip:*@cc.example.com",
        "VOICEGATE_TRANSFER_DEFAULT_TARGET": CC,
    }
    s = Server(root / "server", env_overrides=env).start()
    yield s
    s.stop()


def _handle_from(log: Path) -> str:
    (handle,) = re.findall(r"X-Voicegate-Resume: (\S+)", log.read_text())
    AUDIT.register(handle, "resume handle sent on a REFER", "tests/integration/test_rejoin.py")
    return handle


def _presenting(server: Server, work: Path, scenario: str, handle: str, *extra: str) -> Sipp:
    """A SIPp run whose INVITE presents ``handle`` (from an -inf file, never on a command
    line); its -log_file is ``work / "sipp-logs.log"``."""
    work.mkdir(parents=True, exist_ok=True)
    csv = work / "handle.csv"
    csv.write_text(f"SEQUENTIAL\n{handle};\n")
    log = work / "sipp-logs.log"
    return Sipp(
        scenario,
        server.sip_target,
        work,
        extra=("-inf", str(csv), "-trace_logs", "-log_file", str(log), *extra),
    )


def _present(server: Server, work: Path, scenario: str, handle: str, *extra: str) -> Path:
    sipp = _presenting(server, work, scenario, handle, *extra)
    assert sipp.run() == 0, sipp.errors()
    return work / "sipp-logs.log"


def _refused(server: Server, work: Path, handle: str, *extra: str) -> str:
    log = _present(server, work, "uac-rejoin-refused.xml", handle, *extra)
    (phrase,) = re.findall(r"refused: ([A-Za-z ]+)", log.read_text())
    return phrase.strip()


def _session(server: Server, session_id: str) -> dict[str, Any]:
    status, body = server.http(f"/v1/sessions/{session_id}")
    assert status == 200, body
    return dict(body)


def _types(session: dict[str, Any]) -> list[str]:
    return [e["type"] for e in session["events"]]


def _unchanged(session: dict[str, Any]) -> tuple[object, ...]:
    return (len(session["events"]), session["lease_epoch"], session["status"])


def test_a_caller_sent_back_with_the_handle_rejoins_and_hears_the_payment_outcome(
    server: Server, provider: Provider, tmp_path: Path
) -> None:
    log = tmp_path / "caller-logs.log"
    caller = Sipp(
        "uac-pay-then-transfer.xml",
        server.sip_target,
        tmp_path / "caller",
        extra=("-trace_logs", "-log_file", str(log)),
    ).start()
    session_id: str = wait_for(
        lambda: [c["call_id"] for c in server.live_calls() if c["state"] == "answered"],
        10,
        "the caller answered",
    )[0]
    wait_for(
        lambda: "tool_receipt" in _types(_session(server, session_id)), 30, "the payment receipt"
    )
    status, body = server.post_json(f"/v1/calls/{session_id}/transfer", {"target": CC})
    assert status == 202, body
    assert caller.wait() == 0, caller.errors()
    away = away_session(server, session_id)
    assert away["lease_epoch"] == 1
    handle = _handle_from(log)

    # The centre sends the caller back with it: the same session, its next signaling
    # generation, the lease moved on, and the payment read back, never charged again.
    back_call = _presenting(server, tmp_path / "back", "uac-rejoin.xml", handle).start()
    wait_for(
        lambda: "call_answered" in _types(_session(server, session_id))[len(away["events"]) :],
        10,
        "the rejoined call answered",
    )
    # The same handle again while the caller is back: refused as used, counted, and (it may
    # have been stolen) the session's writes freeze until reconciled.
    assert _refused(server, tmp_path / "again", handle) == "Resume Handle Already Used"
    assert back_call.wait() == 0, back_call.errors()
    back = wait_for(
        lambda: (s := _session(server, session_id))["terminal_state"] and s, 15, "the end"
    )
    rejoined = [e for e in back["events"] if e["type"] == "rejoined"]
    assert [(e["payload"]["generation"], e["payload"]["via"]) for e in rejoined] == [(1, "header")]
    assert back["lease_epoch"] == 2
    assert back["terminal_state"] == "completed"
    types = _types(back)
    assert types.count("tool_request_sent") == 1 and types.count("call_answered") == 2
    # Each dialog numbers its own responses and turns; the session's log holds each id once
    # (the rejoined dialog's responses are g1.r1, ...; its caller keys nothing, so no turn).
    for kind, field in (("response_started", "response_id"), ("turn_started", "turn_id")):
        ids = [e["payload"][field] for e in back["events"] if e["type"] == kind]
        assert len(ids) == len(set(ids)), (kind, ids)
    responses = [
        e["payload"]["response_id"] for e in back["events"] if e["type"] == "response_started"
    ]
    assert any(r.startswith("g1.") for r in responses), responses
    (charge,) = provider.charges()
    assert charge["amount_cents"] == 59
    told = [e for e in server.log_events() if e.get("event") == "demo.rejoined"]
    assert [(t["call_id"], t["outcome"]) for t in told] == [(session_id, "committed")]
    (reused,) = [e for e in back["events"] if e["type"] == "resume_reused"]
    assert types.index("rejoined") < types.index("resume_reused")
    assert {"kind": "gate_changed", "old": "open", "new": "frozen"}.items() <= next(
        x for x in reused["effects"] if x["kind"] == "gate_changed"
    ).items()
    assert server.metric("voicegate_resume_attempts_total", result="ok") == 1
    assert server.metric("voicegate_resume_attempts_total", result="reused") == 1
    assert handle not in server.log()


def test_expired_forged_malformed_and_cross_tenant_handles_are_refused_changing_nothing(
    server: Server, tmp_path: Path
) -> None:
    log = tmp_path / "caller-logs.log"
    sipp = Sipp(
        "uac-transfer-blind.xml",
        server.sip_target,
        tmp_path / "caller",
        extra=("-trace_logs", "-log_file", str(log)),
    )
    assert sipp.run() == 0, sipp.errors()
    handle = _handle_from(log)
    away = away_session(server)  # the other test's session has ended
    session_id = away["session_id"]
    before = _unchanged(_session(server, session_id))
    prefix, selector, verifier = handle.split(".")
    forged = f"{prefix}.{selector}.{verifier[::-1]}"
    assert forged != handle
    # Another tenant's number: a real handle, but not this tenant's.
    assert _refused(server, tmp_path / "other", handle, "-s", "200") == (
        "Resume Handle Of Another Tenant"
    )
    # The same, handed back inside hex User-to-User instead of X-Voicegate-Resume (the hex is
    # the handle too: the audit looks for it in everything the server wrote).
    AUDIT.register(handle.encode().hex(), "a resume handle in hex", "tests/integration")
    uui = _present(
        server, tmp_path / "uui", "uac-rejoin-uui-refused.xml", handle.encode().hex(), "-s", "200"
    )
    assert re.findall(r"refused: ([A-Za-z ]+)", uui.read_text()) == [
        "Resume Handle Of Another Tenant"
    ]
    assert _refused(server, tmp_path / "forged", forged) == "Resume Handle Invalid"
    assert _refused(server, tmp_path / "malformed", "vgr1.not-a-handle") == "Resume Handle Invalid"
    # A handle past its lifetime (issued long ago for the same session; it supersedes the one
    # the REFER carried, which is then expired too: a newer one was issued).
    old = issue(session_id, "main", now=time.time() - 10_000, ttl_s=60)
    AUDIT.register(old.text, "an expired resume handle", "tests/integration/test_rejoin.py")
    store = SqliteSessionStore(server.data_dir / "voicegate.sqlite3")
    try:
        store.record_handle(old.record)
    finally:
        store.close()
    assert _refused(server, tmp_path / "expired", old.text) == "Resume Handle Expired"
    assert _refused(server, tmp_path / "superseded", handle) == "Resume Handle Expired"
    for result, count in (("cross_tenant", 2), ("invalid", 2), ("expired", 2)):
        assert server.metric("voicegate_resume_attempts_total", result=result) == count
    # Nothing changed: no event, no take-over, still away.
    assert _unchanged(_session(server, session_id)) == before
    assert handle not in server.log() and old.text not in server.log()


def test_in_a_pool_the_caller_rejoins_on_another_worker_which_takes_the_lease(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    pool = server_factory(
        "pool",
        **pool_env(2),
        VOICEGATE_TRANSFER_ALLOWED_TARGETS="sip:*@cc.example.com",
        VOICEGATE_TRANSFER_DEFAULT_TARGET=CC,
    )
    wait_for(lambda: ready_workers(pool) == 2, 30, "both workers ready")
    log = tmp_path / "caller-logs.log"
    sipp = Sipp(
        "uac-transfer-blind.xml",
        pool.sip_target,
        tmp_path / "caller",
        extra=("-trace_logs", "-log_file", str(log)),
    )
    assert sipp.run() == 0, sipp.errors()
    away = away_session(pool)
    handle = _handle_from(log)
    # Straight to the worker that did not serve the first call (as a front door may send it).
    other = next(w for w in workers(pool) if w["owner"] != away["owner"])
    worker_target = other["sip"].removeprefix("sip:")
    csv = tmp_path / "back" / "handle.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text(f"SEQUENTIAL\n{handle};\n")
    back_call = Sipp("uac-rejoin.xml", worker_target, tmp_path / "back", extra=("-inf", str(csv)))
    assert back_call.run() == 0, back_call.errors()
    back = wait_for(
        lambda: (s := _session(pool, away["session_id"]))["terminal_state"] and s, 15, "the end"
    )
    assert back["owner"] == other["owner"] and back["lease_epoch"] == 2
    assert [e["payload"]["generation"] for e in back["events"] if e["type"] == "rejoined"] == [1]
    assert back["terminal_state"] == "completed"
