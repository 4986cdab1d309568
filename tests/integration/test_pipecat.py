"""A Pipecat bot answers voicegate's calls (integrations/pipecat/, examples/pipecat_bot/).

Real peers: the example bot, a real Pipecat pipeline (pocketsphinx STT, a rules LLM with
Pipecat's own function calling, espeak-ng TTS) in its own process; a voicegate server
subprocess; SIPp callers; RTP captured on loopback; the reference payment provider.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integrations.pipecat import CallInfo, VoicegateTransport
from tests.conformance.proxy import FROM_AGENT, TO_AGENT, ChaosProxy
from tests.integration.harness import (
    ROOT,
    SCENARIOS,
    Provider,
    Server,
    ServerFactory,
    Sipp,
    free_port,
    wait_for,
)
from tests.integration.pipecat_bot import SECRET, InProcessServer, PipecatBot
from tests.integration.resume_handles import away_session
from tests.integration.rtp_capture import Capture
from tests.integration.speech_rtp import VOICES, Keys, Say, Step, rtp_packets, write_pcap
from tests.secret_audit import AUDIT


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
    # The key cut the greeting a second into its first sentence: the context does not claim
    # the bot said what the caller never heard.
    said = " ".join(str(m.get("content")) for m in messages if m["role"] == "assistant")
    assert "press 1" not in said, said
    # One charge, one result in the context, and the outcome said after it.
    results = [m for m in messages if m["role"] == "tool" and "committed" in m["content"]]
    assert len(results) == 1, messages
    assert "The payment of five euros went through." in said


def _speech_scenario(work: Path, steps: list[Step], length_s: float, codec: str = "g722") -> Path:
    """uac-speech-payment.xml playing a caller made for this run (speech_rtp.py)."""
    pcap = work / "caller.pcap"
    write_pcap(pcap, rtp_packets(steps, codec, length_s))
    text = (SCENARIOS / "uac-speech-payment.xml").read_text()
    text = text.replace("pcap/speech-payment-g722.pcap", str(pcap))
    if codec == "pcma":  # (the capture decodes G.711 to measure what the caller heard)
        text = text.replace("RTP/AVP 9 101", "RTP/AVP 8 101")
        text = text.replace("a=rtpmap:9 G722/8000", "a=rtpmap:8 PCMA/8000")
    scenario = work / "uac-pipecat-caller.xml"
    scenario.write_text(text)
    return scenario


def _said(messages: list[dict[str, Any]], role: str) -> str:
    return " ".join(str(m.get("content")) for m in messages if m["role"] == role)


def test_a_caller_talks_to_the_bot_and_hears_its_answers(
    server_factory: ServerFactory, bot: PipecatBot, tmp_path: Path
) -> None:
    voice = VOICES[0]
    steps: list[Step] = [
        Say(1.0, "what is my balance", voice),  # over the greeting: a barge-in
        Say(8.0, "pay five euros", voice),
        Say(14.0, "goodbye", voice),
    ]
    provider = Provider(tmp_path / "provider").start()
    try:
        server = server_factory(
            **bot.env(), **provider.tool_env(timeout_s=5.0), VOICEGATE_TOOL_CHARGE_APPROVAL="none"
        )
        scenario = _speech_scenario(tmp_path, steps, 20.0)
        sipp = Sipp(str(scenario), server.sip_target, tmp_path, timeout_s=50)
        assert sipp.run() == 0, f"{sipp.errors()}\n--- bot log:\n{bot.log_tail()}"
        end = ended(server)
        assert (end["terminal_state"], end["reason"]) == ("completed", "the bot ended the call")
        assert len(provider.charges()) == 1
    finally:
        provider.stop()
    (context,) = bot.contexts()
    messages = context["messages"]
    heard_by_bot, said = _said(messages, "user"), _said(messages, "assistant")
    for line in ("balance", "pay five euros", "goodbye"):
        assert line in heard_by_bot, messages
    # What the bot said is in its context only once voicegate played it to the caller.
    assert "balance is" in said and "The payment of five euros went through." in said, said
    # The greeting was cut in its first sentence by the caller's question.
    assert "Press 9" not in said, said
    barge_ins = [e for e in session_events(server) if e["type"] == "response_interrupted"]
    assert barge_ins, "the caller's question cut the greeting"


def test_a_late_chunk_of_a_cut_turn_never_reaches_the_caller(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """The bot streams its story in real time (a TTS as slow as speech) over a link that
    brings voicegate's news 0.8 s late: after the caller barges in, the bot goes on streaming
    the cut turn for most of a second. voicegate drops every chunk of it; the caller hears
    nothing of the story after the cut."""
    bot = PipecatBot(tmp_path / "bot", tts_pace=1.0).start()
    proxy = ChaosProxy(bot.url, SECRET, free_port(udp_and_tcp=False), lag_s=0.8).start()
    try:
        server = server_factory(**{**bot.env(), "VOICEGATE_AGENT_URL": proxy.url})
        # Key 5: the story; the caller talks over it; key 9: goodbye.
        steps: list[Step] = [Keys(0.5, "5"), Say(6.0, "what is my balance", VOICES[0])]
        steps.append(Keys(11.0, "9"))
        capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
        try:
            scenario = _speech_scenario(tmp_path, steps, 16.0, codec="pcma")
            sipp = Sipp(str(scenario), server.sip_target, tmp_path, timeout_s=50)
            assert sipp.run() == 0, f"{sipp.errors()}\n--- bot log:\n{bot.log_tail()}"
        finally:
            packets = capture.stop()
        end = ended(server)
        assert end["terminal_state"] == "completed", f"{end}\n{bot.log_tail()}"
    finally:
        proxy.stop()
        bot.stop()
    # The story: the response the caller's speech cut.
    cuts = [
        p
        for p in proxy.frames(TO_AGENT, "playback.interrupted")
        if p.text and p.text["reason"] == "barge_in"
    ]
    assert cuts, "the caller's goodbye cut the story"
    story = cuts[-1]
    assert story.text is not None
    story_id, cut_at = story.text["response_id"], story.at
    late = [
        p for p in proxy.frames(FROM_AGENT, "binary") if p.response_id == story_id and p.at > cut_at
    ]
    assert len(late) >= 10, f"the bot streamed the cut story on ({len(late)} chunks after the cut)"
    assert (
        server.metric("voicegate_agent_chunks_dropped_total", reason="dead_response")
        >= len(late) - 2
    )  # (a chunk or two may have been on their way as voicegate cut)
    # What the caller heard: nothing loud from the cut until the bot's next turn (its goodbye).
    following = proxy.first(
        lambda p: (
            p.direction == FROM_AGENT
            and p.at > cut_at
            and p.text is not None
            and p.type == "response.start"
        )
    )
    assert following is not None, "the bot said goodbye"
    ports = range(server.rtp_min, server.rtp_max + 1)
    sent = [p for p in packets if p.src_port in ports and p.payload_type == 8]
    assert [p for p in sent if p.at < cut_at and p.rms > 300], "the story was playing"
    loud = [
        round(p.at - cut_at, 3) for p in sent if cut_at + 0.1 < p.at < following.at and p.rms > 300
    ]
    assert not loud, f"the cut story reached the caller (s after the cut): {loud}"


def test_a_link_dropped_during_a_charge_charges_once_and_tells_the_llm_once(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    bot = PipecatBot(tmp_path / "bot").start()
    proxy = ChaosProxy(bot.url, SECRET, free_port(udp_and_tcp=False)).start()
    provider = Provider(tmp_path / "provider").start()
    try:
        provider.set_faults(charge_delay_s=1.5)  # the charge is in flight for a while
        server = server_factory(
            **{**bot.env(), "VOICEGATE_AGENT_URL": proxy.url},
            **provider.tool_env(timeout_s=5.0),
            VOICEGATE_TOOL_CHARGE_APPROVAL="none",
        )
        sipp = Sipp("uac-remote-pay.xml", server.sip_target, tmp_path).start()
        wait_for(
            lambda: "tool_request_sent" in [e["type"] for e in session_events(server)],
            15,
            "the charge request to be on the wire",
        )
        assert proxy.kill(), "the link was up"
        assert sipp.wait() == 0, f"{sipp.errors()}\n--- bot log:\n{bot.log_tail()}"
        end = ended(server)
        assert end["terminal_state"] == "completed", f"{end}\n{bot.log_tail()}"
        assert len(provider.charges()) == 1  # the provider's ledger
    finally:
        provider.stop()
        proxy.stop()
        bot.stop()
    assert server.metric("voicegate_agent_link_resumes_total", result="resumed") == 1
    # After the resume the bot asked again with the same call_id (reclaim, don't resend):
    # answered from voicegate's record, never sent to the provider again.
    calls = [p.text for p in proxy.frames(FROM_AGENT, "tool.call") if p.text]
    assert len(calls) == 2 and calls[0]["call_id"] == calls[1]["call_id"], calls
    assert server.metric("voicegate_tool_duplicates_prevented_total", tool="charge") == 1
    assert [e["type"] for e in session_events(server)].count("tool_request_sent") == 1
    # The LLM got the result once.
    (context,) = bot.contexts()
    results = [
        m for m in context["messages"] if m["role"] == "tool" and "committed" in str(m["content"])
    ]
    assert len(results) == 1, context["messages"]
    assert "The payment of five euros went through." in _said(context["messages"], "assistant")


def test_the_conformance_kit_passes_against_the_example_bot(
    bot: PipecatBot, tmp_path: Path
) -> None:
    env = {**os.environ, "CONFORMANCE_AGENT_SECRET": SECRET}
    kit = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.conformance",
            "--agent-url",
            bot.url,
            "-p",
            "no:xdist",
            f"--basetemp={tmp_path / 'kit'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert kit.returncode == 0, f"{kit.stdout[-6000:]}\n--- bot log:\n{bot.log_tail()}"
    assert "4 passed" in kit.stdout, kit.stdout[-2000:]


def test_the_bot_transfers_the_caller_to_a_person_who_sends_them_back(
    server_factory: ServerFactory, bot: PipecatBot, tmp_path: Path
) -> None:
    server = server_factory(
        **bot.env(),
        VOICEGATE_TRANSFER_ALLOWED_TARGETS="sip:*@cc.example.com",
        VOICEGATE_TRANSFER_DEFAULT_TARGET="sip:desk@cc.example.com",
    )
    # Key 0: the LLM calls transfer_to_person, whose handler asks voicegate for the transfer;
    # the caller's leg accepts the REFER and NOTIFYs 100 then 200.
    log = tmp_path / "caller-logs.log"
    sipp = Sipp(
        "uac-transfer-blind.xml",
        server.sip_target,
        tmp_path / "caller",
        extra=("-trace_logs", "-log_file", str(log)),
    )
    assert sipp.run() == 0, f"{sipp.errors()}\n--- bot log:\n{bot.log_tail()}"
    away = away_session(server)
    assert server.metric("voicegate_transfers_total", mode="blind", outcome="completed") == 1
    (first,) = wait_for(lambda: bot.contexts() or None, 10, "the bot to end its first call")
    calls = [c["function"]["name"] for m in first["messages"] for c in m.get("tool_calls") or ()]
    assert calls == ["transfer_to_person"], first["messages"]

    # The centre sends the caller back with the REFER's handle: the bot is dialled for the same
    # session, rejoined, and welcomes them back on a new pipeline.
    (handle,) = re.findall(r"X-Voicegate-Resume: (\S+)", log.read_text())
    AUDIT.register(handle, "resume handle sent on a REFER", "tests/integration")
    work = tmp_path / "back"
    work.mkdir()
    (work / "handle.csv").write_text(f"SEQUENTIAL\n{handle};\n")
    back = Sipp("uac-rejoin.xml", server.sip_target, work, extra=("-inf", str(work / "handle.csv")))
    assert back.run() == 0, f"{back.errors()}\n--- bot log:\n{bot.log_tail()}"
    contexts = wait_for(lambda: bot.contexts()[1:] or None, 15, "the bot to end the rejoin")
    said = _said(contexts[0]["messages"], "assistant")
    assert contexts[0]["session_id"] == away["session_id"]
    assert "Welcome back." in said, contexts[0]["messages"]


def test_a_bot_that_fails_is_started_afresh_once_then_the_call_ends_failed(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    runs: list[CallInfo] = []

    async def failing(transport: VoicegateTransport) -> None:
        runs.append(transport.info)
        raise RuntimeError("the bot's own bug")

    bots = InProcessServer(failing).start()
    try:
        server = server_factory(**bots.env())
        sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path)
        assert sipp.run() == 0, sipp.errors()
        end = ended(server)
    finally:
        bots.stop()
    assert (end["terminal_state"], end["stage"]) == ("failed", "agent_link"), end
    # The first failure lost the pipeline, not the call: voicegate started the session again,
    # resumed (pick the call up); the second failure ended it.
    assert [info.resumed for info in runs] == [False, True], runs
    assert len({info.session_id for info in runs}) == 1
