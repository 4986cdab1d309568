"""Dropped media end to end: real RTP gaps from SIPp against the server's media-health monitor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.harness import Server, ServerFactory, Sipp, wait_for
from tests.integration.heard import check_heard_last, cut_before

PRODUCT_GAP = {"VOICEGATE_MEDIA_GAP_THRESHOLD_S": "1"}


def _ended(server: Server) -> dict[str, Any]:
    (session,) = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]] or None, 15, "the session to end"
    )
    return session


def _types(session: dict[str, Any]) -> list[str]:
    return [e["type"] for e in session["events"]]


def _effects(session: dict[str, Any], event_type: str) -> list[dict[str, Any]]:
    return [x for e in session["events"] if e["type"] == event_type for x in e["effects"]]


def test_a_5_s_gap_recovers_with_the_dialog_intact(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**PRODUCT_GAP)
    sipp = Sipp("uac-media-gap-short.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()  # no BYE from the server: the dialog stayed up
    session = _ended(server)
    types = _types(session)
    assert types.count("media_lost") == 1 and types.count("media_restored") == 1
    lost = next(e for e in session["events"] if e["type"] == "media_lost")
    restored = next(e for e in session["events"] if e["type"] == "media_restored")
    # 5 s without RTP, detected after the 1 s threshold (polled every 200 ms).
    assert 3.5 <= restored["at"] - lost["at"] <= 5.5
    # The gap cut the agent's response to the caller's turn (the menu, playing when the RTP
    # stopped): what the caller heard of it is written just before media_lost (issue 35).
    cut = cut_before(session, "media_lost")
    assert cut["type"] == "response_interrupted", cut
    assert cut["payload"]["response_id"] == _last_started_before(session, lost)
    kinds = [x["kind"] for x in lost["effects"]]
    # One step: freeze, cut, new generation, recovery with its deadline.
    assert "clear_playout" in kinds and "start_recovery" in kinds
    assert {"kind": "gate_changed", "old": "open", "new": "frozen", "frozen_s": 0.0} in lost[
        "effects"
    ]
    finished = [x for x in restored["effects"] if x["kind"] == "recovery_finished"]
    assert [f["outcome"] for f in finished] == ["recovered"]
    assert any(x["kind"] == "gate_changed" and x["new"] == "open" for x in restored["effects"])
    assert session["ended"]["terminal_state"] == "completed"
    assert server.metric("voicegate_recoveries_total", kind="media", outcome="recovered") == 1
    assert server.metric("voicegate_gate_frozen_seconds_total") >= 3.5


def _last_started_before(session: dict[str, Any], event: dict[str, Any]) -> str:
    started = [
        e["payload"]["response_id"]
        for e in session["events"]
        if e["type"] == "response_started" and e["seq"] < event["seq"]
    ]
    assert started, _types(session)
    return started[-1]


def test_a_30_s_gap_ends_timed_out_with_a_bye(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    # Callbacks off: the ending comes at the deadline itself (test_callback.py has the window).
    server = server_factory(**PRODUCT_GAP, VOICEGATE_SESSION_CALLBACK_WINDOW_S="0")
    sipp = Sipp("uac-media-gap-long.xml", server.sip_target, tmp_path, timeout_s=80)
    assert sipp.run() == 0, sipp.errors()  # SIPp got the server's BYE
    session = _ended(server)
    ended = session["ended"]
    assert (ended["terminal_state"], ended["stage"]) == ("timed_out", "recovery")
    assert "media not recovered within 20 s" in ended["reason"]
    lost = next(e for e in session["events"] if e["type"] == "media_lost")
    fired = session["events"][-1]
    assert fired["type"] == "deadline_fired" and fired["payload"]["name"] == "recovery"
    assert 19.5 <= fired["at"] - lost["at"] <= 21.5
    kinds = [x["kind"] for x in fired["effects"]]
    assert kinds.index("say") < kinds.index("release_media") < kinds.index("hang_up")
    # The ladder of honesty: a short "reconnecting" line after about 2 s of trouble.
    assert {"kind": "say", "prompt": "reconnecting"} in _effects(session, "deadline_fired")
    assert server.metric("voicegate_recoveries_total", kind="media", outcome="timed_out") == 1
    assert server.metric("voicegate_deadline_endings_total", deadline="recovery") == 1
    assert server.metric("voicegate_media_gaps_total") == 1


def test_a_bye_during_a_gap_cancels_the_recovery_at_once(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**PRODUCT_GAP)
    sipp = Sipp("uac-bye-during-gap.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _ended(server)
    ended = session["ended"]
    assert (ended["terminal_state"], ended["reason"]) == (
        "canceled",
        "caller hung up during recovery",
    )
    hangup = session["events"][-1]
    assert hangup["type"] == "caller_hangup"
    kinds = [x["kind"] for x in hangup["effects"]]
    assert "recovery_finished" in kinds and "cancel_timer" in kinds
    finished = next(x for x in hangup["effects"] if x["kind"] == "recovery_finished")
    assert finished["outcome"] == "canceled"
    assert server.metric("voicegate_recoveries_total", kind="media", outcome="canceled") == 1


def test_a_handover_reinvite_keeps_the_call_and_moves_the_rtp(
    server: Server, tmp_path: Path
) -> None:
    from tests.integration.rtp_capture import Capture

    # SIPp's -mp port is picked by the harness; the scenario moves its media to that port + 2.
    sipp = Sipp("uac-reinvite-handover.xml", server.sip_target, tmp_path)
    args = sipp.args()
    media_port = int(args[args.index("-mp") + 1])
    low, high = min(server.rtp_min, media_port), max(server.rtp_max, media_port + 2)
    capture = Capture(tmp_path / "rtp.pcap", low, high)
    try:
        sipp.args = lambda: args  # type: ignore[method-assign]
        assert sipp.run() == 0, sipp.errors()  # the re-INVITE got its 200 and the call went on
    finally:
        packets = capture.stop()
    session = _ended(server)
    types = _types(session)
    assert types.count("reinvite_started") == 1 and types.count("reinvite_finished") == 1
    started = next(e for e in session["events"] if e["type"] == "reinvite_started")
    finished = next(e for e in session["events"] if e["type"] == "reinvite_finished")
    # The re-INVITE came during the greeting, and the caller hung up during the answer to their
    # turn: each cut is written just before the step that made it, with what the caller heard
    # (issue 35), and the last one is the handoff's heard_last.
    cut = cut_before(session, "reinvite_started")
    assert cut["type"] == "response_interrupted", cut
    assert cut["payload"]["response_id"] == _last_started_before(session, started)
    hangup = session["events"][-1]
    assert hangup["type"] == "caller_hangup", types
    last_cut = cut_before(session, "caller_hangup")
    assert last_cut["type"] == "response_interrupted", last_cut
    assert last_cut["payload"]["response_id"] == _last_started_before(session, hangup)
    check_heard_last(server, session["session_id"], last_cut)
    assert [x["outcome"] for x in finished["effects"] if x["kind"] == "recovery_finished"] == [
        "recovered"
    ]
    assert session["ended"]["terminal_state"] == "completed"
    # The cut response never comes back: the next response is a new one, in a newer generation.
    cut_generation = next(
        x["generation"] for x in started["effects"] if x["kind"] == "clear_playout"
    )
    later = [
        e
        for e in session["events"]
        if e["type"] == "response_started" and e["seq"] > finished["seq"]
    ]
    assert later, "the agent said something after the handover"
    bound = [x for e in later for x in e["effects"] if x["kind"] == "bind_response"]
    assert all(b["generation"] >= cut_generation for b in bound)
    assert server.metric("voicegate_stale_frames_dropped_total") == 0
    # RTP from the server went to the old port before the handover and to the new one after.
    server_ports = range(server.rtp_min, server.rtp_max + 1)
    sent = [p for p in packets if p.src_port in server_ports and p.payload_type in (8, 101)]
    switch = min(p.at for p in sent if p.dst_port == media_port + 2)
    assert any(p.dst_port == media_port for p in sent if p.at < switch)
    assert all(p.dst_port == media_port + 2 for p in sent if p.at > switch + 0.1)


def test_a_hold_longer_than_the_gap_threshold_is_not_a_media_failure(
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    server = server_factory(**PRODUCT_GAP)
    sipp = Sipp("uac-hold-unhold.xml", server.sip_target, tmp_path).start()
    wait_for(lambda: [c for c in server.live_calls() if c.get("media") == "held"], 20, "held")
    assert sipp.wait() == 0, sipp.errors()
    session = _ended(server)
    types = _types(session)
    assert "media_lost" not in types  # 4 s of silence on hold is not a gap
    assert types.count("reinvite_finished") == 2
    assert session["ended"]["terminal_state"] == "completed"
    holds = [e for e in server.log_events() if e.get("event") == "call.media_health"]
    assert [e["health"] for e in holds][:2] == ["held", "flowing"]


def test_a_gap_whose_dialog_is_gone_ends_failed_at_the_first_probe(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    # The caller's RTP stops and its dialog answers the in-dialog OPTIONS with 481: the session
    # ends failed (stage signaling) at that answer, long before the 20 s recovery deadline.
    server = server_factory(**PRODUCT_GAP)
    sipp = Sipp("uac-media-gap-probe-481.xml", server.sip_target, tmp_path, timeout_s=40)
    assert sipp.run() == 0, sipp.errors()  # one OPTIONS, one 481, then nothing from the session
    session = _ended(server)
    ended = session["ended"]
    assert (ended["terminal_state"], ended["stage"]) == ("failed", "signaling")
    assert "481" in ended["reason"]
    lost = next(e for e in session["events"] if e["type"] == "media_lost")
    attempts = [
        x for x in _effects(session, "recovery_retry_due") if x["kind"] == "attempt_recovery"
    ]
    assert attempts, "the recovery made an attempt: it probed the dialog"
    (probed,) = [e for e in session["events"] if e["type"] == "recovery_probed"]
    assert probed["payload"]["status"] == 481
    assert probed["at"] - lost["at"] < 10  # the first attempt's probe, not the 20 s deadline
    kinds = [x["kind"] for x in probed["effects"]]
    assert "hang_up" not in kinds and "say" not in kinds  # nothing sent to a dialog that is gone
    assert [x["outcome"] for x in probed["effects"] if x["kind"] == "recovery_finished"] == [
        "failed"
    ]
    assert session["events"][-1]["type"] == "recovery_probed"  # the dialog's end changed nothing
    assert server.metric("voicegate_recoveries_total", kind="media", outcome="failed") == 1
    assert server.metric("voicegate_sessions_ended_total", terminal_state="failed") == 1


def test_the_readme_scenarios_answer_the_probes_at_the_product_defaults(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    # SIPp sends RTP only while it plays a capture: at the product's 1 s gap threshold the
    # silences between its steps are media gaps, and the server probes the dialog. Every uac-*
    # scenario answers those OPTIONS (SIPp would otherwise abort the call on them).
    server = server_factory(**PRODUCT_GAP)
    sipp = Sipp("uac-speech-dtmf.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _ended(server)
    probes = [e["payload"] for e in session["events"] if e["type"] == "recovery_probed"]
    assert probes and all(p["status"] == 200 for p in probes)
