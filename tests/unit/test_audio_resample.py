"""The resampler: lengths, what survives a round trip, what must not, and stream against batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from audio.resample import RATES, StreamResampler, resample

CALL_RATES = [8000, 16000, 32000, 48000]
CALL_PAIRS = [(s, d) for s in CALL_RATES for d in CALL_RATES if s != d]
PROMPT_PAIRS = [(22050, 16000), (22050, 8000), (24000, 16000), (44100, 8000), (44100, 48000)]


def sweep(rate: int, f0: float, f1: float, seconds: float = 2.0) -> NDArray[np.int16]:
    """A linear chirp at half scale, faded in and out over 20 ms so its ends are not clicks."""
    t = np.arange(round(rate * seconds)) / rate
    phase = 2 * np.pi * (f0 * t + (f1 - f0) / (2 * seconds) * t**2)
    fade = np.clip(np.minimum(t, seconds - t) / 0.02, 0, 1)
    return np.rint(16384 * np.sin(phase) * fade).astype(np.int16)


def tone(
    rate: int, freq: float, seconds: float = 0.5, amplitude: float = 16384
) -> NDArray[np.int16]:
    t = np.arange(round(rate * seconds)) / rate
    return np.rint(amplitude * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def snr_db(reference: NDArray[np.int16], actual: NDArray[np.int16], skip: int) -> float:
    """Signal to error ratio, leaving out ``skip`` samples at each end."""
    ref = reference[skip:-skip].astype(np.float64)
    err = actual[skip:-skip].astype(np.float64) - ref
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum(err**2), 1e-9)))


def rms_db(x: NDArray[np.int16]) -> float:
    """Level relative to full scale."""
    rms = np.sqrt(np.mean(x.astype(np.float64) ** 2))
    return float(20 * np.log10(max(rms, 1e-9) / 32768))


def run_stream(stream: StreamResampler, x: NDArray[np.int16], chunk: int) -> NDArray[np.int16]:
    return np.concatenate([stream.process(x[i : i + chunk]) for i in range(0, len(x), chunk)])


@pytest.mark.parametrize(
    ("high", "low", "top"),
    [(16000, 8000, 3400), (48000, 16000, 6800), (48000, 8000, 3400), (32000, 16000, 6800)],
)
def test_speech_band_survives_a_round_trip(high: int, low: int, top: int) -> None:
    x = sweep(high, 200, top)
    y = resample(resample(x, high, low), low, high)
    assert len(y) == len(x)
    assert snr_db(x, y, skip=high // 20) > 30


def test_streamed_round_trip_matches_after_the_filter_delay() -> None:
    x = sweep(16000, 200, 3400)
    down, up = StreamResampler(16000, 8000), StreamResampler(8000, 16000)
    y = run_stream(up, run_stream(down, x, 320), 160)
    # Down's delay is counted in 8 kHz samples: two 16 kHz samples each.
    delay = 2 * down.delay + up.delay
    assert delay > 0
    assert snr_db(x[: len(x) - delay], y[delay:], skip=800) > 30
    # Without the compensation the two do not line up: the SNR test can fail.
    assert snr_db(x[: len(x) - delay], y[: len(y) - delay], skip=800) < 10


@pytest.mark.parametrize(
    ("src", "dst", "freq"),
    [(16000, 8000, 4600), (16000, 8000, 6000), (48000, 8000, 12000), (22050, 16000, 9000)],
)
def test_audio_above_the_new_nyquist_is_removed_not_aliased(src: int, dst: int, freq: int) -> None:
    x = tone(src, freq)
    y = resample(x, src, dst)
    # The tone switches on and off abruptly: those clicks are broadband, so skip them.
    assert rms_db(y[dst // 50 : -dst // 50]) < rms_db(x) - 60


def test_upsampling_leaves_no_images() -> None:
    y = resample(tone(8000, 3000), 8000, 16000)
    spectrum = np.abs(np.fft.rfft(y.astype(np.float64) * np.hanning(len(y))))
    freqs = np.fft.rfftfreq(len(y), 1 / 16000)
    image = spectrum[freqs > 4000].max()  # the 3 kHz tone's mirror image would sit at 5 kHz
    assert 20 * np.log10(image / spectrum.max()) < -60


@pytest.mark.parametrize(("src", "dst"), CALL_PAIRS + PROMPT_PAIRS)
def test_dc_passes_at_unity_gain(src: int, dst: int) -> None:
    y = resample(np.full(src // 10, 10000, np.int16), src, dst)
    middle = y[len(y) // 4 : -len(y) // 4]
    assert np.abs(middle.astype(np.int32) - 10000).max() <= 2


def test_overshoot_saturates_instead_of_wrapping() -> None:
    t = np.arange(16000)
    square = np.where((t // 16) % 2 == 0, 32767, -32768).astype(np.int16)  # 500 Hz, full scale
    y = resample(square, 16000, 8000)
    assert y.max() == 32767 and y.min() == -32768
    plateau = (np.arange(len(y)) % 16 == 4) & (np.arange(len(y)) > 100)  # mid positive half
    assert (y[plateau] > 20000).all()


@settings(deadline=None, max_examples=60)
@given(st.sampled_from(sorted(RATES)), st.sampled_from(sorted(RATES)), st.integers(0, 3000))
def test_batch_length_is_the_rounded_ratio(src: int, dst: int, n: int) -> None:
    x = np.ones(n, np.int16)
    assert len(resample(x, src, dst)) == round(n * dst / src)


@settings(deadline=None, max_examples=60)
@given(
    st.sampled_from(CALL_PAIRS + PROMPT_PAIRS),
    st.lists(st.integers(0, 700), min_size=1, max_size=12),
    st.integers(0, 2**32 - 1),
)
def test_stream_equals_batch_for_any_split(
    pair: tuple[int, int], splits: list[int], seed: int
) -> None:
    src, dst = pair
    x = np.random.default_rng(seed).integers(-20000, 20000, sum(splits), dtype=np.int16)
    stream = StreamResampler(src, dst)
    parts, at = [], 0
    for size in splits:
        parts.append(stream.process(x[at : at + size]))
        at += size
    y = np.concatenate(parts)
    g = np.gcd(src, dst)
    assert len(y) == len(x) * (dst // g) // (src // g)
    batch = resample(x, src, dst)
    shown = min(len(y) - stream.delay, len(batch))
    if shown > 0:
        diff = y[stream.delay : stream.delay + shown].astype(np.int32) - batch[:shown]
        assert np.abs(diff).max() <= 1


@pytest.mark.parametrize(("src", "dst"), CALL_PAIRS)
def test_every_20_ms_in_gives_20_ms_out(src: int, dst: int) -> None:
    stream = StreamResampler(src, dst)
    for _ in range(5):
        assert len(stream.process(np.zeros(src // 50, np.int16))) == dst // 50


def test_equal_rates_copy() -> None:
    x = np.arange(100, dtype=np.int16)
    for y in (resample(x, 16000, 16000), StreamResampler(8000, 8000).process(x)):
        assert np.array_equal(x, y) and not np.shares_memory(x, y)
    assert StreamResampler(8000, 8000).delay == 0


def test_empty_input_gives_empty_output() -> None:
    assert len(resample(np.zeros(0, np.int16), 16000, 8000)) == 0
    assert len(StreamResampler(16000, 8000).process(np.zeros(0, np.int16))) == 0


def test_unsupported_rates_and_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="unsupported sample rate 11025"):
        resample(np.zeros(10, np.int16), 11025, 8000)
    with pytest.raises(ValueError, match="unsupported sample rate 12345"):
        StreamResampler(8000, 12345)
    with pytest.raises(ValueError, match="1-D int16"):
        resample(np.zeros(10, np.float32), 16000, 8000)
    with pytest.raises(ValueError, match="1-D int16"):
        StreamResampler(16000, 8000).process(np.zeros((10, 2), np.int16))
