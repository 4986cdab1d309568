"""The consultation before an attended transfer's hand-over (voicegate/call/consult.py), end to
end: real SIPp people on the consult leg who press a key by SIP INFO (``uas-consult-accepts.xml``
presses 1, ``uas-consult-declines.xml`` presses 2), the demo agent telling the person why in a
sentence espeak-ng speaks, the API's ``.../transfer/say``, and the RTP captured to show that what
is said to the person reaches the consult leg and none of it the caller on hold.

One server for the module, with ``transfer.consult_complete = "person"`` (the person's key
decides), no brief (all the consult leg carries is what was said) and attended transfers to
the person's port by default (the demo agent's key 0)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from session.state import AWAY_STATUS
from tests.integration.harness import LOOPBACK, Server, Sipp, free_port, wait_for
from tests.integration.resume_handles import away_session
from tests.integration.rtp_capture import Capture, RtpPacket

LOUD = 500.0  # speech frames in A-law; the silence of an idle port is under 50
FINISHED = "transfer_finished"
REASON = "talk to a person from the voice menu"  # the demo agent's sentence, in part


@pytest.fixture(scope="module")
def consult_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    port = free_port()
    env = {
        "VOICEGATE_TRANSFER_ALLOWED_TARGETS": "sip:desk@127.0.0.1:*",
        "VOICEGATE_TRANSFER_DEFAULT_TARGET": f"sip:desk@{LOOPBACK}:{port}",
        "VOICEGATE_TRANSFER_DEFAULT_MODE": "attended",
        "VOICEGATE_TRANSFER_CONSULT_BRIEF": "",
        "VOICEGATE_TRANSFER_CONSULT_COMPLETE": "person",
    }
    server = Server(tmp_path_factory.mktemp("consult-server"), env_overrides=env).start()
    yield server, port
    server.stop()
    # As tests/integration/conftest.py: every session terminal, but one that is away.
    left_open = [
        s
        for s in server.stored_sessions()
        if s["terminal_state"] is None and not s["status"].startswith(AWAY_STATUS)
    ]
    assert not left_open, f"sessions left non-terminal: {left_open}"


def _answered_call(server: Server) -> str:
    calls = wait_for(
        lambda: [c for c in server.live_calls() if c["state"] == "answered" and c["media"]],
        10,
        "an answered call",
    )
    call_id: str = calls[0]["call_id"]
    return call_id


def _session(server: Server, call_id: str) -> dict[str, Any]:
    status, session = server.http(f"/v1/sessions/{call_id}")
    assert status == 200, session
    return session  # type: ignore[no-any-return]


def _handoff_why(server: Server, call_id: str) -> str:
    status, handoff = server.http(f"/v1/sessions/{call_id}/handoff")
    assert status == 200, handoff
    return str(handoff["why"])


def _types(session: dict[str, Any]) -> list[str]:
    return [e["type"] for e in session["events"]]


def _said(session: dict[str, Any]) -> list[str]:
    return [x["prompt"] for e in session["events"] for x in e["effects"] if x["kind"] == "say"]


def _sent_by_port(server: Server, packets: list[RtpPacket]) -> list[list[RtpPacket]]:
    """What voicegate sent, one list per RTP port of ours, in the order the streams began."""
    ours = range(server.rtp_min, server.rtp_max + 1)
    sent: dict[int, list[RtpPacket]] = defaultdict(list)
    for packet in packets:
        if packet.src_port in ours and packet.dst_port not in ours and packet.payload_type == 8:
            sent[packet.src_port].append(packet)
    return sorted(sent.values(), key=lambda p: p[0].at)


def test_the_demo_agent_tells_the_person_why_and_their_key_1_hands_the_caller_over(
    consult_server: tuple[Server, int], tmp_path: Path
) -> None:
    server, port = consult_server
    completed = server.metric("voicegate_transfers_total", mode="attended", outcome="completed")
    took = ("voicegate_transfer_duration_seconds_count", "attended", "completed")
    transfers_timed = server.metric(took[0], mode=took[1], outcome=took[2])
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        person = Sipp("uas-consult-accepts.xml", "", tmp_path / "person", port=port).start()
        # Key 0 to the demo agent: its own attended transfer (transfer.default_mode).
        caller = Sipp("uac-transfer-key0-attended.xml", server.sip_target, tmp_path).start()
        call_id = _answered_call(server)
        # While the person is consulted (2.5 s before their key), a desk's screen reads a
        # transfer, never a fault: the handoff and the session say so.
        wait_for(
            lambda: _handoff_why(server, call_id) == "transferring (attended, consulting)",
            10,
            "the handoff to say the caller is being transferred, consulting",
        )
        detail = _session(server, call_id)
        assert detail["recovery"] is None, detail["status"]
        assert detail["transfer"]["summary"] == "transferring (attended, consulting)"
        assert caller.wait() == 0, caller.errors()  # the REFER with Replaces, then our BYE
        assert person.wait() == 0, person.errors()  # its INFO got 200, then our BYE
    finally:
        packets = capture.stop()
    # Away, not ended: the caller may come back with the handle (session/away.py).
    session = away_session(server, call_id)
    types = _types(session)
    assert types.index("consult_answered") < types.index("transfer_finished")
    finished = [e["payload"] for e in session["events"] if e["type"] == "transfer_finished"]
    assert [(f["ok"], f["status"]) for f in finished] == [(True, 200)]
    assert (
        server.metric("voicegate_transfers_total", mode="attended", outcome="completed")
        == completed + 1
    )
    # Its own phase: timed as a transfer, and no recovery of any kind ran (none is a transfer).
    assert server.metric(took[0], mode=took[1], outcome=took[2]) == transfers_timed + 1
    recoveries = {
        labels: value
        for (name, labels), value in server.metrics().items()
        if name == "voicegate_recovery_duration_seconds_count"
    }
    assert all(dict(labels)["kind"] != "transfer" for labels in recoveries), recoveries
    assert sum(recoveries.values()) == 0, recoveries
    assert '"recovery.started"' not in server.log()
    # The agent's sentence was logged by its length only, and the key by its method.
    log = server.log()
    assert '"transfer.consult_say"' in log and REASON not in log
    assert server.metric("voicegate_dtmf_digits_total", method="sip-info") >= 1

    # The caller's leg began first (the greeting), the consult leg when the person answered
    # (after the caller's hold line had ended: the person rings for 4 s). The consult leg
    # carries the agent's sentence; from its first word on, the caller hears nothing.
    to_caller, to_person = _sent_by_port(server, packets)
    spoken = [p for p in to_person if p.rms > LOUD]
    assert len(spoken) >= 50, len(spoken)  # a second of speech at least
    leaked = [p for p in to_caller if p.at >= spoken[0].at and p.rms > LOUD]
    assert leaked == [], f"{len(leaked)} loud packets to the caller on hold"


def test_the_persons_key_2_declines_and_the_caller_is_back_with_the_agent(
    consult_server: tuple[Server, int], tmp_path: Path
) -> None:
    server, port = consult_server
    declined = server.metric("voicegate_transfers_total", mode="attended", outcome="declined")
    person = Sipp("uas-consult-declines.xml", "", tmp_path / "person", port=port).start()
    # This caller fails on any REFER: none may come when the person declined.
    caller = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    call_id = _answered_call(server)
    say = f"/v1/calls/{call_id}/transfer/say"
    # Bad bodies are refused naming the field, and nothing to say to without a consultation.
    bad: list[tuple[dict[str, object], str]] = [
        ({}, "text"),
        ({"text": "a", "prompt": "b"}, "text"),
        ({"text": " "}, "text"),
        ({"text": 5}, "text"),
        ({"prompt": "../x"}, "prompt"),
        ({"say": "hi"}, "say"),
    ]
    for body, field in bad:
        status, answer = server.post_json(say, body)
        assert (status, answer["field"]) == (400, field), (body, answer)
    status, answer = server.post_json(say, {"text": "Hello"})
    assert status == 409, answer
    status, body = server.post_json(
        f"/v1/calls/{call_id}/transfer",
        {"target": f"sip:desk@{LOOPBACK}:{port}", "mode": "attended"},
    )
    assert status == 202, body

    def consult() -> object:
        status, call = server.http(f"/v1/calls/{call_id}")
        return call["live"]["consult"] if status == 200 else None

    wait_for(lambda: consult() == "waiting", 10, "the person to answer")
    status, answer = server.post_json(say, {"prompt": "nope"})
    assert (status, answer["field"]) == (400, "prompt"), answer
    status, answer = server.post_json(say, {"text": "The caller wants to move a delivery."})
    assert (status, answer["saying"]) == (202, True), answer
    assert person.wait() == 0, person.errors()  # pressed 2, then our BYE ended its leg
    finished = wait_for(
        lambda: [e for e in _session(server, call_id)["events"] if e["type"] == FINISHED],
        10,
        "the transfer to be declined",
    )
    assert (finished[0]["payload"]["ok"], finished[0]["payload"]["status"]) == (False, 603)
    assert any(x == {"kind": "say", "prompt": "transfer_failed"} for x in finished[0]["effects"])
    status, call = server.http(f"/v1/calls/{call_id}")
    assert (call["live"]["state"], call["live"]["consult"]) == ("answered", None)
    status, answer = server.post_json(say, {"text": "Hello"})
    assert status == 409, answer  # nobody left to say it to
    assert server.post(f"/v1/calls/{call_id}/hangup") == 202
    assert caller.wait() == 0, caller.errors()
    assert (
        server.metric("voicegate_transfers_total", mode="attended", outcome="declined")
        == declined + 1
    )
    session = wait_for(
        lambda: (s := _session(server, call_id))["ended"] and s, 10, "the session to end"
    )
    assert "consult_answered" in _types(session)
    assert _said(session).count("transfer_consulting") == 1
