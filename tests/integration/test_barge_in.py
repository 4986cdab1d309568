"""Barge-in end to end: SIPp talks over the greeting; the RTP the server sent shows the prompt
stop within the configured latency and never come back, and the session records what was heard."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import ServerFactory, Sipp, wait_for
from tests.integration.rtp_capture import Capture, barge_in

LOUD = 300.0  # RMS of a 20 ms A-law frame of prompt audio (silence decodes to +-8)
VOICE = 60.0  # RMS from which the caller's capture counts as speech (its lead-in is +-8)
# Configured: speech must hold audio.barge_in_min_speech_ms (60) of evidence, the VAD's onset
# (60 ms) included, before the cut; the bound keeps the older 120 as headroom. On top come SIPp's
# 20 ms packets, PJSIP's jitter buffer and the audio tick, which batches the frames VAD sees
# (audio.tick_ms, 60 ms; audio.barge_in_tick_ms, 20 ms, once the caller's speech stirs the VAD).
MIN_SPEECH_MS = 120
JITTER_AND_TICKS_MS = 250


# Both media ports: the C one (the default) and pjsua2's Python port it falls back to.
@pytest.mark.parametrize("media_port", ["c", "python"])
def test_speech_over_the_greeting_cuts_it_for_good(
    server_factory: ServerFactory, tmp_path: Path, media_port: str
) -> None:
    server = server_factory(VOICEGATE_MEDIA_PORT=media_port)
    assert server.metric("voicegate_c_media_port") == (1 if media_port == "c" else 0)
    # The C port runs the evidence detector on the clock thread too; the Python port in Python.
    assert server.metric("voicegate_c_detector") == (1 if media_port == "c" else 0)
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        sipp = Sipp("uac-barge-in.xml", server.sip_target, tmp_path)
        assert sipp.run() == 0, sipp.errors()
    finally:
        packets = capture.stop()
    (session,) = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]] or None, 10, "the session to end"
    )

    captured = barge_in(packets, range(server.rtp_min, server.rtp_max + 1), loud=LOUD, voice=VOICE)
    sent, onset, speech_end, cut = captured.sent, captured.onset, captured.speech_end, captured.cut

    prompt_before = [p for p in sent if p.at < onset and p.rms > LOUD]
    assert prompt_before, "the greeting was playing when the caller started talking"
    latency_ms = (cut - onset) * 1000
    assert latency_ms <= 60 + MIN_SPEECH_MS + JITTER_AND_TICKS_MS, latency_ms
    # Never resumed while the caller kept talking: only silence until the speech ended.
    resumed = [p for p in sent if cut < p.at <= speech_end and p.rms > LOUD]
    assert resumed == [], f"{len(resumed)} loud frames after the cut at {cut:.3f}"

    events = session["events"]
    # One barge-in. A response still playing when the caller hangs up is recorded cut too,
    # just before caller_hangup (issue 35): that one is not the caller's speech.
    cuts = [
        e
        for e in events
        if e["type"] == "response_interrupted" and events[e["seq"]]["type"] != "caller_hangup"
    ]
    assert len(cuts) == 1, [e["type"] for e in events]
    heard_ms = cuts[0]["payload"]["heard_ms"]
    # About the two seconds of greeting before the caller spoke; far less than the prompt.
    assert 1500 <= heard_ms <= 3000, heard_ms
    effects = [x["kind"] for x in cuts[0]["effects"]]
    assert effects == ["clear_playout", "notify_agent"]
    # After the caller stopped, the menu was offered again as a new response.
    types = [e["type"] for e in events]
    assert types.index("response_interrupted") < len(types) - 1 - types[::-1].index(
        "response_started"
    )
    # Judged once the caller's turn was committed: a confirmed barge-in, not a false one.
    assert server.metric("voicegate_barge_ins_total", reason="speech", outcome="confirmed") == 1
    assert server.metric("voicegate_barge_ins_total", reason="speech", outcome="false") == 0
    judged = [e for e in events if e["type"] == "barge_in_judged"]
    assert [e["payload"]["outcome"] for e in judged] == ["confirmed"]
    assert server.metric("voicegate_stale_frames_dropped_total") == 0
    assert server.metric("voicegate_barge_in_latency_seconds_count") == 1
