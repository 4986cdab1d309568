"""Bridged transfer end to end (voicegate/call/bridge.py, session/bridge.py): a real SIPp caller,
a real SIPp call-centre desk that checks the context headers on its INVITE
(``uas-callcentre.xml``, ``<ereg check_it="true">``), both sending RTP, and the RTP captured with
tcpdump to prove that audio flows both ways through voicegate's conference bridge."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.integration.harness import LOOPBACK, Server, ServerFactory, Sipp, free_port, wait_for
from tests.integration.heard import check_heard_last, cut_before, first_response
from tests.integration.resume_handles import away_session, check_sent_handle
from tests.integration.rtp_capture import Capture, RtpPacket

ENV = {"VOICEGATE_TRANSFER_ALLOWED_TARGETS": "sip:desk@127.0.0.1:*"}
LOUD = 500.0  # A-law speech frames of the sample capture; silence is under 50


def _desk(tmp_path: Path, scenario: str = "uas-callcentre.xml") -> tuple[Sipp, str]:
    port = free_port()
    # -trace_logs: the desk logs the resume handle its INVITE carried (_check_handle).
    log = tmp_path / "desk" / "desk-logs.log"
    extra = ("-trace_logs", "-log_file", str(log))
    sipp = Sipp(scenario, "", tmp_path / "desk", port=port, extra=extra).start()
    return sipp, f"sip:desk@{LOOPBACK}:{port}"


def _check_handle(server: Server, tmp_path: Path, session_id: str, transfers: int = 1) -> None:
    """The resume handle on the desk's INVITE is the session's current one in the store, kept
    as a digest only (docs/tenants.md: a new handle on every transfer)."""
    desk_log = tmp_path / "desk" / "desk-logs.log"
    check_sent_handle(server, desk_log, session_id, "resume handle sent on a bridge's INVITE")
    assert server.metric("voicegate_resume_handles_issued_total", reason="transfer") == transfers


# transfer.caller_id: the From of our legs to a target, which the desk logs (-trace_logs).
CALLER_ID = '"Acme Support" <sip:+4930555000@trunk.example.com>'


def _desk_saw_from(tmp_path: Path, name: str = "desk") -> list[str]:
    return re.findall(r"^From: (.*)$", (tmp_path / name / "desk-logs.log").read_text(), re.M)


def _answered_call(server: Server) -> str:
    calls = wait_for(
        lambda: [c for c in server.live_calls() if c["state"] == "answered" and c["media"]],
        10,
        "an answered call",
    )
    wait_for(lambda: any((c["frames_out"] or 0) > 10 for c in server.live_calls()), 10, "media")
    call_id: str = calls[0]["call_id"]
    return call_id


def _ended(server: Server, call_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        status, session = server.http(f"/v1/sessions/{call_id}")
        return session if status == 200 and session["ended"] else None

    return wait_for(ended, 30, "the session to end")


def _types(session: dict[str, Any]) -> list[str]:
    return [e["type"] for e in session["events"]]


def test_a_bridged_transfer_carries_audio_both_ways_until_the_caller_hangs_up(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV, VOICEGATE_TRANSFER_CALLER_ID=CALLER_ID)
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        desk, target = _desk(tmp_path)
        caller = Sipp("uac-transfer-bridged.xml", server.sip_target, tmp_path).start()
        call_id = _answered_call(server)
        status, body = server.post_json(
            f"/v1/calls/{call_id}/transfer", {"target": target, "mode": "bridge"}
        )
        assert status == 202, body
        assert body["mode"] == "bridge"
        wait_for(lambda: server.metric("voicegate_bridged_legs_active") == 2, 10, "the bridge")
        assert caller.wait() == 0, caller.errors()
        assert desk.wait() == 0, desk.errors()  # the context was on its INVITE; our BYE came
    finally:
        packets = capture.stop()
    session = _ended(server, call_id)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "bridged: the caller hung up",
    )
    assert _types(session)[-2:] == ["bridge_up", "caller_hangup"]
    started = [e for e in session["events"] if e["type"] == "transfer_started"]
    assert [e["payload"] for e in started] == [{"target": target, "mode": "bridge"}]
    assert server.metric("voicegate_bridged_legs_active") == 0
    assert server.metric("voicegate_transfers_total", mode="bridge", outcome="completed") == 1
    _check_handle(server, tmp_path, session["session_id"])
    assert _desk_saw_from(tmp_path) == [CALLER_ID]  # transfer.caller_id, as configured

    # What voicegate sent, by its own RTP port: the caller's leg started first (the greeting),
    # the desk's leg when the desk answered. The desk's leg carries only what the bridge gives
    # it (the caller's speech); after the bridge is up, the caller hears only the desk.
    ours = range(server.rtp_min, server.rtp_max + 1)
    sent: dict[int, list[RtpPacket]] = defaultdict(list)
    for packet in packets:
        if packet.src_port in ours and packet.dst_port not in ours and packet.payload_type == 8:
            sent[packet.src_port].append(packet)
    assert len(sent) == 2, {port: len(p) for port, p in sent.items()}
    to_caller, to_desk = sorted(sent.values(), key=lambda p: p[0].at)
    bridged_at = to_desk[0].at
    caller_speech_at_desk = [p for p in to_desk if p.rms > LOUD]
    desk_speech_at_caller = [p for p in to_caller if p.at > bridged_at + 0.5 and p.rms > LOUD]
    assert len(caller_speech_at_desk) >= 50, len(caller_speech_at_desk)  # a second of speech
    assert len(desk_speech_at_caller) >= 50, len(desk_speech_at_caller)


def test_a_refused_refer_falls_back_to_a_bridge_with_the_context_on_the_invite(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    desk, target = _desk(tmp_path)
    server = server_factory(
        **ENV, VOICEGATE_TRANSFER_FALLBACK="bridge", VOICEGATE_TRANSFER_DEFAULT_TARGET=target
    )
    caller = Sipp("uac-transfer-refused.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    status, body = server.post_json(f"/v1/calls/{call_id}/transfer", {"target": target})
    assert (status, body["mode"]) == (202, "blind")
    assert caller.wait() == 0, caller.errors()  # REFER declined with 603, then its BYE
    assert desk.wait() == 0, desk.errors()
    session = _ended(server, call_id)
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "bridged: the caller hung up",
    )
    fell_back = [e for e in session["events"] if e["type"] == "transfer_fell_back"]
    assert [e["payload"]["status"] for e in fell_back] == [603]
    assert "bridge_up" in _types(session)
    # The caller was not told a colleague could not be reached: the bridge reached one.
    said = [x["prompt"] for e in session["events"] for x in e["effects"] if x["kind"] == "say"]
    assert "transfer_failed" not in said
    assert server.metric("voicegate_transfers_total", mode="blind", outcome="refused") == 1
    assert server.metric("voicegate_transfers_total", mode="bridge", outcome="completed") == 1
    # The refused REFER carried a handle too: the bridge's INVITE has a newer one, the current.
    _check_handle(server, tmp_path, session["session_id"], transfers=2)


def test_a_bridge_without_a_free_slot_is_refused_up_front_and_changes_nothing(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**ENV, VOICEGATE_POOL_CALLS_PER_WORKER="1")
    caller = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    status, body = server.post_json(
        f"/v1/calls/{call_id}/transfer", {"target": "sip:desk@127.0.0.1:5", "mode": "bridge"}
    )
    assert status == 503, body
    assert body["error"].startswith("no free call slot for the bridge's leg")
    assert server.post(f"/v1/calls/{call_id}/hangup") == 202
    assert caller.wait() == 0, caller.errors()
    session = _ended(server, call_id)
    assert "transfer_started" not in _types(session)


def test_the_demo_agents_key_0_bridges_when_bridge_is_the_default_mode_and_the_target_ends_it(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    port = free_port()
    # This desk answers, talks for 5 s and hangs up itself.
    desk = Sipp("uas-answer.xml", "", tmp_path / "desk", port=port).start()
    target = f"sip:desk@{LOOPBACK}:{port}"
    server = server_factory(
        **ENV, VOICEGATE_TRANSFER_DEFAULT_MODE="bridge", VOICEGATE_TRANSFER_DEFAULT_TARGET=target
    )
    caller = Sipp("uac-transfer-key0-bridged.xml", server.sip_target, tmp_path)
    assert caller.run() == 0, caller.errors()  # our BYE came after the desk's
    assert desk.wait() == 0, desk.errors()
    (session,) = [s for s in server.sessions() if s["ended"]]
    assert (session["ended"]["terminal_state"], session["ended"]["reason"]) == (
        "completed",
        "bridged: the target hung up",
    )
    started = [e["payload"] for e in session["events"] if e["type"] == "transfer_started"]
    assert started == [{"target": target, "mode": "bridge"}]
    assert _types(session)[-2:] == ["bridge_up", "bridge_ended"]
    assert server.metric("voicegate_transfers_total", mode="bridge", outcome="completed") == 1


def test_a_bridge_the_api_starts_during_the_greeting_records_what_the_caller_heard_of_it(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    port = free_port()
    # This desk answers, talks for 5 s and hangs up itself; the caller never speaks (no
    # barge-in): only the transfer cuts the greeting.
    desk = Sipp("uas-answer.xml", "", tmp_path / "desk", port=port).start()
    server = server_factory(**ENV)
    caller = Sipp("uac-silent-caller.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)  # the greeting is playing
    status, body = server.post_json(
        f"/v1/calls/{call_id}/transfer",
        {"target": f"sip:desk@{LOOPBACK}:{port}", "mode": "bridge"},
    )
    assert status == 202, body
    assert desk.wait() == 0, desk.errors()
    assert caller.wait() == 0, caller.errors()  # our BYE, after the desk's
    session = _ended(server, call_id)
    assert session["ended"]["reason"] == "bridged: the target hung up"
    # The greeting's cut is in the log just before the transfer, with what the caller heard of
    # it (issue 35: it was not, and the handoff's heard_last was all null).
    cut = cut_before(session, "transfer_started")
    assert cut["type"] == "response_interrupted", cut
    assert cut["payload"]["response_id"] == first_response(session)
    assert _types(session).count("response_interrupted") == 1  # recorded once
    check_heard_last(server, call_id, cut)


def test_a_busy_target_takes_the_caller_back_to_the_agent_with_an_honest_line(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    port = free_port()
    desk = Sipp("uas-busy.xml", "", tmp_path / "desk", port=port).start()
    server = server_factory(**ENV)
    caller = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    status, body = server.post_json(
        f"/v1/calls/{call_id}/transfer",
        {"target": f"sip:desk@{LOOPBACK}:{port}", "mode": "bridge"},
    )
    assert status == 202, body
    assert desk.wait() == 0, desk.errors()
    finished = wait_for(
        lambda: [
            e
            for e in server.http(f"/v1/sessions/{call_id}")[1]["events"]
            if e["type"] == "transfer_finished"
        ],
        10,
        "the transfer to fail",
    )
    assert (finished[0]["payload"]["ok"], finished[0]["payload"]["status"]) == (False, 486)
    assert any(x == {"kind": "say", "prompt": "transfer_failed"} for x in finished[0]["effects"])
    status, call = server.http(f"/v1/calls/{call_id}")
    assert call["live"]["state"] == "answered"  # still with the agent
    # The agent took the caller back (on_transfer, on_resumed); no notice went astray.
    strays = [e for e in server.log_events() if e.get("event") == "agent.unknown_notice"]
    assert strays == [], strays
    assert server.post(f"/v1/calls/{call_id}/hangup") == 202
    assert caller.wait() == 0, caller.errors()
    assert server.metric("voicegate_transfers_total", mode="bridge", outcome="failed") == 1
    assert server.metric("voicegate_bridged_legs_active") == 0


# --- attended transfer (RFC 5589 section 7): a consult leg of ours, then REFER with Replaces ----


def _said(session: dict[str, Any]) -> list[str]:
    return [x["prompt"] for e in session["events"] for x in e["effects"] if x["kind"] == "say"]


def test_an_attended_transfer_consults_the_target_then_refers_with_replaces(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    target_leg, target = _desk(tmp_path, "uas-consult.xml")
    # No brief: the REFER goes as soon as the consult answered (the briefed form is below).
    server = server_factory(**ENV, VOICEGATE_TRANSFER_CONSULT_BRIEF="")
    caller = Sipp("uac-transfer-attended.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    status, body = server.post_json(
        f"/v1/calls/{call_id}/transfer", {"target": target, "mode": "attended"}
    )
    assert (status, body["mode"]) == (202, "attended")
    # The REFER with Replaces came only after the consult answered; the context was on the
    # consult INVITE; our BYEs ended both legs.
    assert caller.wait() == 0, caller.errors()
    assert target_leg.wait() == 0, target_leg.errors()
    # Away, not ended: the caller may come back with the handle (session/away.py).
    session = away_session(server, call_id)
    types = _types(session)
    assert types.index("transfer_started") < types.index("consult_answered")
    assert types.index("consult_answered") < types.index("transfer_finished")
    assert "transfer_consulting" in _said(session)  # the caller was told to hold
    assert server.metric("voicegate_transfers_total", mode="attended", outcome="completed") == 1
    _check_handle(server, tmp_path, session["session_id"])


def test_a_consult_that_fails_takes_the_caller_off_hold_back_to_the_agent(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    port = free_port()
    target_leg = Sipp("uas-busy.xml", "", tmp_path / "target", port=port).start()
    server = server_factory(**ENV)
    # This caller fails on any REFER: none may come when the consult failed.
    caller = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    status, body = server.post_json(
        f"/v1/calls/{call_id}/transfer",
        {"target": f"sip:desk@{LOOPBACK}:{port}", "mode": "attended"},
    )
    assert status == 202, body
    assert target_leg.wait() == 0, target_leg.errors()
    wait_for(
        lambda: "transfer_finished" in _types(server.http(f"/v1/sessions/{call_id}")[1]),
        10,
        "the consult to fail",
    )
    assert server.post(f"/v1/calls/{call_id}/hangup") == 202
    assert caller.wait() == 0, caller.errors()
    session = _ended(server, call_id)
    (finished,) = [e for e in session["events"] if e["type"] == "transfer_finished"]
    assert (finished["payload"]["ok"], finished["payload"]["status"]) == (False, 486)
    assert "consult_answered" not in _types(session)
    assert _said(session).count("transfer_consulting") == 1
    assert "transfer_failed" in _said(session)
    assert server.metric("voicegate_transfers_total", mode="attended", outcome="failed") == 1


def test_an_attended_transfer_briefs_the_person_and_hands_over_when_the_api_says_so(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """The person on the consult leg hears transfer.consult_brief from transfer.caller_id (the
    target checks the From with check_it); with "complete": "api" no REFER goes until
    POST .../transfer/complete, which a call-centre integration sends once its agent accepts."""
    target_leg, target = _desk(tmp_path, "uas-consult-briefed.xml")
    server = server_factory(**ENV, VOICEGATE_TRANSFER_CALLER_ID=CALLER_ID)
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        caller = Sipp("uac-transfer-attended.xml", server.sip_target, tmp_path).start()
        call_id = _answered_call(server)
        # "complete": "api" for this transfer (transfer.consult_complete stays after_brief).
        status, body = server.post_json(
            f"/v1/calls/{call_id}/transfer",
            {"target": target, "mode": "attended", "complete": "api"},
        )
        assert (status, body["mode"]) == (202, "attended")
        # Nothing to complete while the consult leg rings (its answer comes after 500 ms).
        assert server.post(f"/v1/calls/{call_id}/transfer/complete") == 409

        def consult() -> object:
            status, call = server.http(f"/v1/calls/{call_id}")
            return call["live"]["consult"] if status == 200 else None

        wait_for(lambda: consult() == "briefing", 10, "the brief")
        wait_for(lambda: consult() == "waiting", 15, "the brief to end")
        assert "consult_answered" in _types(server.http(f"/v1/sessions/{call_id}")[1])
        assert "transfer_finished" not in _types(server.http(f"/v1/sessions/{call_id}")[1])
        assert server.post(f"/v1/calls/{call_id}/transfer/complete") == 202
        assert caller.wait() == 0, caller.errors()  # the REFER with Replaces, then our BYE
        assert target_leg.wait() == 0, target_leg.errors()
    finally:
        packets = capture.stop()
    # Away, not ended: the caller may come back with the handle (session/away.py).
    session = away_session(server, call_id)
    assert server.metric("voicegate_transfers_total", mode="attended", outcome="completed") == 1
    _check_handle(server, tmp_path, session["session_id"])
    # What voicegate sent by RTP port: the caller's leg first (the greeting), the consult leg's
    # when the person answered, and on it the brief: speech, not the silence of an idle port.
    ours = range(server.rtp_min, server.rtp_max + 1)
    sent: dict[int, list[RtpPacket]] = defaultdict(list)
    for packet in packets:
        if packet.src_port in ours and packet.dst_port not in ours and packet.payload_type == 8:
            sent[packet.src_port].append(packet)
    assert len(sent) == 2, {port: len(p) for port, p in sent.items()}
    _to_caller, to_consult = sorted(sent.values(), key=lambda p: p[0].at)
    assert len([p for p in to_consult if p.rms > LOUD]) >= 50  # a second of the brief at least


def test_an_attended_transfer_the_api_cancels_takes_the_caller_back_and_ends_the_consult(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    target_leg, target = _desk(tmp_path, "uas-consult.xml")  # exits 0 on our BYE
    server = server_factory(
        **ENV, VOICEGATE_TRANSFER_CONSULT_BRIEF="", VOICEGATE_TRANSFER_CONSULT_COMPLETE="api"
    )
    # This caller fails on any REFER: none may come once the consultation is called off.
    caller = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    status, body = server.post_json(
        f"/v1/calls/{call_id}/transfer", {"target": target, "mode": "blind", "complete": "api"}
    )
    assert (status, body["field"]) == (400, "complete"), body  # attended only; nothing changed
    status, body = server.post_json(
        f"/v1/calls/{call_id}/transfer", {"target": target, "mode": "attended"}
    )
    assert status == 202, body
    wait_for(
        lambda: server.http(f"/v1/calls/{call_id}")[1]["live"]["consult"] == "waiting",
        10,
        "the consultation to wait for the API",
    )
    assert server.post(f"/v1/calls/{call_id}/transfer/cancel") == 202
    assert target_leg.wait() == 0, target_leg.errors()
    assert server.post(f"/v1/calls/{call_id}/transfer/cancel") == 409  # nothing left to cancel
    status, call = server.http(f"/v1/calls/{call_id}")
    assert (call["live"]["state"], call["live"]["consult"]) == ("answered", None)
    assert server.post(f"/v1/calls/{call_id}/hangup") == 202
    assert caller.wait() == 0, caller.errors()
    session = _ended(server, call_id)
    (finished,) = [e for e in session["events"] if e["type"] == "transfer_finished"]
    assert (finished["payload"]["ok"], finished["payload"]["status"]) == (False, 487)
    assert "transfer_failed" in _said(session)
    assert server.metric("voicegate_transfers_total", mode="attended", outcome="canceled") == 1
