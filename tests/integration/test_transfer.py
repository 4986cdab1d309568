"""Blind transfer end to end (RFC 3515, RFC 5589 section 6): real SIPp legs playing the
transferee against a real ``voicegate serve``. Each records the session's terminal state and
what the transfer did; the scenarios' headers say what the server must do on the wire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from session.state import AWAY_STATUS
from tests.integration.harness import Provider, Server, ServerFactory, Sipp, free_port, wait_for
from tests.integration.heard import check_heard_last, cut_before, first_response
from tests.integration.resume_handles import away_session, check_sent_handle
from tests.secret_audit import AUDIT

CC = "sip:desk@cc.example.com"
ENV = {
    "VOICEGATE_TRANSFER_ALLOWED_TARGETS": "sip:*@cc.example.com",
    "VOICEGATE_TRANSFER_DEFAULT_TARGET": CC,
}


def _one_session(server: Server) -> dict[str, Any]:
    sessions = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]], 10, "the session to end"
    )
    assert len(server.sessions()) == 1, sessions
    return sessions[0]


def _events(session: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in session["events"] if e["type"] == kind]


def _said(session: dict[str, Any]) -> list[str]:
    return [x["prompt"] for e in session["events"] for x in e["effects"] if x["kind"] == "say"]


def _answered_call(server: Server) -> str:
    calls = wait_for(
        lambda: [c for c in server.live_calls() if c["state"] == "answered" and c["media"]],
        10,
        "an answered call",
    )
    call_id: str = calls[0]["call_id"]
    # The agent has started (its greeting is playing) once the call has frames going out.
    wait_for(lambda: any((c["frames_out"] or 0) > 10 for c in server.live_calls()), 10, "media out")
    return call_id


def test_a_blind_transfer_completes_after_the_final_notify_with_the_context_on_the_wire(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV)
    sipp_log = tmp_path / "sipp-logs.log"
    sipp = Sipp(
        "uac-transfer-blind.xml",
        server.sip_target,
        tmp_path,
        extra=("-trace_logs", "-log_file", str(sipp_log)),
    )
    assert sipp.run() == 0, sipp.errors()  # the Refer-To's UUI and X- headers were checked there
    # Away, not ended: the caller may come back with the handle until it expires, then the
    # session ends completed / transferred (session/away.py; tests/unit/test_session_away.py).
    session = away_session(server)
    # The resume handle on the wire is the one the store holds, as a digest only: the session's
    # current handle, issued at the transfer, superseding the one issued when it started.
    check_sent_handle(server, sipp_log, session["session_id"], "resume handle sent on a REFER")
    assert server.metric("voicegate_resume_handles_issued_total", reason="start") == 1
    assert server.metric("voicegate_resume_handles_issued_total", reason="transfer") == 1
    assert [e["payload"]["target"] for e in _events(session, "transfer_started")] == [CC]
    assert [e["payload"]["status"] for e in _events(session, "transfer_progress")] == [100, 100]
    (finished,) = _events(session, "transfer_finished")
    assert finished["payload"]["ok"] is True and finished["payload"]["status"] == 200
    assert any(x["kind"] == "hang_up" for x in finished["effects"])  # our BYE, after the 200
    assert server.metric("voicegate_transfers_total", mode="blind", outcome="completed") == 1
    assert server.metric("voicegate_transfer_notifies_total", status_class="2xx", final="true") == 1
    status, handoff = server.http(f"/v1/sessions/{session['session_id']}/handoff")
    assert status == 200
    assert handoff["why"] == "transferred" and handoff["state"] is None
    assert handoff["away_until"] == finished["at"] + 600.0  # session.resume_ttl_s
    assert handoff["transfer"] == {"target": CC, "last_status": 200}
    assert handoff["unknown"] == []
    # Our BYE was answered; the REFER's subscription keeps the dialog a while. It is looked at
    # again (telephony/dialog_end.py) and left be: not ended locally, not counted as unanswered.
    lingered = wait_for(
        lambda: [e for e in server.log_events() if e.get("event") == "sip.dialog_lingers"],
        15,
        "the dialog looked at again after our answered BYE",
    )
    assert "BYE was answered" in lingered[0]["why"]
    assert server.metric("voicegate_dialogs_ended_locally_total") == 0
    assert not [e for e in server.log_events() if e.get("event") == "sip.dialog_ended_locally"]


def test_a_blind_transfer_the_api_starts_during_the_greeting_records_what_the_caller_heard(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV)
    sipp = Sipp("uac-transfer-blind-api.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)  # the greeting is playing
    status, body = server.post_json(f"/v1/calls/{call_id}/transfer", {"target": CC})
    assert status == 202, body
    assert sipp.wait() == 0, sipp.errors()
    session = away_session(server)
    # The transfer cut the greeting: what the caller heard of it is written just before the
    # transfer (issue 35: it was not written at all, and the handoff's heard_last was null).
    cut = cut_before(session, "transfer_started")
    assert cut["type"] == "response_interrupted", cut
    assert cut["payload"]["response_id"] == first_response(session)
    assert len(_events(session, "response_interrupted")) == 1  # recorded once
    handoff = check_heard_last(server, session["session_id"], cut)
    assert handoff["why"] == "transferred"


def test_an_away_session_ends_within_a_heartbeat_of_its_time(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    # docs/transfer.md, "When an away session ends": every worker ends them on its heartbeats.
    server = server_factory(
        **ENV, VOICEGATE_SESSION_RESUME_TTL_S="30", VOICEGATE_SESSION_HEARTBEAT_S="1"
    )
    sipp = Sipp("uac-transfer-blind.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session_id = away_session(server)["session_id"]

    def ended() -> list[Any] | None:
        # Straight from the store: an API read would end it at once (the reaper runs on read).
        store = server.open_store()
        try:
            summary = store.get(session_id)
            return store.events(session_id) if summary and summary.terminal_state else None
        finally:
            store.close()

    events = wait_for(ended, 45, "the away session to end on its own")
    (finished,) = [e for e in events if e.type == "transfer_finished"]
    (expired,) = [e for e in events if e.type == "away_expired"]
    away_until = finished.at + 30.0  # session.resume_ttl_s
    assert away_until <= expired.at <= away_until + 1.0 + 1.5, (away_until, expired.at)


def test_a_declined_refer_from_the_api_gives_the_caller_back_to_the_agent(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV)
    sipp = Sipp("uac-transfer-refused.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    status, body = server.post_json(f"/v1/calls/{call_id}/transfer", {"target": CC})
    assert status == 202, body
    assert body == {
        "call_id": call_id,
        "transferring": True,
        "target": CC,
        "mode": "blind",
        "session": f"/v1/sessions/{call_id}",
    }
    assert sipp.wait() == 0, sipp.errors()
    session = _one_session(server)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "caller hung up",
    )
    (finished,) = _events(session, "transfer_finished")
    assert (finished["payload"]["ok"], finished["payload"]["status"]) == (False, 603)
    assert "transfer_failed" in _said(session)
    assert server.metric("voicegate_transfers_total", mode="blind", outcome="refused") == 1


def test_a_final_notify_486_gives_the_caller_back_to_the_agent(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV)
    sipp = Sipp("uac-transfer-notify-486.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _one_session(server)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "caller hung up",
    )
    (finished,) = _events(session, "transfer_finished")
    assert (finished["payload"]["ok"], finished["payload"]["status"]) == (False, 486)
    assert "transfer_failed" in _said(session)
    strays = [e for e in server.log_events() if e.get("event") == "agent.unknown_notice"]
    assert strays == [], strays  # the agent took the caller back as told, no notice astray
    assert server.metric("voicegate_transfers_total", mode="blind", outcome="failed") == 1
    assert server.metric("voicegate_transfer_notifies_total", status_class="4xx", final="true") == 1


def test_no_final_notify_within_the_guard_gives_the_caller_back(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV, VOICEGATE_TRANSFER_NOTIFY_TIMEOUT_S="2")
    sipp = Sipp("uac-transfer-no-notify.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _one_session(server)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "caller hung up",
    )
    assert not _events(session, "transfer_finished")
    guard = [
        e for e in _events(session, "deadline_fired") if e["payload"]["name"] == "transfer_notify"
    ]
    assert len(guard) == 1 and "transfer_failed" in _said(session)
    assert server.metric("voicegate_transfers_total", mode="blind", outcome="timed_out") == 1


def test_a_bye_racing_the_final_notify_ends_the_session_once(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV)
    sipp = Sipp("uac-transfer-bye-race.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()  # no BYE of ours reached the gone dialog
    # Whichever the server saw first: the final NOTIFY (away: the caller may come back with
    # the handle), or the BYE (ended completed, once).
    session = wait_for(
        lambda: [
            s for s in server.sessions() if s["ended"] or s["status"].startswith(AWAY_STATUS)
        ],
        10,
        "the transfer to end",
    )[0]
    enders = [e for e in session["events"] if any(x["kind"] == "finished" for x in e["effects"])]
    if session["ended"] is None:
        assert [e["type"] for e in session["events"]][-1] == "transfer_finished"
        assert not enders
    else:
        assert session["ended"]["terminal_state"] == "completed"
        assert session["ended"]["reason"] == "caller left during transfer (last NOTIFY 100)"
        assert len(enders) == 1


def test_an_inbound_refer_is_refused_by_default(server: Server, tmp_path: Path) -> None:
    sipp = Sipp("uac-inbound-refer.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()  # 403, and the call went on
    session = _one_session(server)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "caller hung up",
    )
    assert server.metric("voicegate_inbound_refers_total", result="refused") == 1
    assert server.metric("voicegate_inbound_refers_total", result="followed") == 0
    assert "19005550100" not in server.log()  # masked: only the last digits are logged


def test_the_api_refuses_a_target_outside_allowed_targets_and_changes_nothing(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV)
    sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    path = f"/v1/calls/{call_id}/transfer"
    status, body = server.post_json(path, {"target": "sip:+19005550100@premium.example"})
    assert status == 403, body
    assert body["field"] == "target" and body["allowed_targets"] == ["sip:*@cc.example.com"]
    status, body = server.post_json(path, {"target": CC, "mode": "warm"})
    assert (status, body["field"]) == (400, "mode")
    status, body = server.post_json("/v1/calls/nope/transfer", {"target": CC})
    assert (status, body["call_id"]) == (404, "nope")
    assert server.post(f"/v1/calls/{call_id}/hangup") == 202
    assert sipp.wait() == 0, sipp.errors()
    session = _one_session(server)
    assert session["ended"]["terminal_state"] == "canceled"
    assert not _events(session, "transfer_started")


def test_a_transfer_during_a_payment_never_sends_the_payment_again(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    provider = Provider(tmp_path / "provider").start()
    try:
        # The charge takes 3 s at the provider: the transfer comes while it is on the wire.
        provider.set_faults(charge_delay_s=3.0)
        server = server_factory(**ENV, **provider.tool_env(timeout_s=5.0))
        sipp = Sipp("uac-transfer-during-payment.xml", server.sip_target, tmp_path).start()
        call_id = _answered_call(server)
        wait_for(
            lambda: any(
                e["type"] == "tool_request_sent"
                for e in server.http(f"/v1/sessions/{call_id}")[1]["events"]
            ),
            20,
            "the charge on the wire",
        )
        status, body = server.post_json(f"/v1/calls/{call_id}/transfer", {"target": CC})
        assert status == 202, body
        assert sipp.wait() == 0, sipp.errors()
        session = _one_session(server)
        assert session["ended"]["terminal_state"] == "needs_human"
        assert session["ended"]["stage"] == "transfer"
        # The provider finishes the one charge it got; nothing sends it again.
        wait_for(lambda: provider.charges(), 10, "the provider to finish the charge")
        assert len(provider.charges()) == 1
        assert len(_events(session, "tool_request_sent")) == 1
        status, handoff = server.http(f"/v1/sessions/{call_id}/handoff")
        assert status == 200
        (charge,) = handoff["tool_calls"]
        assert charge["tool"] == "charge" and charge["arguments"]["amount_cents"] == 59
        assert handoff["unknown"] == [f"whether tool call {charge['key']} (charge) took effect"]
    finally:
        provider.stop()


def test_needs_human_hands_the_caller_to_the_human_target_instead_of_hanging_up(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    provider = Provider(tmp_path / "provider").start()
    try:
        # The charge's outcome stays unknown: the session ends needs_human (reconciliation).
        provider.set_faults(charge_delay_s=6.0, status_unknown=True)
        server = server_factory(
            **ENV,
            **provider.tool_env(timeout_s=1.0),
            VOICEGATE_TRANSFER_HUMAN_TARGET="sip:supervisor@cc.example.com",
            VOICEGATE_SESSION_RECONCILE_TIMEOUT_S="2",
            VOICEGATE_SESSION_STATUS_ATTEMPTS="3",
        )
        # The same transferee leg: it gets the REFER (context checked), NOTIFYs 100 and 200, and
        # only then our BYE.
        sipp = Sipp("uac-transfer-during-payment.xml", server.sip_target, tmp_path)
        assert sipp.run() == 0, sipp.errors()
        session = _one_session(server)
        ended = session["ended"]
        assert (ended["terminal_state"], ended["stage"]) == ("needs_human", "reconciliation")
        handoffs = [e for e in server.log_events() if e.get("event") == "transfer.handoff"]
        assert len(handoffs) == 1 and handoffs[0]["call_id"] == session["session_id"]
        assert server.metric("voicegate_transfers_total", mode="blind", outcome="completed") == 1
        wait_for(lambda: len(provider.charges()) == 1, 10, "the slow charge to land")
    finally:
        provider.stop()


# What uac-transferred-in.xml sends that must never be logged: the caller's number in an X-
# header (only its masked form is recorded) and a resume handle (never recorded at all).
AUDIT.register("+15551234567", "caller number", "sipp-scenarios/uac-transferred-in.xml")


def test_a_call_transferred_in_records_the_centres_context_in_a_new_session(
    server: Server, tmp_path: Path
) -> None:
    sipp = Sipp("uac-transferred-in.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _one_session(server)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "caller hung up",
    )
    meta = session["meta"]
    assert meta["context"] == {
        "User-to-User": "43432D31323334;encoding=hex;purpose=isdn-uui",
        "X-Genesys-Queue": "billing",
        "X-Caller-Number": "+********567",
    }
    assert meta["context_dropped"] == {"X-Long-Note": "longer than 256 characters"}
    offered = [e for e in server.log_events() if e.get("event") == "call.offered"]
    assert offered[0]["context_headers"] == ["User-to-User", "X-Caller-Number", "X-Genesys-Queue"]


# --- inbound REFER followed (RFC 3515 section 2.4.2): a referenced new call with a session ----

REFER_ENV = {
    "VOICEGATE_TRANSFER_ACCEPT_INBOUND_REFER": "true",
    "VOICEGATE_TRANSFER_ALLOWED_TARGETS": "sip:desk@127.0.0.1:*",
}


def _two_ended_sessions(server: Server) -> list[dict[str, Any]]:
    """The referring session and the referenced call's, oldest first, once both have ended."""
    return wait_for(
        lambda: (lambda all: all if len(all) == 2 and all[1]["ended"] else None)(
            [s for s in server.sessions() if s["ended"]]
        ),
        20,
        "both sessions to end",
    )


