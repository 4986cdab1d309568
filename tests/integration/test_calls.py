"""End to end: real SIPp callers against a real ``voicegate serve`` process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import Server, Sipp, wait_for


def _one_record(server: Server) -> dict[str, object]:
    records = server.records()
    assert len(records) == 1, records
    return records[0]


@pytest.mark.parametrize("transport", ["u1", "t1"])
def test_speech_and_dtmf_call_is_answered_listed_and_recorded(
    server: Server, tmp_path: Path, transport: str
) -> None:
    sipp = Sipp("uac-speech-dtmf.xml", server.sip_target, tmp_path, transport=transport).start()

    live = wait_for(
        lambda: [c for c in server.live_calls() if c["state"] == "answered"], 10, "a live call"
    )
    assert live[0]["codec"] == "PCMA"
    assert live[0]["rate"] == 8000
    assert live[0]["transport"] == ("udp" if transport == "u1" else "tcp")
    # The caller's number is masked in the API (STYLE.md habit 10), the called user is not.
    assert live[0]["called_user"] == "service"

    assert sipp.wait() == 0, sipp.errors()
    wait_for(lambda: not server.live_calls(), 5, "the call to leave /v1/calls")

    record = _one_record(server)
    assert record["terminal_state"] == "completed"
    assert record["reason"] == "caller hung up"
    assert record["answered_at"] is not None
    assert record["ended_at"] >= record["answered_at"]
    assert server.metric("voicegate_calls_total", outcome="completed") == 1
    assert server.metric("voicegate_calls_active") == 0
    assert server.metric("voicegate_dtmf_digits_total", method="rfc2833") == 4
    # 7 s of caller speech reached the media bridge, and the greeting/read-back went out.
    assert server.metric("voicegate_media_frames_total", direction="in") > 300
    assert server.metric("voicegate_media_frames_total", direction="out") > 100
    readbacks = [e for e in server.log_events() if e.get("event") == "demo.readback"]
    assert [e["count"] for e in readbacks] == [2]
    # The digits themselves never reach the log.
    assert '"digits"' not in server.log()


def test_caller_cancel_before_answer_is_recorded_canceled(server_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(VOICEGATE_SIP_ANSWER_AFTER_S="3")
    sipp = Sipp("uac-cancel-before-answer.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    wait_for(lambda: server.records() and server.records()[0]["terminal_state"], 5, "the record")
    record = _one_record(server)
    assert record["terminal_state"] == "canceled"
    assert record["reason"] == "caller hung up before answer"
    assert record["answered_at"] is None
    assert server.metric("voicegate_calls_total", outcome="canceled") == 1


def test_server_ends_the_call_when_the_caller_chooses_to(server: Server, tmp_path: Path) -> None:
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    wait_for(lambda: server.records()[0]["terminal_state"], 5, "the record")
    record = _one_record(server)
    assert record["terminal_state"] == "completed"
    assert record["reason"] == "caller chose to end the call"


def test_g722_call_runs_at_16_khz(server: Server, tmp_path: Path) -> None:
    sipp = Sipp("uac-g722.xml", server.sip_target, tmp_path).start()
    live = wait_for(
        lambda: [c for c in server.live_calls() if c["state"] == "answered"], 10, "a live call"
    )
    assert live[0]["codec"] == "G722"
    assert live[0]["rate"] == 16000
    assert sipp.wait() == 0, sipp.errors()
    wait_for(lambda: server.records()[0]["terminal_state"] == "completed", 5, "the record")


def test_record_survives_a_restart(server_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = server_factory()
    assert Sipp("uac-server-hangup.xml", server.sip_target, tmp_path).run() == 0
    wait_for(lambda: server.records()[0]["terminal_state"], 5, "the record")
    before = server.records()
    assert server.stop() == 0
    server.start()
    status, body = server.http(f"/v1/calls/{before[0]['call_id']}")
    assert status == 200
    assert body["record"]["terminal_state"] == "completed"
    assert body["live"] is None
    assert server.records() == before


def test_unknown_call_id_is_a_json_404(server: Server) -> None:
    status, body = server.http("/v1/calls/nope")
    assert status == 404
    assert body == {"error": "no such call", "call_id": "nope"}


def test_health_and_readiness(server: Server) -> None:
    assert server.http("/healthz") == (200, {"status": "ok"})
    status, body = server.http("/readyz")
    assert status == 200
    assert body["sip_transports_up"] is True
    assert server.metric("voicegate_sip_transports_up") == 1
    # The verified pointer copy is in use on this build of pjsua2.
    assert server.metric("voicegate_fast_frame_copy") == 1
