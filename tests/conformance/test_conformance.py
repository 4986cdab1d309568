"""The conformance kit: voicegate's promises around a remote agent, with the link broken on purpose.

A SIPp caller on one side, the agent under test on the other (the example agent by default; see
conftest.py), the chaos proxy in between (proxy.py), RTP captured. Each test breaks the link the
way the issue lists and checks what the caller heard, what each side was told, and the records:

- bad input of every kind is refused in band, counted by kind, and changes nothing; past the
  error budget the link is closed and the call ends as configured;
- the socket killed mid-utterance, then again during the recovery: the cut response never plays
  on, stale chunks replayed later are dropped, a stale ack changes nothing, both sides' messages
  stay gapless across three sockets, and a link that then never comes back ends the call with the
  caller told;
- the socket killed mid-tool-call: exactly one execution at the provider.

What the agent must do for the kit (docs/agent-protocol.md): greet the caller with a response of
a second or more, resume with the token, replay what was not acked; for the tool test, key 1
calls the ``charge`` tool and key 9 hangs up (as examples/remote_agent does).
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.conftest import AgentUnderTest, voicegate_env
from tests.conformance.proxy import FROM_AGENT, TO_AGENT, ChaosProxy, Passed
from tests.integration.harness import Provider, Server, ServerFactory, Sipp, wait_for
from tests.integration.rtp_capture import Capture

LINK_TYPES = {"session.resume", "session.resumed", "ping", "pong", "ack"}
BAD_INPUT_KINDS = (
    "bad_json",
    "schema",
    "unknown_type",
    "unknown_response",
    "too_large",
    "bad_frame",
    "flood",
)


def _events(server: Server) -> list[dict[str, Any]]:
    sessions = server.sessions()
    return sessions[0]["events"] if sessions else []


def _ended(server: Server) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: next((e for e in server.ended() if e), None), 20, "the session to end"
    )
    return found


def _errors_to_agent(proxy: ChaosProxy) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in proxy.frames(TO_AGENT, "error"):
        assert p.text is not None
        counts[p.text["code"]] = counts.get(p.text["code"], 0) + 1
    return counts


def _gapless(frames: list[Passed]) -> None:
    """Sequenced messages of one sender, across all its sockets: 1..n, none missing."""
    seqs = {p.text["seq"] for p in frames if p.text and p.type not in LINK_TYPES}
    assert seqs == set(range(1, max(seqs, default=0) + 1)), sorted(set(range(1, max(seqs))) - seqs)


def _chunk(response_id: str, samples: int = 160) -> bytes:
    rid = response_id.encode()
    return struct.pack("!BBH", 2, 1, len(rid)) + rid + bytes(2 * samples)


def test_bad_input_is_refused_in_band_counted_by_kind_and_changes_nothing(
    server_factory: ServerFactory, proxy: ChaosProxy, tmp_path: Path
) -> None:
    server = server_factory(**voicegate_env(proxy, VOICEGATE_AGENT_MAX_PROTOCOL_ERRORS="1000"))
    sipp = Sipp("uac-speech-dtmf.xml", server.sip_target, tmp_path).start()
    wait_for(lambda: proxy.frames(FROM_AGENT, "session.accept"), 15, "the handshake")
    bad: list[str | bytes | dict[str, Any]] = [
        "not json {",
        {"type": "response.start", "seq": 0, "ack": 0},  # no response_id: a schema violation
        {"type": "respons.start", "seq": 0, "ack": 0, "response_id": "x"},  # unknown type
        _chunk("never-started"),  # a chunk for a response that does not exist
        "\"" + "x" * 70_000 + "\"",  # a text frame over 64 KiB
        _chunk("big", 35_000),  # a binary frame over 64 KiB
        b"\x07\x01\x00\x00",  # a binary frame of no kind we know
    ]
    for frame in bad:
        proxy.inject(frame)
    for _ in range(210):  # a flood: past 200 text messages a second each is refused as such
        proxy.inject("{")
    assert sipp.wait() == 0, sipp.errors()
    end = _ended(server)
    assert (end["terminal_state"], end["reason"]) == ("completed", "caller hung up")

    counted = {
        kind: server.metric("voicegate_agent_protocol_errors_total", kind=kind)
        for kind in BAD_INPUT_KINDS
    }
    assert (counted["schema"], counted["unknown_type"], counted["unknown_response"]) == (1, 1, 1)
    assert (counted["too_large"], counted["bad_frame"]) == (2, 1)
    # 211 unreadable frames, the last ones refused as a flood; the agent's own acks in that
    # second are refused as flood too (counted, never answered: that would feed the flood).
    assert counted["bad_json"] <= 201 and counted["flood"] >= 10
    assert counted["bad_json"] + counted["flood"] >= 211
    assert server.metric("voicegate_agent_chunks_dropped_total", reason="unknown_response") == 1
    # Each refusal was answered in band, to the agent, with its code (a flood once a second).
    answered = {k: int(v) for k, v in counted.items() if v}
    assert _errors_to_agent(proxy) == {**answered, "flood": 1}
    # And nothing changed: the link never dropped, every key reached the agent, the session
    # logged no event for any of it.
    types = [e["type"] for e in _events(server)]
    assert "agent_link_lost" not in types and proxy.sockets == 1
    assert [p.text["digit"] for p in proxy.frames(TO_AGENT, "dtmf") if p.text] == list("124#")
    _gapless(proxy.frames(TO_AGENT))
    assert not proxy.frames(FROM_AGENT, "error"), "the agent refused something voicegate sent"


def test_past_the_error_budget_the_link_is_closed_and_the_caller_told(
    server_factory: ServerFactory, proxy: ChaosProxy, tmp_path: Path
) -> None:
    server = server_factory(**voicegate_env(proxy, VOICEGATE_AGENT_MAX_PROTOCOL_ERRORS="5"))
    sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    wait_for(lambda: proxy.frames(FROM_AGENT, "session.accept"), 15, "the handshake")
    for _ in range(5):
        proxy.inject("not json {")
    assert sipp.wait() == 0, sipp.errors()
    end = _ended(server)
    assert (end["terminal_state"], end["stage"]) == ("failed", "agent_link")
    said = [x["prompt"] for e in _events(server) for x in e["effects"] if x["kind"] == "say"]
    assert "technical_problem" in said, said
    last = proxy.frames(TO_AGENT, "error")[-1].text
    assert last is not None and last["fatal"] is True


def test_kills_mid_utterance_and_during_the_recovery_never_let_old_audio_through(
    server_factory: ServerFactory, proxy: ChaosProxy, tmp_path: Path
) -> None:
    server = server_factory(**voicegate_env(proxy, deadline_s=3.0))
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
        # Mid-utterance: the agent's first response has streamed half a second or more.
        first = wait_for(
            lambda: proxy.first(lambda p: p.direction == FROM_AGENT and p.data is not None),
            15,
            "the agent's first audio",
        )
        cut_id = first.response_id
        assert cut_id is not None
        wait_for(
            lambda: (
                len([p for p in proxy.frames(FROM_AGENT, "binary") if p.response_id == cut_id])
                >= 25
            ),
            10,
            "half a second of the response",
        )
        killed_at = time.time()
        assert proxy.kill()
        # During the recovery: the moment the agent has resumed, before anything else.
        wait_for(
            lambda: proxy.sockets >= 2 and proxy.frames(FROM_AGENT, "session.resumed"),
            10,
            "the first resume",
        )
        assert proxy.kill()
        wait_for(
            lambda: len(proxy.frames(FROM_AGENT, "session.resumed")) >= 2, 10, "the second resume"
        )
        wait_for(
            lambda: server.metric("voicegate_agent_link_resumes_total", result="resumed") == 2,
            10,
            "voicegate to count both resumes",
        )
        # Stale chunks: what the cut response had sent, replayed now; and a stale ack.
        stale = [p.data for p in proxy.frames(FROM_AGENT, "binary") if p.response_id == cut_id]
        errors_before = sum(_errors_to_agent(proxy).values())
        for data in stale[:10]:
            assert data is not None
            proxy.inject(data)
        agent_seq = max(p.text["seq"] for p in proxy.frames(FROM_AGENT) if p.text)
        proxy.inject({"type": "ack", "seq": agent_seq, "ack": 0})
        wait_for(
            lambda: (
                server.metric("voicegate_agent_chunks_dropped_total", reason="dead_response") >= 10
            ),
            10,
            "the stale chunks to be dropped",
        )
        time.sleep(1.0)  # the call goes on with its agent for a second (nothing to poll)
        # And then the agent is gone for good.
        proxy.refuse(60)
        gone_at = time.time()
        assert proxy.kill()
        assert sipp.wait() == 0, sipp.errors()
    finally:
        packets = capture.stop()
    end = _ended(server)
    assert (end["terminal_state"], end["stage"]) == ("failed", "agent_link")
    said = [x["prompt"] for e in _events(server) for x in e["effects"] if x["kind"] == "say"]
    assert "technical_problem" in said, said

    # What the caller heard: nothing of the cut response after the kill, and nothing at all
    # until the agent spoke again (a new response) or the honest line was due.
    ports = range(server.rtp_min, server.rtp_max + 1)
    sent = [p for p in packets if p.src_port in ports and p.payload_type in (0, 8)]
    new = proxy.first(
        lambda p: (
            p.at > killed_at
            and p.direction == FROM_AGENT
            and p.data is not None
            and p.response_id != cut_id
            and not p.injected
        )
    )
    until = min(new.at if new else gone_at, killed_at + 1.8)
    loud = [
        round(p.at - killed_at, 3) for p in sent if killed_at + 0.1 < p.at < until and p.rms > 50
    ]
    assert not loud, f"audio after the kill, before anything new (s after it): {loud}"
    # The stale ack changed nothing; nobody saw a gap: each side's messages are 1..n across
    # all sockets, and neither refused anything.
    assert sum(_errors_to_agent(proxy).values()) == errors_before == 0
    assert not proxy.frames(FROM_AGENT, "error")
    _gapless(proxy.frames(TO_AGENT))
    _gapless([p for p in proxy.frames(FROM_AGENT) if not p.injected])
    # The agent was told the cut, by the session, with what was heard.
    cleared = [p.text for p in proxy.frames(TO_AGENT, "playback.cleared") if p.text]
    assert [(c["response_id"], c["reason"]) for c in cleared][:1] == [(cut_id, "agent_link")]


def test_a_kill_mid_tool_call_executes_it_exactly_once(
    server_factory: ServerFactory,
    proxy: ChaosProxy,
    agent_under_test: AgentUnderTest,
    tmp_path: Path,
) -> None:
    if not agent_under_test.tools:
        pytest.skip("the agent under test makes no tool call (CONFORMANCE_AGENT_TOOLS=0)")
    provider = Provider(tmp_path / "provider").start()
    try:
        provider.set_faults(charge_delay_s=1.5)  # the charge is in flight for a while
        server = server_factory(
            **voicegate_env(proxy),
            **provider.tool_env(timeout_s=5.0),
            VOICEGATE_TOOL_CHARGE_APPROVAL="none",
        )
        sipp = Sipp("uac-remote-pay.xml", server.sip_target, tmp_path).start()
        call = wait_for(lambda: proxy.frames(FROM_AGENT, "tool.call"), 15, "the tool call")[0]
        assert call.text is not None
        wait_for(
            lambda: "tool_request_sent" in [e["type"] for e in _events(server)],
            10,
            "the request to be on the wire",
        )
        assert proxy.kill()
        assert sipp.wait() == 0, sipp.errors()
        end = _ended(server)
        assert end["terminal_state"] == "completed", end
        assert len(provider.charges()) == 1  # the provider's ledger
    finally:
        provider.stop()
    results = [
        p.text
        for p in proxy.frames(TO_AGENT, "tool.result")
        if p.text and p.text["call_id"] == call.text["call_id"]
    ]
    assert [r["outcome"] for r in results if not r.get("duplicate")] == ["committed"], results
    assert [e["type"] for e in _events(server)].count("tool_request_sent") == 1
