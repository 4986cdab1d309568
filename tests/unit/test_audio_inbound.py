"""The inbound pipeline: call-rate frames in, agent-rate frames and VAD events out."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from audio.evidence_vad import EvidenceVad
from audio.frame import FrameError, samples_per_frame
from audio.inbound import InboundPipeline, InboundResult
from audio.vad import SpeechStarted, SpeechStopped, VadConfig, VoiceActivity
from tests.fixtures.speech import pcap_speech


def sweep(rate: int, f0: float, f1: float, seconds: float = 2.0) -> NDArray[np.int16]:
    """A linear chirp at half scale, faded in and out over 20 ms."""
    t = np.arange(round(rate * seconds)) / rate
    phase = 2 * np.pi * (f0 * t + (f1 - f0) / (2 * seconds) * t**2)
    fade = np.clip(np.minimum(t, seconds - t) / 0.02, 0, 1)
    return np.rint(16384 * np.sin(phase) * fade).astype(np.int16)


def snr_db(reference: NDArray[np.int16], actual: NDArray[np.int16], skip: int) -> float:
    ref = reference[skip:-skip].astype(np.float64)
    err = actual[skip:-skip].astype(np.float64) - ref
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum(err**2), 1e-9)))


def run(pipeline: InboundPipeline, x: NDArray[np.int16]) -> list[InboundResult]:
    size = samples_per_frame(pipeline.call_rate)
    return [
        pipeline.process(x[at : at + size].tobytes(), at)
        for at in range(0, len(x) - size + 1, size)
    ]


def joined(results: list[InboundResult]) -> NDArray[np.int16]:
    frames = [r.frame_for_agent for r in results]
    return np.concatenate([f.samples for f in frames if f is not None])


@pytest.mark.parametrize(
    ("call_rate", "agent_rate"), [(8000, 16000), (16000, 8000), (8000, 48000), (48000, 16000)]
)
def test_agent_frames_are_20_ms_at_the_agent_rate_on_a_continuous_clock(
    call_rate: int, agent_rate: int
) -> None:
    results = run(InboundPipeline(call_rate, agent_rate), sweep(call_rate, 200, 3000, 0.5))
    size = samples_per_frame(agent_rate)
    assert len(results) == 25
    for i, result in enumerate(results):
        frame = result.frame_for_agent
        assert frame is not None
        assert (frame.rate, len(frame), frame.timestamp) == (agent_rate, size, i * size)


@pytest.mark.parametrize(("call_rate", "agent_rate"), [(8000, 16000), (16000, 8000)])
def test_a_tone_sweep_survives_a_round_trip_through_two_pipelines(
    call_rate: int, agent_rate: int
) -> None:
    top = 0.85 * min(call_rate, agent_rate) / 2 * 0.95  # inside both pass bands
    x = sweep(call_rate, 200, top)
    there = InboundPipeline(call_rate, agent_rate)
    back = InboundPipeline(agent_rate, call_rate)
    y = joined(run(back, joined(run(there, x))))
    assert len(y) == len(x)
    # Each stage's delay is counted at its output rate.
    delay = there.delay * call_rate // agent_rate + back.delay
    assert delay > 0
    assert snr_db(x[: len(x) - delay], y[delay:], skip=call_rate // 10) > 30
    # Without the delay compensation the signals do not line up: this comparison can fail.
    assert snr_db(x[: len(x) - delay], y[: len(y) - delay], skip=call_rate // 10) < 10


def test_equal_rates_pass_the_callers_samples_through_untouched() -> None:
    pipeline = InboundPipeline(16000, 16000)
    x = sweep(16000, 100, 7000, 0.4)
    assert pipeline.delay == 0
    assert np.array_equal(joined(run(pipeline, x)), x)


@pytest.mark.parametrize("detector", ["evidence", "verdicts"])
def test_vad_runs_on_the_call_rate_audio_with_the_configured_settings(detector: str) -> None:
    speech = np.concatenate([pcap_speech(), np.zeros(8000, dtype=np.int16)])
    config = VadConfig(aggressiveness=3, onset_ms=40, hangover_ms=200, detector=detector)
    results = run(InboundPipeline(8000, 16000, config), speech)
    reference = (EvidenceVad if detector == "evidence" else VoiceActivity)(8000, config)
    expected = [
        reference.process_pcm(speech[at : at + 160].tobytes(), at)
        for at in range(0, len(speech) - 159, 160)
    ]
    got = [r.vad_event for r in results]
    assert got == expected
    kinds = [type(e) for e in got if e is not None]
    assert kinds[0] is SpeechStarted and kinds[-1] is SpeechStopped
    # Event timestamps are at the call rate, agent frames at the agent rate.
    first = next(r for r in results if r.vad_event is not None)
    assert first.vad_event is not None
    assert first.vad_event.rate == 8000
    assert first.frame_for_agent is not None
    assert first.vad_event.detected_at_ms == pytest.approx(first.frame_for_agent.timestamp_ms + 20)


def test_speech_ms_reports_the_vads_segment_speech() -> None:
    speech = pcap_speech()
    results = run(InboundPipeline(8000), speech)
    assert max(r.speech_ms for r in results) > 1000
    assert results[0].speech_ms == 0


@pytest.mark.parametrize("size", [0, 318, 322, 640])
def test_a_frame_that_is_not_20_ms_at_the_call_rate_is_refused(size: int) -> None:
    with pytest.raises(FrameError, match="320 bytes"):
        InboundPipeline(8000).process(bytes(size), 0)


def test_unsupported_rates_are_refused_by_name() -> None:
    with pytest.raises(FrameError, match="agent_rate"):
        InboundPipeline(8000, 22050)
    with pytest.raises(FrameError, match="call_rate"):
        InboundPipeline(11025)


def test_frames_and_time_are_counted_for_the_metrics() -> None:
    pipeline = InboundPipeline(8000)
    assert pipeline.mean_us == 0.0
    run(pipeline, sweep(8000, 200, 3000, 0.2))
    assert pipeline.frames == 10
    assert pipeline.total_ns > 0


def test_without_an_agent_to_feed_no_frame_is_built_and_vad_is_the_same() -> None:
    speech = pcap_speech()
    size = samples_per_frame(8000)
    fed, unfed = InboundPipeline(8000, 16000), InboundPipeline(8000, 16000)
    events = 0
    for at in range(0, len(speech) - size + 1, size):
        pcm = speech[at : at + size].tobytes()
        with_frame, without = fed.process(pcm, at), unfed.process(pcm, at, for_agent=False)
        assert with_frame.frame_for_agent is not None
        assert without.frame_for_agent is None
        assert without.vad_event == with_frame.vad_event
        assert without.speech_ms == with_frame.speech_ms
        events += without.vad_event is not None
    assert events >= 1  # the speech started, so the two were compared on an event
