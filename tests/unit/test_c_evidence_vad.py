"""The C media port's evidence detector (telephony/evidence_vad.c) decides as audio/evidence_vad.py.

The C port runs the detector on PJSIP's clock thread in place of the Python class, so every
frame must come out the same: the event, its timestamp, ``speech_ms`` after it and ``stirring``.
The frames go through ``vg_port_tick``, the port's own callbacks as the bridge calls them, and
the records come back through ``vg_port_drain`` as asyncio takes them. The audio is the caller
clips of tests/fixtures/vad (speech over four noises, noise alone), cut, scaled and spliced with
digital silence by hypothesis, under configurations drawn from every setting the detector has.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from audio.evidence_vad import EvidenceVad
from audio.vad import SpeechStarted, SpeechStopped, VadConfig
from telephony.c_media_port import CPortLibrary, CRing, detector_config, vad_check_signal
from tests.unit.test_audio_evidence_vad import INDEX, SPEECH, clip

LIB = CPortLibrary.load()
CLIPS = {name: clip(name) for name in sorted(INDEX)}


def c_ring(rate: int, config: VadConfig) -> tuple[int, CRing]:
    port = LIB.new_port("detector", rate)
    ring = CRing(LIB, port, LIB.vg.vg_port_attach(port), rate // 50 * 2)
    assert ring.detect(config), "the C detector did not start"
    return port, ring


Verdict = tuple[int, int, int, int, bool]
"""Per frame: event kind (0 none, 1 started, 2 stopped), its timestamp, its detected_at,
speech_ms after the frame, stirring after the frame."""


def python_verdicts(samples: NDArray[np.int16], rate: int, config: VadConfig) -> list[Verdict]:
    vad = EvidenceVad(rate, config)
    step = rate // 50
    out: list[Verdict] = []
    for at in range(0, len(samples) - step + 1, step):
        event = vad.process_pcm(samples[at : at + step].tobytes(), at)
        kind = 1 if isinstance(event, SpeechStarted) else 0
        kind = 2 if isinstance(event, SpeechStopped) else kind
        when = (event.timestamp, event.detected_at) if event is not None else (0, 0)
        out.append((kind, *when, vad.speech_ms, vad.stirring))
    return out


def c_verdicts(samples: NDArray[np.int16], rate: int, config: VadConfig) -> list[Verdict]:
    port, ring = c_ring(rate, config)
    step = rate // 50
    out: list[Verdict] = []
    sink = ctypes.create_string_buffer(step * 2)
    for at in range(0, len(samples) - step + 1, step):
        LIB.vg.vg_port_tick(port, sink, samples[at : at + step].tobytes())
        frames, records, _ = ring.drain(pcm=False)
        assert frames == [] and len(records) in (0, 4)
        if records:
            index, kind, timestamp, speech_ms = records
            assert index == at // step
        else:
            kind = timestamp = speech_ms = 0
        detected = at + step if kind else 0
        out.append((kind, timestamp, detected, speech_ms, ring.stirring))
    return out


def configs() -> st.SearchStrategy[VadConfig]:
    return st.builds(
        VadConfig,
        aggressiveness=st.integers(0, 3),
        onset_ms=st.sampled_from([20, 40, 60, 100, 200]),
        hangover_ms=st.sampled_from([20, 100, 300, 700]),
        warmup_ms=st.sampled_from([0, 20, 200, 500]),
        margin_db=st.floats(0.0, 20.0, allow_nan=False),
        window_ms=st.sampled_from([20, 100, 160, 400]),
        floor_rise_db_s=st.floats(0.1, 20.0, allow_nan=False),
    )


@st.composite
def spliced(
    draw: st.DrawFn,
    clips: dict[str, NDArray[np.int16]],
    most: int,
    gains: tuple[float, ...],
    longest_gap: int,
) -> NDArray[np.int16]:
    """A caller's line: up to ``most`` pieces of ``clips`` at one of ``gains`` each, some with
    digital silence after them (up to ``longest_gap`` samples)."""
    pieces = []
    for _ in range(draw(st.integers(1, most))):
        samples = clips[draw(st.sampled_from(sorted(clips)))]
        start = draw(st.integers(0, len(samples) - 800))
        length = draw(st.integers(800, len(samples) - start))
        gain = draw(st.sampled_from(gains))
        piece = np.clip(samples[start : start + length] * gain, -32768, 32767)
        pieces.append(piece.astype(np.int16))
        if draw(st.booleans()):
            pieces.append(np.zeros(draw(st.integers(1, longest_gap)), dtype=np.int16))
    return np.concatenate(pieces)


def lines() -> st.SearchStrategy[NDArray[np.int16]]:
    """Every clip, quiet to loud, with short gaps."""
    return spliced(CLIPS, 4, (0.05, 0.3, 1.0, 2.5), 2000)


@settings(max_examples=300, deadline=None)
@given(line=lines(), config=configs(), wide=st.booleans())
def test_the_c_detector_decides_every_frame_as_the_python_one(
    line: NDArray[np.int16], config: VadConfig, wide: bool
) -> None:
    rate = 16000 if wide else 8000
    samples = np.repeat(line, 2) if wide else line
    c = c_verdicts(samples, rate, config)
    assert c == python_verdicts(samples, rate, config)
    event(f"speech started: {any(v[0] == 1 for v in c)}")


@pytest.mark.parametrize("name", sorted(k for k, v in INDEX.items() if v["onset_ms"] is not None))
def test_speech_over_each_noise_starts_and_stops_alike(name: str) -> None:
    # The comparison above could pass on lines where nothing ever starts: here, speech over each
    # noise starts and stops in both, on the same frames.
    samples = np.concatenate([CLIPS[name], np.zeros(8000, dtype=np.int16)])
    c = c_verdicts(samples, 8000, VadConfig())
    assert c == python_verdicts(samples, 8000, VadConfig())
    kinds = [v[0] for v in c if v[0]]
    assert kinds[:1] == [1] and kinds[-1:] == [2], f"speech did not start and stop: {kinds}"


def test_what_only_python_runs_is_not_taken_by_c() -> None:
    assert detector_config(VadConfig(detector="verdicts")) is None
    assert detector_config(VadConfig(frame_ms=30)) is None
    port = LIB.new_port("detector", 8000)
    ring = CRing(LIB, port, LIB.vg.vg_port_attach(port), 320)
    assert not ring.detect(VadConfig(detector="verdicts")) and not ring.detecting


def test_a_new_call_on_the_port_starts_the_detector_afresh() -> None:
    # The port is reused call after call: its next call's detector must not remember the last
    # caller's floor or speech.
    speech = CLIPS[sorted(k for k, v in INDEX.items() if v["onset_ms"] is not None)[0]]
    port, ring = c_ring(8000, VadConfig())
    sink = ctypes.create_string_buffer(320)
    for at in range(0, 8000 + 160, 160):  # into the speech, which starts 1 s in
        LIB.vg.vg_port_tick(port, sink, speech[at : at + 160].tobytes())
    ring.drain(pcm=False)
    stale = ring
    ring = CRing(LIB, port, LIB.vg.vg_port_attach(port), 320)
    assert stale.drain(pcm=False) == ([], [], []), "the last call's ring still drains"
    assert ring.detect(VadConfig())
    expected = python_verdicts(speech, 8000, VadConfig())
    got = []
    for at in range(0, len(speech) - 159, 160):
        LIB.vg.vg_port_tick(port, sink, speech[at : at + 160].tobytes())
        _, records, _ = ring.drain(pcm=False)
        got.append(records[1] if records else 0)
    assert got == [v[0] for v in expected]


def test_the_caller_frames_come_along_only_when_asked_and_time_is_counted() -> None:
    port, ring = c_ring(8000, VadConfig())
    line = CLIPS[sorted(CLIPS)[0]]
    sink = ctypes.create_string_buffer(320)
    for at in (0, 160, 320):
        LIB.vg.vg_port_tick(port, sink, line[at : at + 160].tobytes())
    frames, _, timing = ring.drain(pcm=True)
    assert frames == [line[at : at + 160].tobytes() for at in (0, 160, 320)]
    assert sum(timing[:-1]) == 3 and timing[-1] > 0
    LIB.vg.vg_port_tick(port, sink, line[480:640].tobytes())
    frames, _, timing = ring.drain(pcm=False)
    assert frames == [] and sum(timing[:-1]) == 1 and ring.rx_frames == 4


@settings(max_examples=100, deadline=None)
@given(line=lines(), marks=st.lists(st.sampled_from([0, 20, 60, 120, 400]), max_size=4))
def test_with_marks_a_speaking_frame_is_recorded_only_where_speech_reaches_one(
    line: NDArray[np.int16], marks: list[int]
) -> None:
    # What voicegate/call/turns.py relies on to skip the frames between: every event, and each
    # frame whose speech_ms first reaches a mark within its segment (every speaking frame when
    # there are no marks).
    config = VadConfig()
    expected = []
    last = 0
    for index, (kind, timestamp, _, speech_ms, _) in enumerate(python_verdicts(line, 8000, config)):
        crossed = any(last < mark <= speech_ms for mark in marks) if marks else speech_ms > 0
        if kind or crossed:
            expected.append([index, kind, timestamp, speech_ms])
        last = speech_ms
    port, ring = c_ring(8000, config)
    if marks:
        ring.mark(tuple(marks))
    sink = ctypes.create_string_buffer(320)
    got = []
    for at in range(0, len(line) - 159, 160):
        LIB.vg.vg_port_tick(port, sink, line[at : at + 160].tobytes())
        _, records, _ = ring.drain(pcm=False)
        got.extend(records[i : i + 4] for i in range(0, len(records), 4))
    assert got == expected


def test_the_bound_webrtcvad_is_checked_against_the_python_binding_at_start() -> None:
    import _webrtcvad
    import webrtcvad

    assert LIB.detects and LIB._vad_disagrees() == ""
    # The check can tell: its signal gets both verdicts from webrtcvad in every mode.
    for rate in (8000, 16000):
        pcm = vad_check_signal(rate)
        step = rate // 50 * 2
        for mode in range(4):
            vad = webrtcvad.Vad(mode)
            verdicts = {vad.is_speech(pcm[i : i + step], rate) for i in range(0, len(pcm), step)}
            assert verdicts == {True, False}, (rate, mode)
    # A function bound as Process that takes other arguments: the check refuses the detector.
    wheel = ctypes.CDLL(_webrtcvad.__file__)
    names = ("Create", "Init", "set_mode", "ValidRateAndFrameLength", "Free")
    wrong = [ctypes.cast(getattr(wheel, f"WebRtcVad_{n}"), ctypes.c_void_p).value for n in names]
    try:
        assert LIB.vg.vg_vad_bind(*wrong) == 0
        assert "frames differ at 8000 Hz, mode 0" in LIB._vad_disagrees()
    finally:
        assert LIB._bind_webrtcvad()


def test_a_detector_the_port_refuses_to_restart_leaves_nothing_stirring() -> None:
    speech = CLIPS[SPEECH[0]]
    port, ring = c_ring(8000, VadConfig())
    sink = ctypes.create_string_buffer(320)
    for at in range(0, len(speech) - 159, 160):
        LIB.vg.vg_port_tick(port, sink, speech[at : at + 160].tobytes())
        ring.drain(pcm=False)
        if ring.stirring:
            break
    assert ring.stirring, "the speech clip never stirred the detector"
    refused = detector_config(VadConfig())
    assert refused is not None
    refused.aggressiveness = 7  # webrtcvad takes modes 0 to 3
    status = LIB.vg.vg_port_detect(port, ring._epoch, ctypes.byref(refused), None, 0)
    assert status == -2
    ring.drain(pcm=False)
    assert not ring.stirring
