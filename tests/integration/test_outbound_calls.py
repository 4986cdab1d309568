"""Outbound legs end to end (POST /v1/calls; voicegate/call/legs.py, session/legs.py): a real
``voicegate serve`` dials real SIPp callees (``sipp-scenarios/uas-*.xml``, each header says what
the server must do). Each test records the session's terminal state and the outcome's metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.harness import LOOPBACK, Server, ServerFactory, Sipp, free_port, wait_for
from tests.secret_audit import AUDIT

ENV = {"VOICEGATE_OUTBOUND_ALLOWED_TARGETS": "sip:callee@127.0.0.1:*"}


def _callee(scenario: str, tmp_path: Path) -> tuple[Sipp, str]:
    port = free_port()
    sipp = Sipp(scenario, "", tmp_path, port=port).start()
    return sipp, f"sip:callee@{LOOPBACK}:{port}"


def _place(server: Server, target: str) -> str:
    status, body = server.post_json("/v1/calls", {"target": target})
    assert status == 202, body
    assert body["placing"] is True and body["target"] == target
    call_id: str = body["call_id"]
    assert body["session"] == f"/v1/sessions/{call_id}"
    return call_id


def _ended(server: Server, call_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        status, session = server.http(f"/v1/sessions/{call_id}")
        return session if status == 200 and session["ended"] else None

    return wait_for(ended, 30, "the session to end")


def _outcomes(server: Server) -> dict[str, float]:
    outcomes = ("answered", "no_answer", "busy", "declined", "failed", "canceled")
    return {o: server.metric("voicegate_outbound_calls_total", outcome=o) for o in outcomes}


def test_an_answered_outbound_call_is_an_ordinary_session_until_the_callee_hangs_up(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV)
    sipp, target = _callee("uas-answer.xml", tmp_path)
    call_id = _place(server, target)
    # Answered, the agent speaks to the callee like to any caller: its greeting goes out.
    wait_for(
        lambda: any(
            c["call_id"] == call_id and c["state"] == "answered" and (c["frames_out"] or 0) > 10
            for c in server.live_calls()
        ),
        15,
        "the answered leg's media",
    )
    assert sipp.wait() == 0, sipp.errors()
    session = _ended(server, call_id)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "caller hung up",
    )
    types = [e["type"] for e in session["events"]]
    assert types[:2] == ["call_placed", "call_answered"]
    assert session["meta"]["direction"] == "outbound"
    assert session["meta"]["callee"] == target  # no digits to mask in this URI
    assert _outcomes(server) == {**dict.fromkeys(_outcomes(server), 0.0), "answered": 1.0}


CALLEE_NUMBER = "+15550100"
AUDIT.register(CALLEE_NUMBER, "callee number, unmasked", "test_outbound_calls.py")


def test_a_callee_number_is_masked_in_the_log_the_session_and_the_api(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    # STYLE.md habit 10: the number an outbound leg calls is a person's, like a caller's. The
    # audit (registered above) fails the run if it is anywhere in clear in the server's log.
    server = server_factory(VOICEGATE_OUTBOUND_ALLOWED_TARGETS="sip:*@127.0.0.1:*")
    port = free_port()
    sipp = Sipp("uas-answer.xml", "", tmp_path, port=port).start()
    target = f"sip:{CALLEE_NUMBER}@{LOOPBACK}:{port}"
    call_id = _place(server, target)
    (call,) = wait_for(
        lambda: [c for c in server.live_calls() if c["call_id"] == call_id], 15, "the leg"
    )
    assert (call["called_user"], call["caller"]) == (
        "+*****100",
        f"sip:+*****100@{LOOPBACK}:{port}",
    )
    assert sipp.wait() == 0, sipp.errors()
    session = _ended(server, call_id)
    assert session["meta"]["called_user"] == "+*****100"
    assert session["meta"]["callee"] == f"sip:+*****100@{LOOPBACK}:{port}"
    (offered,) = [e for e in server.log_events() if e.get("event") == "call.offered"]
    assert offered["called_user"] == "+*****100"


def test_a_busy_callee_is_the_outcome_busy(server_factory: ServerFactory, tmp_path: Path) -> None:
    server = server_factory(**ENV)
    sipp, target = _callee("uas-busy.xml", tmp_path)
    call_id = _place(server, target)
    assert sipp.wait() == 0, sipp.errors()  # the 486 was ACKed
    session = _ended(server, call_id)
    ended = session["ended"]
    assert (ended["terminal_state"], ended["reason"]) == ("canceled", "busy (486 Busy Here)")
    assert [e["type"] for e in session["events"]] == ["call_placed", "leg_unanswered"]
    wait_for(lambda: _outcomes(server)["busy"] == 1, 5, "the busy outcome counted")


def test_a_callee_who_never_answers_is_cancelled_at_the_ring_timeout(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV, VOICEGATE_OUTBOUND_RING_TIMEOUT_S="2")
    sipp, target = _callee("uas-no-answer.xml", tmp_path)
    call_id = _place(server, target)
    assert sipp.wait() == 0, sipp.errors()  # CANCEL, 200, 487, ACK
    session = _ended(server, call_id)
    ended = session["ended"]
    assert (ended["terminal_state"], ended["stage"], ended["reason"]) == (
        "timed_out",
        "ringing",
        "no answer before the ring timeout",
    )
    fired = [e for e in session["events"] if e["type"] == "deadline_fired"]
    assert [e["payload"]["name"] for e in fired] == ["ring"]
    wait_for(lambda: _outcomes(server)["no_answer"] == 1, 5, "the no_answer outcome counted")


def test_placements_the_worker_cannot_make_are_refused_up_front_and_change_nothing(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV, VOICEGATE_POOL_CALLS_PER_WORKER="1")
    status, body = server.post_json("/v1/calls", {"target": "sip:+19005550100@premium.example"})
    assert (status, body["field"]) == (403, "target")
    assert body["allowed_targets"] == ["sip:callee@127.0.0.1:*"]
    status, body = server.post_json("/v1/calls", {"target": "not a uri"})
    assert (status, body["field"]) == (400, "target")
    status, body = server.post_json("/v1/calls", {"target": "sip:callee@x", "extra": 1})
    assert (status, body["field"]) == (400, "extra")
    assert server.sessions() == []
    # One slot: a ringing leg takes it, and the next placement is refused with a clear 503.
    sipp, target = _callee("uas-no-answer.xml", tmp_path)
    call_id = _place(server, target)
    status, body = server.post_json("/v1/calls", {"target": target})
    assert status == 503, body
    assert body["error"].startswith("no free call slot") and body["max_calls"] == 1
    assert [s["session_id"] for s in server.sessions()] == [call_id]
    assert server.post(f"/v1/calls/{call_id}/hangup") == 202  # our CANCEL
    assert sipp.wait() == 0, sipp.errors()
    session = _ended(server, call_id)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "canceled",
        "hung up by operator",
    )
    wait_for(lambda: _outcomes(server)["canceled"] == 1, 5, "the canceled outcome counted")


def test_an_outbound_leg_carries_its_caller_id_and_its_tenant_to_the_sip_layer(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """outbound.caller_id is the INVITE's From (the callee checks it), and a REFER from the
    callee's side is judged by the tenant the call was placed for: followed (it was refused 403
    when an outbound leg had no tenant), the new call a session of its own."""
    desk_port = free_port()
    desk = Sipp("uas-answer.xml", "", tmp_path / "desk", port=desk_port).start()
    port = free_port()
    callee = Sipp(
        "uas-answer-refer.xml", "", tmp_path, port=port, extra=("-key", "desk_port", str(desk_port))
    ).start()
    server = server_factory(
        **ENV,
        VOICEGATE_OUTBOUND_CALLER_ID="sip:+4930555000@trunk.example.com",
        VOICEGATE_TRANSFER_ACCEPT_INBOUND_REFER="true",
        VOICEGATE_TRANSFER_ALLOWED_TARGETS="sip:desk@127.0.0.1:*",
    )
    call_id = _place(server, f"sip:callee@{LOOPBACK}:{port}")
    assert callee.wait() == 0, callee.errors()  # its From, the 202 and the NOTIFYs checked
    assert desk.wait() == 0, desk.errors()
    placed = _ended(server, call_id)
    assert placed["ended"]["terminal_state"] == "completed"
    referred = wait_for(
        lambda: [s for s in server.sessions() if s["meta"].get("referred_by") == call_id],
        10,
        "the referenced call's session",
    )[0]
    referred = _ended(server, referred["session_id"])
    assert referred["tenant"] == placed["tenant"] == "default"
    assert [e["type"] for e in referred["events"]][:2] == ["call_placed", "call_answered"]
    assert server.metric("voicegate_inbound_refers_total", result="followed") == 1
    assert server.metric("voicegate_outbound_calls_total", outcome="answered") == 2
