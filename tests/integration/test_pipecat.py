"""A Pipecat bot answers voicegate's calls (integrations/pipecat/, examples/pipecat_bot/).

Real peers: the example bot, a real Pipecat pipeline (pocketsphinx STT, a rules LLM with
Pipecat's own function calling, espeak-ng TTS) in its own process; a voicegate server
subprocess; SIPp callers; RTP captured on loopback; the reference payment provider.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Provider, Server, ServerFactory, Sipp, wait_for
from tests.integration.pipecat_bot import PipecatBot
from tests.integration.rtp_capture import Capture


@pytest.fixture
def bot(tmp_path: Path) -> Iterator[PipecatBot]:
    started = PipecatBot(tmp_path / "bot").start()
    try:
        yield started
    finally:
        started.stop()


def ended(server: Server) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: next((e for e in server.ended() if e), None), 20, "the session to end"
    )
    return found


def session_events(server: Server) -> list[dict[str, Any]]:
    sessions = server.sessions()
    return sessions[0]["events"] if sessions else []


def test_the_bot_greets_takes_a_payment_by_key_and_hangs_up(
    server_factory: ServerFactory, bot: PipecatBot, tmp_path: Path
) -> None:
    provider = Provider(tmp_path / "provider").start()
    try:
        server = server_factory(
            **bot.env(), **provider.tool_env(timeout_s=5.0), VOICEGATE_TOOL_CHARGE_APPROVAL="none"
        )
        capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
        try:
            sipp = Sipp("uac-remote-pay.xml", server.sip_target, tmp_path)
            assert sipp.run() == 0, f"{sipp.errors()}\n--- bot log:\n{bot.log_tail()}"
        finally:
            packets = capture.stop()
        end = ended(server)
        assert end["terminal_state"] == "completed", f"{end}\n{bot.log_tail()}"
        assert len(provider.charges()) == 1
    finally:
        provider.stop()
    ports = range(server.rtp_min, server.rtp_max + 1)
    loud = [p for p in packets if p.src_port in ports and p.payload_type == 8 and p.rms > 300]
    assert len(loud) > 100, "the caller heard the bot"
    (context,) = bot.contexts()
    messages = context["messages"]
    print(messages)
    # The key cut the greeting a second into its first sentence: the context does not claim
    # the bot said what the caller never heard.
    said = " ".join(str(m.get("content")) for m in messages if m["role"] == "assistant")
    assert "press 1" not in said, said
    # One charge, one result in the context, and the outcome said after it.
    results = [m for m in messages if m["role"] == "tool" and "committed" in m["content"]]
    assert len(results) == 1, messages
    assert "The payment of five euros went through." in said
