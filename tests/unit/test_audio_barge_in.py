"""Barge-in decisions: a cough does not cut the agent off, a sentence does, once, and only while
something plays. First with VAD events written out, then with real speech through the pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from audio.barge_in import (
    BargeIn,
    BargeInConfig,
    BargeInConfigError,
    Interrupt,
    latency_ms,
    onset_ns,
)
from audio.inbound import InboundPipeline
from audio.playout import Interrupted, Playout
from audio.vad import SpeechStarted, SpeechStopped, VadConfig
from tests.fixtures.speech import espeak, have_espeak, pcap_speech

needs_espeak = pytest.mark.skipif(not have_espeak(), reason="espeak-ng is not installed")

RATE = 8000
SPF = 160


def started(frame: int, onset_frames: int = 3) -> SpeechStarted:
    return SpeechStarted((frame - onset_frames + 1) * SPF, RATE, (frame + 1) * SPF)


def stopped(frame: int, hangover_frames: int = 15) -> SpeechStopped:
    return SpeechStopped((frame - hangover_frames + 1) * SPF, RATE, (frame + 1) * SPF)


# --- the rules, with VAD output written out -------------------------------------------------


def test_speech_onset_during_playback_interrupts_at_once_when_the_onset_is_long_enough() -> None:
    barge = BargeIn(BargeInConfig(min_speech_ms=60))
    assert barge.on_frame(None, 0, "r1") is None
    decision = barge.on_frame(started(10), 60, "r1")
    assert decision == Interrupt("speech", 8 * SPF, "r1")


def test_cough_length_speech_does_not_trigger_and_longer_speech_does() -> None:
    barge = BargeIn(BargeInConfig(min_speech_ms=100))
    # A cough: the VAD (onset 20 ms) starts, 40 ms of speech, then the hangover stops it.
    assert barge.on_frame(started(10, 1), 20, "r1") is None
    assert barge.on_frame(None, 40, "r1") is None
    for _ in range(10):
        assert barge.on_frame(None, 40, "r1") is None
    assert barge.on_frame(stopped(30, 10), 0, "r1") is None
    # A sentence: the decision comes on the frame that brings the segment to 100 ms.
    assert barge.on_frame(started(50, 1), 20, "r1") is None
    assert barge.on_frame(None, 40, "r1") is None
    assert barge.on_frame(None, 60, "r1") is None
    assert barge.on_frame(None, 80, "r1") is None
    assert barge.on_frame(None, 100, "r1") == Interrupt("speech", 50 * SPF, "r1")


def test_no_trigger_while_nothing_plays() -> None:
    barge = BargeIn()
    assert barge.on_frame(started(10), 60, None) is None
    for n in range(20):
        assert barge.on_frame(None, 80 + 20 * n, None) is None
    assert barge.on_dtmf(5000, None) is None


def test_speech_that_began_before_the_response_is_not_a_barge_in() -> None:
    barge = BargeIn()
    assert barge.on_frame(started(10), 60, None) is None
    # The agent starts talking while the caller's segment goes on.
    assert barge.on_frame(None, 200, "r1") is None
    assert barge.on_frame(stopped(40), 0, "r1") is None
    # The caller's next segment, during the response, does interrupt.
    assert barge.on_frame(started(60), 60, "r1") == Interrupt("speech", 58 * SPF, "r1")


def test_one_trigger_per_response() -> None:
    barge = BargeIn()
    assert barge.on_frame(started(10), 60, "r1") is not None
    assert barge.on_frame(None, 80, "r1") is None
    assert barge.on_frame(stopped(40), 0, "r1") is None
    assert barge.on_frame(started(60), 60, "r1") is None
    assert barge.on_dtmf(100 * SPF, "r1") is None
    assert barge.on_frame(None, 80, "r2") is None  # the segment belongs to r1
    assert barge.on_frame(stopped(90), 0, None) is None
    assert barge.on_frame(started(100), 60, "r2") == Interrupt("speech", 98 * SPF, "r2")


@pytest.mark.parametrize(("enabled", "dtmf"), [(True, True), (True, False), (False, True)])
def test_dtmf_interrupts_only_when_enabled(enabled: bool, dtmf: bool) -> None:
    barge = BargeIn(BargeInConfig(enabled=enabled, dtmf=dtmf))
    decision = barge.on_dtmf(4000, "r1")
    if enabled and dtmf:
        assert decision == Interrupt("dtmf", 4000, "r1")
    else:
        assert decision is None


def test_disabled_barge_in_never_interrupts() -> None:
    barge = BargeIn(BargeInConfig(enabled=False))
    assert barge.on_frame(started(10), 60, "r1") is None
    assert barge.on_frame(None, 5000, "r1") is None


@pytest.mark.parametrize("value", [-1, 10_001])
def test_config_validation_names_the_field(value: int) -> None:
    with pytest.raises(BargeInConfigError, match="min_speech_ms"):
        BargeInConfig(min_speech_ms=value)


def test_latency_runs_from_the_onset_to_the_end_of_the_last_agent_frame() -> None:
    event = SpeechStarted(timestamp=800, rate=RATE, detected_at=1280)  # onset 60 ms before
    onset = onset_ns(detected_ns=1_000_000_000, onset_timestamp=800, detected_at=1280, rate=RATE)
    assert onset == 940_000_000
    assert event.detected_at_ms - event.timestamp_ms == 60
    assert latency_ms(onset, last_audio_pull_ns=980_000_000) == 60.0
    assert latency_ms(onset, last_audio_pull_ns=900_000_000) == 0.0  # already silent


# --- real speech through the inbound pipeline, against a playing response -------------------


def noisy(x: NDArray[np.int16], seed: int = 5) -> NDArray[np.int16]:
    floor = np.random.default_rng(seed).normal(0, 32768 * 10 ** (-60 / 20), len(x))
    return np.clip(x + floor, -32768, 32767).astype(np.int16)


def run_call(caller: NDArray[np.int16], vad: VadConfig, barge: BargeInConfig) -> list[Interrupt]:
    """Media ticks: the caller's frame goes through the pipeline while the agent plays."""
    pipeline = InboundPipeline(RATE, 16000, vad)
    barge_in = BargeIn(barge)
    playout = Playout(RATE)
    playout.begin("r1", 0)
    playout.admit("r1", 0, np.full(len(caller), 1000, dtype=np.int16))
    playout.finish("r1")
    decisions = []
    for at in range(0, len(caller) - SPF + 1, SPF):
        playout.pull()
        result = pipeline.process(caller[at : at + SPF].tobytes(), at)
        decision = barge_in.on_frame(result.vad_event, result.speech_ms, playout.playing)
        if decision is not None:
            decisions.append(decision)
            assert playout.interrupt(playout.generation + 1) == [
                Interrupted("r1", playout.heard_ms("r1"))
            ]
    return decisions


