"""Voice activity: events land at the speech edges within the configured onset and hangover.

Speech edges are found from energy on the clean signal (before noise is mixed in); the VAD sees
the noisy one. Real speech: espeak-ng rendered at test time and SIPp's A-law capture.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from audio.frame import Frame, samples_per_frame
from audio.vad import (
    SpeechStarted,
    SpeechStopped,
    VadConfig,
    VadConfigError,
    VadEvent,
    VoiceActivity,
)
from tests.fixtures.speech import espeak, have_espeak, pcap_speech

needs_espeak = pytest.mark.skipif(not have_espeak(), reason="espeak-ng is not installed")

SENTENCE = "Hello, I would like to check the status of my order please."


def noise(rate: int, seconds: float, dbfs: float, seed: int = 7) -> NDArray[np.int16]:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 32768 * 10 ** (dbfs / 20), round(rate * seconds))
    out: NDArray[np.int16] = np.clip(np.rint(x), -32768, 32767).astype(np.int16)
    return out


def silence(rate: int, seconds: float) -> NDArray[np.int16]:
    return np.zeros(round(rate * seconds), dtype=np.int16)


def mix(clean: NDArray[np.int16], floor: NDArray[np.int16]) -> NDArray[np.int16]:
    out: NDArray[np.int16] = np.clip(clean.astype(np.int32) + floor, -32768, 32767).astype(np.int16)
    return out


def energy_edges(clean: NDArray[np.int16], rate: int, dbfs: float = -45.0) -> list[tuple[int, int]]:
    """``(first, last + 1)`` sample of every 10 ms window run louder than ``dbfs``, runs closer
    than 200 ms merged (gaps inside words are not edges)."""
    w = rate // 100
    x = clean[: len(clean) // w * w].astype(np.float64).reshape(-1, w)
    loud = 10 * np.log10(np.mean(x**2, axis=1) + 1e-9) - 20 * np.log10(32768) > dbfs
    runs: list[tuple[int, int]] = []
    for i in np.flatnonzero(loud).tolist():
        if runs and i * w - runs[-1][1] < rate // 5:
            runs[-1] = (runs[-1][0], (i + 1) * w)
        else:
            runs.append((i * w, (i + 1) * w))
    return runs


def trimmed(x: NDArray[np.int16], rate: int) -> NDArray[np.int16]:
    """``x`` without the silence espeak-ng puts around a phrase."""
    edges = energy_edges(x, rate)
    return x[edges[0][0] : edges[-1][1]]


def frames_of(x: NDArray[np.int16], rate: int) -> Iterator[Frame]:
    size = samples_per_frame(rate)
    for at in range(0, len(x) - size + 1, size):
        yield Frame(x[at : at + size], rate, at)


def events(x: NDArray[np.int16], rate: int, config: VadConfig) -> list[VadEvent]:
    vad = VoiceActivity(rate, config)
    return [e for f in frames_of(x, rate) if (e := vad.process(f)) is not None]


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("aggressiveness", -1),
        ("aggressiveness", 4),
        ("frame_ms", 15),
        ("frame_ms", 40),
        ("onset_ms", 10),
        ("hangover_ms", 0),
        ("hangover_ms", 20_000),
        ("warmup_ms", -1),
    ],
)
def test_config_rejects_out_of_range_values_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(VadConfigError, match=field):
        VadConfig(**{field: value})


def test_onset_and_hangover_round_up_to_whole_vad_frames() -> None:
    config = VadConfig(frame_ms=30, onset_ms=60, hangover_ms=310)
    assert (config.onset_frames, config.hangover_frames) == (2, 11)
    assert VadConfig().onset_frames == 3


def test_a_rate_webrtcvad_cannot_take_is_refused() -> None:
    with pytest.raises(VadConfigError, match="22050"):
        VoiceActivity(22050)


# --- silence and noise ----------------------------------------------------------------------


@pytest.mark.parametrize("rate", [8000, 16000])
@pytest.mark.parametrize("frame_ms", [10, 20, 30])
@pytest.mark.parametrize("aggressiveness", [0, 1, 2, 3])
def test_digital_silence_gives_no_events(rate: int, frame_ms: int, aggressiveness: int) -> None:
    config = VadConfig(aggressiveness, frame_ms)
    assert events(silence(rate, 3), rate, config) == []


@pytest.mark.parametrize("rate", [8000, 16000])
@pytest.mark.parametrize("frame_ms", [20, 30])
@pytest.mark.parametrize("aggressiveness", [0, 1, 2, 3])
@pytest.mark.parametrize("dbfs", [-70.0, -60.0, -50.0])
def test_steady_low_noise_gives_no_events(
    rate: int, frame_ms: int, aggressiveness: int, dbfs: float
) -> None:
    config = VadConfig(aggressiveness, frame_ms)
    assert events(noise(rate, 4, dbfs), rate, config) == []


@pytest.mark.parametrize("rate", [8000, 16000])
def test_without_warmup_webrtcvad_calls_the_first_noise_speech(rate: int) -> None:
    # The reason warmup_ms exists: this test fails the day webrtcvad stops doing it.
    found = events(noise(rate, 2, -60.0), rate, VadConfig(warmup_ms=0))
    assert [type(e) for e in found] == [SpeechStarted, SpeechStopped]
    assert found[0].timestamp_ms < 60


def test_ten_ms_frames_need_a_longer_warmup() -> None:
    rate = 8000
    assert events(noise(rate, 3, -60.0), rate, VadConfig(frame_ms=10, warmup_ms=500)) == []


# --- speech edges ---------------------------------------------------------------------------


def utterance(rate: int, text: str = SENTENCE) -> tuple[NDArray[np.int16], NDArray[np.int16]]:
    """(clean, noisy): 1 s of line noise, the sentence, 1.5 s of line noise."""
    clean = np.concatenate([silence(rate, 1.0), espeak(text, rate), silence(rate, 1.5)])
    return clean, mix(clean, noise(rate, len(clean) / rate, -60.0))


def assert_edges(
    found: list[VadEvent], edges: list[tuple[int, int]], rate: int, config: VadConfig
) -> None:
    ms = 1000 / rate
    assert [type(e) for e in found] == [SpeechStarted, SpeechStopped] * len(edges)
    for (start, end), began, ended in zip(edges, found[::2], found[1::2], strict=True):
        # Started is dated at the first speech frame of the onset run, and decided exactly the
        # configured onset later.
        assert -config.frame_ms <= (began.timestamp - start) * ms <= 40
        assert began.detected_at - began.timestamp == config.onset_frames * config.frame_ms / ms
        # Stopped is dated at the first silent frame of the hangover; webrtcvad's own overhang
        # keeps calling the fading tail speech for up to ~200 ms (measured 80 to 180 here).
        assert -config.frame_ms <= (ended.timestamp - end) * ms <= 250
        assert ended.detected_at - ended.timestamp == config.hangover_frames * config.frame_ms / ms


@needs_espeak
@pytest.mark.parametrize("rate", [8000, 16000])
@pytest.mark.parametrize("frame_ms", [10, 20, 30])
@pytest.mark.parametrize("aggressiveness", [0, 1, 2, 3])
def test_onset_and_offset_land_within_onset_and_hangover_of_the_speech_edges(
    rate: int, frame_ms: int, aggressiveness: int
) -> None:
    clean, noisy = utterance(rate)
    edges = energy_edges(clean, rate)
    assert len(edges) == 1
    config = VadConfig(aggressiveness, frame_ms, warmup_ms=500)
    assert_edges(events(noisy, rate, config), edges, rate, config)


@needs_espeak
@pytest.mark.parametrize(("onset_ms", "hangover_ms"), [(20, 100), (100, 300), (200, 800)])
def test_onset_and_hangover_settings_move_the_decisions(onset_ms: int, hangover_ms: int) -> None:
    rate = 8000
    clean, noisy = utterance(rate)
    config = VadConfig(onset_ms=onset_ms, hangover_ms=hangover_ms)
    assert_edges(events(noisy, rate, config), energy_edges(clean, rate), rate, config)


@needs_espeak
def test_a_pause_shorter_than_the_hangover_does_not_stop_speech_a_longer_one_does() -> None:
    rate = 8000
    word = trimmed(espeak("Yes", rate), rate)
    gap = 0.15  # s: a pause inside a sentence
    clean = np.concatenate(
        [
            silence(rate, 1),
            word,
            silence(rate, gap),
            word,
            silence(rate, 1.0),
            word,
            silence(rate, 1),
        ]
    )
    noisy = mix(clean, noise(rate, len(clean) / rate, -60.0))
    found = events(noisy, rate, VadConfig(hangover_ms=400))
    # Two segments: the short pause is bridged, the 1 s one is not.
    assert [type(e) for e in found] == [SpeechStarted, SpeechStopped] * 2
    first_word_end = (rate + len(word)) * 1000 / rate
    assert found[1].timestamp_ms > first_word_end + gap * 1000
    # The same audio with a hangover shorter than the pause splits the first segment.
    split = events(noisy, rate, VadConfig(hangover_ms=60))
    assert len(split) == 6


@needs_espeak
def test_speech_straight_out_of_digital_silence_is_found_at_most_the_warmup_late() -> None:
    rate = 8000
    clean = np.concatenate([silence(rate, 1.0), espeak(SENTENCE, rate), silence(rate, 1.0)])
    (start, _), *_ = energy_edges(clean, rate)
    config = VadConfig()
    began = events(clean, rate, config)[0]
    assert isinstance(began, SpeechStarted)
    assert 0 <= began.timestamp_ms - start * 1000 / rate <= config.warmup_ms + config.frame_ms


@pytest.mark.parametrize("aggressiveness", [2, 3])
def test_phone_speech_from_the_sipp_capture(aggressiveness: int) -> None:
    rate = 8000
    speech = pcap_speech()
    # The capture: 0.6 s of A-law's quietest code, then speech to the end; add 1 s of silence.
    clean = np.concatenate([speech, silence(rate, 1.0)])
    edges = energy_edges(clean, rate, dbfs=-50.0)
    onset_edge, end_edge = edges[0][0], edges[-1][1]
    config = VadConfig(aggressiveness)
    found = events(clean, rate, config)
    assert isinstance(found[0], SpeechStarted)
    assert isinstance(found[-1], SpeechStopped)
    assert abs(found[0].timestamp - onset_edge) * 1000 / rate <= 40
    assert -config.frame_ms <= (found[-1].timestamp - end_edge) * 1000 / rate <= 250
    # Events alternate, whatever the speech does in between.
    assert all(type(a) is not type(b) for a, b in itertools.pairwise(found))


# --- hysteresis, with webrtcvad's verdicts scripted -------------------------------------------


class ScriptedVad:
    """Stands in for ``webrtcvad.Vad``: returns the given verdicts in order."""

    def __init__(self, verdicts: list[bool]) -> None:
        self._verdicts = iter(verdicts)

    def is_speech(self, pcm: bytes, rate: int) -> bool:
        return next(self._verdicts)


def scripted_events(
    verdicts: list[bool], config: VadConfig, rate: int = 8000
) -> tuple[list[VadEvent], int]:
    vad = VoiceActivity(rate, config)
    vad._vad = ScriptedVad(verdicts)
    step = samples_per_frame(rate, config.frame_ms)
    media = samples_per_frame(rate)
    n_media = len(verdicts) * step // media
    found = []
    for i in range(n_media):
        frame = Frame(np.ones(media, dtype=np.int16), rate, i * media)
        if (event := vad.process(frame)) is not None:
            found.append(event)
    return found, step


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.booleans(), min_size=0, max_size=300),
    st.sampled_from([10, 20, 30]),
    st.integers(20, 120),
    st.integers(20, 200),
)
def test_events_follow_the_hysteresis_rules_for_any_verdicts(
    verdicts: list[bool], frame_ms: int, onset_ms: int, hangover_ms: int
) -> None:
    config = VadConfig(frame_ms=frame_ms, onset_ms=onset_ms, hangover_ms=hangover_ms, warmup_ms=0)
    verdicts = verdicts[: len(verdicts) // 6 * 6]  # whole media frames for every frame size
    found, step = scripted_events(verdicts, config)
    onset, hangover = config.onset_frames, config.hangover_frames
    # Alternating, starting with a start.
    assert all(
        isinstance(e, SpeechStarted if i % 2 == 0 else SpeechStopped) for i, e in enumerate(found)
    )
    text = "".join("s" if v else "." for v in verdicts)
    previous_end = 0
    for event in found:
        first, decided = event.timestamp // step, event.detected_at // step
        want = "s" if isinstance(event, SpeechStarted) else "."
        run = onset if isinstance(event, SpeechStarted) else hangover
        # The run that decided it: exactly `run` verdicts of the new kind, dated at its first.
        assert text[first:decided] == want * run
        # No earlier run of that length since the previous decision: it was decided at once.
        assert want * run not in text[previous_end : decided - 1]
        previous_end = decided
    # And nothing left undecided at the end.
    opposite = "." * hangover if len(found) % 2 else "s" * onset
    assert opposite not in text[previous_end:]


def test_speech_ms_counts_loud_speech_verdicts_of_the_current_segment_only() -> None:
    config = VadConfig(onset_ms=40, hangover_ms=60, warmup_ms=0)
    # (webrtcvad's verdict, frame level): quiet frames at the noise floor, loud ones 40 dB up.
    script = [
        (False, 10),
        (True, 1000),
        (True, 1000),  # onset complete: 40 ms
        (False, 10),  # hangover starts, adds nothing
        (True, 1000),  # speech again: 60
        (True, 10),  # webrtcvad's own overhang: speech by verdict, but at the floor
        (True, 12),
        (False, 10),
        (False, 10),
        (False, 10),  # stopped
        (True, 1000),
    ]
    vad = VoiceActivity(8000, config)
    vad._vad = ScriptedVad([verdict for verdict, _ in script])
    seen = []
    for i, (_, level) in enumerate(script):
        vad.process(Frame(np.full(160, level, dtype=np.int16), 8000, i * 160))
        seen.append(vad.speech_ms)
    assert seen == [0, 0, 40, 40, 60, 60, 60, 60, 60, 0, 0]


@needs_espeak
@pytest.mark.parametrize("burst_ms", [20, 40, 100, 300])
def test_speech_ms_of_a_short_burst_is_its_length_not_webrtcvads_overhang(burst_ms: int) -> None:
    rate = 8000
    speech = trimmed(espeak("Ah, well", rate), rate)
    clean = np.concatenate(
        [silence(rate, 1.0), speech[: rate * burst_ms // 1000], silence(rate, 1.0)]
    )
    noisy = mix(clean, noise(rate, len(clean) / rate, -60.0))
    vad = VoiceActivity(rate, VadConfig(onset_ms=20))
    peak = 0
    for frame in frames_of(noisy, rate):
        vad.process(frame)
        peak = max(peak, vad.speech_ms)
    # webrtcvad alone calls 60 to 100 ms more of it speech (see SPEECH_MARGIN_DB).
    assert burst_ms - 20 <= peak <= burst_ms + 20
