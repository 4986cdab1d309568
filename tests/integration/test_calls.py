"""End to end: real SIPp callers against a real ``voicegate serve`` process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Server, ServerFactory, Sipp, wait_for


def _one_session(server: Server) -> dict[str, Any]:
    sessions = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]], 5, "the session to end"
    )
    assert len(server.sessions()) == 1, sessions
    return sessions[0]


def _types(session: dict[str, Any]) -> list[str]:
    return [e["type"] for e in session["events"]]


@pytest.mark.parametrize("transport", ["u1", "t1"])
def test_speech_and_dtmf_call_is_answered_listed_and_recorded(
    server: Server, tmp_path: Path, transport: str
) -> None:
    sipp = Sipp("uac-speech-dtmf.xml", server.sip_target, tmp_path, transport=transport).start()

    live = wait_for(
        lambda: [c for c in server.live_calls() if c["state"] == "answered"], 10, "a live call"
    )
    assert live[0]["codec"] == "PCMA"
    assert live[0]["codec_rate"] == 8000
    assert live[0]["rate"] == 16000  # the bridge's rate: PJSIP converts once, in C
    assert live[0]["transport"] == ("udp" if transport == "u1" else "tcp")
    # The caller's number is masked in the API (STYLE.md habit 10), the called user is not.
    assert live[0]["called_user"] == "service"
    assert "gate open" in live[0]["session_status"]

    assert sipp.wait() == 0, sipp.errors()
    wait_for(lambda: not server.live_calls(), 5, "the call to leave /v1/calls")

    session = _one_session(server)
    assert session["ended"]["terminal_state"] == "completed"
    assert session["ended"]["reason"] == "caller hung up"
    types = _types(session)
    assert types[:2] == ["call_offered", "call_answered"]
    assert types[-1] == "caller_hangup"
    # The caller's speech (one VAD turn) and four key presses are committed caller turns; the
    # greeting and read-backs are responses, and the speech barged in on the greeting.
    assert types.count("turn_committed") == 5
    assert "response_started" in types
    first_cut = next(e for e in session["events"] if e["type"] == "response_interrupted")
    assert 0 < first_cut["payload"]["heard_ms"] < 3000
    assert server.metric("voicegate_barge_ins_total", reason="speech", outcome="confirmed") == 1
    assert [e["seq"] for e in session["events"]] == list(range(1, len(types) + 1))
    assert server.metric("voicegate_calls_total", outcome="completed") == 1
    assert server.metric("voicegate_sessions_ended_total", terminal_state="completed") == 1
    assert server.metric("voicegate_calls_active") == 0
    assert server.metric("voicegate_dtmf_digits_total", method="rfc2833") == 4
    # 7 s of caller speech reached the media bridge, and the greeting/read-back went out.
    assert server.metric("voicegate_media_frames_total", direction="in") > 300
    assert server.metric("voicegate_media_frames_total", direction="out") > 100
    # Every media tick of the call measured how late the event loop let it run.
    assert server.metric("voicegate_event_loop_lag_seconds_count") > 50
    readbacks = [e for e in server.log_events() if e.get("event") == "demo.readback"]
    assert [e["count"] for e in readbacks] == [2]
    # The digits themselves never reach the log.
    assert '"digits"' not in server.log()


def test_caller_cancel_before_answer_is_recorded_canceled(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(VOICEGATE_SIP_ANSWER_AFTER_S="3")
    sipp = Sipp("uac-cancel-before-answer.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _one_session(server)
    assert session["ended"]["terminal_state"] == "canceled"
    assert session["ended"]["reason"] == "caller hung up before answer"
    assert "call_answered" not in _types(session)
    assert server.metric("voicegate_calls_total", outcome="canceled") == 1


def test_server_ends_the_call_when_the_caller_chooses_to(server: Server, tmp_path: Path) -> None:
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    session = _one_session(server)
    assert session["ended"]["terminal_state"] == "completed"
    assert session["ended"]["reason"] == "caller chose to end the call"
    assert _types(session)[-1] == "server_hangup"


def test_g722_call_runs_at_16_khz(server: Server, tmp_path: Path) -> None:
    sipp = Sipp("uac-g722.xml", server.sip_target, tmp_path).start()
    live = wait_for(
        lambda: [c for c in server.live_calls() if c["state"] == "answered"], 10, "a live call"
    )
    assert live[0]["codec"] == "G722"
    assert live[0]["codec_rate"] == 16000
    assert live[0]["rate"] == 16000
    assert sipp.wait() == 0, sipp.errors()
    assert _one_session(server)["ended"]["terminal_state"] == "completed"


def test_session_survives_a_restart(server_factory: ServerFactory, tmp_path: Path) -> None:
    server = server_factory()
    assert Sipp("uac-server-hangup.xml", server.sip_target, tmp_path).run() == 0
    before = _one_session(server)
    assert server.stop() == 0
    server.start()
    status, body = server.http(f"/v1/calls/{before['session_id']}")
    assert status == 200
    assert body["live"] is None
    assert body["session"] == f"/v1/sessions/{before['session_id']}"
    after = server.sessions()
    assert [s["events"] for s in after] == [before["events"]]
    assert after[0]["ended"] == before["ended"]


def test_unknown_ids_are_json_404s(server: Server) -> None:
    assert server.http("/v1/calls/nope") == (404, {"error": "no such call", "call_id": "nope"})
    assert server.http("/v1/sessions/nope") == (
        404,
        {"error": "no such session", "session_id": "nope"},
    )


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("terminal_state=connected", "terminal_state"),
        ("state=zombie", "state"),
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("cursor=%%%", "cursor"),
        ("colour=blue", "colour"),
    ],
)
def test_bad_session_filters_are_400_naming_the_parameter(
    server: Server, query: str, parameter: str
) -> None:
    status, body = server.http(f"/v1/sessions?{query}")
    assert status == 400
    assert body["parameter"] == parameter


def test_health_and_readiness(server: Server) -> None:
    status, health = server.http("/healthz")
    assert status == 200 and health["status"] == "ok"
    # The owner id of this incarnation: how a supervisor tells a restarted worker from the last.
    assert health["owner"].startswith("worker-0/")
    status, body = server.http("/readyz")
    assert status == 200
    assert body["sip_transports_up"] is True
    assert server.metric("voicegate_sip_transports_up") == 1
    # The verified pointer copy is in use on this build of pjsua2.
    assert server.metric("voicegate_fast_frame_copy") == 1
    # So is the C media port: built at install, and it passed its check on the bridge.
    assert server.metric("voicegate_c_media_port") == 1


def test_max_duration_deadline_ends_the_call_timed_out_with_a_notice(
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    server = server_factory(VOICEGATE_SESSION_MAX_DURATION_S="3")
    sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path, timeout_s=40)
    # The caller stays on the line; the deadline ends the call with a BYE (SIPp's scenario
    # fails without one).
    assert sipp.run() == 0, sipp.errors()
    session = _one_session(server)
    ended = session["ended"]
    assert (ended["terminal_state"], ended["stage"]) == ("timed_out", "max_duration")
    last = session["events"][-1]
    assert last["type"] == "deadline_fired"
    assert last["payload"] == {"name": "max_duration", "generation": 0}
    kinds = [effect["kind"] for effect in last["effects"]]
    # Seed 000: a timeout is a transition with effects, in this order.
    assert kinds.index("clear_playout") < kinds.index("say") < kinds.index("release_media")
    assert kinds.index("release_media") < kinds.index("hang_up") < kinds.index("finished")
    assert {"kind": "say", "prompt": "timed_out"} in last["effects"]
    assert ended["at"] - session["events"][1]["at"] >= 3
    assert server.metric("voicegate_calls_total", outcome="timed_out") == 1


def test_no_input_asks_once_then_ends_timed_out(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(
        VOICEGATE_SESSION_NO_INPUT_S="3", VOICEGATE_SESSION_NO_INPUT_GRACE_S="2"
    )
    sipp = Sipp("uac-silent-caller.xml", server.sip_target, tmp_path, timeout_s=40)
    assert sipp.run() == 0, sipp.errors()  # SIPp got the BYE
    session = _one_session(server)
    ended = session["ended"]
    assert (ended["terminal_state"], ended["stage"]) == ("timed_out", "no_input")
    fired = [e for e in session["events"] if e["type"] == "deadline_fired"]
    assert [e["payload"]["name"] for e in fired] == ["no_input", "no_input_final"]
    assert {"kind": "say", "prompt": "still_there"} in fired[0]["effects"]
    assert {"kind": "say", "prompt": "goodbye"} in fired[1]["effects"]
    assert 1.8 <= fired[1]["at"] - fired[0]["at"] <= 2.5
    assert server.metric("voicegate_calls_total", outcome="timed_out") == 1
    # A caller who never speaks never quickens the media tick: every tick was a steady one.
    assert server.metric("voicegate_media_ticks_total", pace="steady") > 50
    assert server.metric("voicegate_media_ticks_total", pace="barge_in") == 0
    # Each caller frame's pipeline time is counted in process and written about once a second
    # (voicegate/observe/batched.py), and the rest when the last call ends.
    frames_in = server.metric("voicegate_media_frames_total", direction="in")
    piped = server.metric("voicegate_frame_pipeline_seconds_count")
    assert 100 <= piped <= frames_in, (piped, frames_in)