@needs_espeak
@pytest.mark.parametrize("cough_ms", [20, 40, 60])
def test_a_cough_length_burst_of_real_speech_does_not_cut_the_agent_off(cough_ms: int) -> None:
    speech = espeak("Ah, well", RATE)
    start = int(np.argmax(np.abs(speech) > 3000))
    burst = speech[start : start + RATE * cough_ms // 1000]
    caller = noisy(np.concatenate([np.zeros(RATE), burst, np.zeros(RATE)]))
    # The VAD reacts fast (onset 20 ms); barge-in wants 100 ms of speech.
    vad, barge = VadConfig(onset_ms=20), BargeInConfig(min_speech_ms=100)
    assert run_call(caller, vad, barge) == []


@needs_espeak
def test_a_real_sentence_cuts_the_agent_off_once_near_its_onset() -> None:
    speech = espeak("Stop, I want to talk to a person.", RATE)
    caller = noisy(np.concatenate([np.zeros(RATE), speech, np.zeros(RATE)]))
    decisions = run_call(caller, VadConfig(onset_ms=20), BargeInConfig(min_speech_ms=100))
    assert len(decisions) == 1
    # The speech edge from energy on the clean signal (10 ms windows over -45 dBFS).
    windows = speech[: len(speech) // 80 * 80].astype(np.float64).reshape(-1, 80)
    level = 10 * np.log10(np.mean(windows**2, axis=1) + 1e-9) - 20 * np.log10(32768)
    edge = RATE + 80 * int(np.argmax(level > -45))
    assert abs(decisions[0].onset_timestamp - edge) <= 2 * SPF


def test_phone_speech_from_the_sipp_capture_barges_in_with_the_defaults() -> None:
    decisions = run_call(pcap_speech(), VadConfig(), BargeInConfig())
    assert len(decisions) == 1
    assert decisions[0].reason == "speech"
    # The capture's speech begins after 0.6 s of A-law's quietest code.
    assert 0.55 <= decisions[0].onset_timestamp / RATE <= 0.7


# --- armed: whether the runtime should take the next frames at the barge-in pace ------------


def test_armed_only_while_speech_could_still_cut_what_plays() -> None:
    barge = BargeIn(BargeInConfig(min_speech_ms=100))
    assert not barge.armed(None)  # nothing plays
    assert barge.armed("r1")
    assert barge.on_frame(started(10, 1), 20, "r1") is None
    assert barge.armed("r1")  # a segment over r1, not long enough yet
    assert not barge.armed("r2")  # the segment began over r1: it cannot cut r2
    for speech_ms in (40, 60, 80):
        assert barge.on_frame(None, speech_ms, "r1") is None
    assert barge.on_frame(None, 100, "r1") == Interrupt("speech", 10 * SPF, "r1")
    assert not barge.armed("r1")  # cut already: nothing left to decide
    assert barge.on_frame(stopped(40, 10), 0, None) is None
    assert barge.armed("r2")


def test_never_armed_with_barge_in_disabled() -> None:
    assert not BargeIn(BargeInConfig(enabled=False)).armed("r1")