def test_an_allowed_inbound_refer_is_followed_by_a_new_call_with_its_own_session(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    port = free_port()
    # The referenced call's callee: answers, talks for 5 s, hangs up.
    desk = Sipp("uas-answer.xml", "", tmp_path / "desk", port=port).start()
    server = server_factory(**REFER_ENV)
    caller = Sipp(
        "uac-inbound-refer-followed.xml",
        server.sip_target,
        tmp_path,
        extra=("-key", "desk_port", str(port)),
    )
    assert caller.run() == 0, caller.errors()  # 202, NOTIFYs up to the new call's 200, its BYE
    assert desk.wait() == 0, desk.errors()
    referring, session = _two_ended_sessions(server)
    assert (referring["ended"]["terminal_state"], referring["ended"]["reason"]) == (
        "completed",
        "caller hung up",
    )
    assert session["meta"]["referred_by"] == referring["session_id"]
    assert session["meta"]["direction"] == "outbound"
    assert session["tenant"] == "default"
    types = [e["type"] for e in session["events"]]
    assert types[:2] == ["call_placed", "call_answered"], types
    assert session["ended"]["terminal_state"] == "completed"
    assert server.metric("voicegate_inbound_refers_total", result="followed") == 1
    assert server.metric("voicegate_outbound_calls_total", outcome="answered") == 1
