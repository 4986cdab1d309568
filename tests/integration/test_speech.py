"""The demo agent by voice (issue 19): a caller whose lines espeak-ng spoke pays 59 cents, at
16 kHz over G.722 and at 8 kHz over G.711 A-law, against the real reference payment provider.

Both calls run at once on one server (the recognition thread serves both), about 20 s in all.
The caller's script is in tests/integration/speech_rtp.py: an out-of-grammar sentence, "make a
payment", the amount (said at 16 kHz, keyed at 8 kHz), "yes", "hang up" and "yes" to end it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import SCENARIOS, Provider, Server, Sipp, wait_for
from tests.integration.speech_rtp import payment_script, rtp_packets, write_pcap

CODECS = {"g722": ("9", "G722/8000"), "pcma": ("8", "PCMA/8000")}


def _scenario(codec: str, work: Path) -> Path:
    """uac-speech-payment.xml offering ``codec`` and playing a capture made for this run."""
    steps, length = payment_script(codec)
    pcap = work / f"speech-payment-{codec}.pcap"
    write_pcap(pcap, rtp_packets(steps, codec, length))
    pt, name = CODECS[codec]
    text = (SCENARIOS / "uac-speech-payment.xml").read_text()
    text = text.replace("pcap/speech-payment-g722.pcap", str(pcap))
    text = text.replace("RTP/AVP 9 101", f"RTP/AVP {pt} 101")
    text = text.replace("a=rtpmap:9 G722/8000", f"a=rtpmap:{pt} {name}")
    scenario = work / f"uac-speech-payment-{codec}.xml"
    scenario.write_text(text)
    return scenario


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Provider]]:
    work = tmp_path_factory.mktemp("speech")
    provider = Provider(work / "provider").start()
    server = Server(work / "server", env_overrides=provider.tool_env()).start()
    try:
        runs = [
            Sipp(str(_scenario(codec, work)), server.sip_target, work / codec, timeout_s=50)
            for codec in CODECS
        ]
        for run in runs:
            run.start()
        for run in runs:
            assert run.wait() == 0, run.errors()
        wait_for(lambda: len([s for s in server.sessions() if s["ended"]]) == 2 or None, 20,
                 "both sessions to end")  # fmt: skip
        yield server, provider
    finally:
        server.stop()
        provider.stop()


def _session(server: Server, codec: str) -> dict[str, Any]:
    (call_id,) = [
        e["call_id"] for e in server.log_events()
        if e.get("event") == "call.media" and e["codec"].lower() == codec
    ]  # fmt: skip
    (session,) = [s for s in server.sessions() if s["session_id"] == call_id]
    return session


def _said(session: dict[str, Any]) -> list[dict[str, Any]]:
    return [e["payload"] for e in session["events"] if e["type"] == "caller_said"]


def test_both_calls_pay_59_cents_once_each(calls: tuple[Server, Provider]) -> None:
    server, provider = calls
    charges = provider.charges()
    assert sorted((c["amount_cents"], c["currency"]) for c in charges) == [(59, "EUR")] * 2
    assert len({c["key"] for c in charges}) == 2
    assert server.metric("voicegate_tool_calls_total", tool="charge", outcome="committed") == 2
    # Per call: the payment's "yes" and the "yes" to ending the call.
    assert server.metric("voicegate_caller_said_total", decision="confirmed") == 4
    assert server.metric("voicegate_caller_said_total", decision="rejected") >= 2


@pytest.mark.parametrize("codec", list(CODECS))
def test_the_log_shows_what_the_caller_said_and_the_spoken_yes_before_the_charge(
    calls: tuple[Server, Provider], codec: str
) -> None:
    server, _ = calls
    session = _session(server, codec)
    said = _said(session)
    decisions = [(s["grammar"], s["decision"]) for s in said]
    # The weather is not in the menu's grammar: a re-prompt, and nothing else happened.
    assert decisions[0] == ("menu", "rejected"), said
    assert ("menu", "accepted") in decisions
    assert said[decisions.index(("menu", "accepted"))]["text"] == "make a payment"
    if codec == "g722":
        (amount,) = [s for s in said if s["grammar"] == "amount"]
        assert (amount["text"], amount["decision"]) == ("fifty nine cents", "accepted")
    yes, end = [s for s in said if s["decision"] == "confirmed"]
    assert yes["grammar"] == "confirm" and 0 < yes["confidence"] <= 1
    types = [e["type"] for e in session["events"]]
    confirmed_at = next(
        i for i, e in enumerate(session["events"])
        if e["type"] == "caller_said" and e["payload"]["decision"] == "confirmed"
    )  # fmt: skip
    assert confirmed_at < types.index("approval_given") < types.index("tool_intent")
    (intent,) = [e["payload"] for e in session["events"] if e["type"] == "tool_intent"]
    assert intent["arguments"]["amount_cents"] == 59
    (receipt,) = [e["payload"] for e in session["events"] if e["type"] == "tool_receipt"]
    assert receipt["outcome"] == "committed"
    # "hang up", asked whether to end the call, then "yes": the server said goodbye, hung up.
    # (The two yeses may be equal to the letter: same voice, word and score.)
    assert said[-1] is end and end["grammar"] == "confirm"
    bye = said[-2]
    assert (bye["grammar"], bye["decision"]) == ("menu", "accepted")
    assert bye["text"] in ("goodbye", "bye", "hang up")
    assert session["ended"]["terminal_state"] == "completed"

