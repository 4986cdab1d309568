"""The frame type: what it refuses, and that bytes survive the trip through it unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from audio.frame import FRAME_MS, FRAME_RATES, Frame, FrameError, samples_per_frame

rates = st.sampled_from(sorted(FRAME_RATES))
int16s = st.integers(min_value=-32768, max_value=32767)


@given(st.lists(int16s, max_size=2000), rates, st.integers(min_value=0, max_value=2**40))
def test_pcm_bytes_round_trip(values: list[int], rate: int, timestamp: int) -> None:
    data = np.array(values, dtype="<i2").tobytes()
    frame = Frame.from_pcm_bytes(data, rate, timestamp)
    assert frame.samples.tolist() == values
    assert frame.to_pcm_bytes() == data
    assert (frame.rate, frame.timestamp, len(frame)) == (rate, timestamp, len(values))


def test_pcm_bytes_are_little_endian() -> None:
    frame = Frame.from_pcm_bytes(b"\x01\x00\x00\x80\xff\x7f", 8000, 0)
    assert frame.samples.tolist() == [1, -32768, 32767]
    assert frame.to_pcm_bytes() == b"\x01\x00\x00\x80\xff\x7f"


def test_from_pcm_bytes_does_not_copy() -> None:
    data = bytes(320)
    frame = Frame.from_pcm_bytes(data, 8000, 0)
    assert np.shares_memory(frame.samples, np.frombuffer(data, dtype=np.int16))


def test_odd_byte_count_is_refused() -> None:
    with pytest.raises(FrameError, match="even number of bytes, got 3"):
        Frame.from_pcm_bytes(b"\x00\x01\x02", 8000, 0)


@pytest.mark.parametrize(
    ("samples", "rate", "timestamp", "message"),
    [
        (np.zeros(160, np.int32), 8000, 0, "int16, got int32"),
        (np.zeros(160, np.float32), 8000, 0, "int16, got float32"),
        (np.zeros((160, 2), np.int16), 8000, 0, r"mono \(1-D\)"),
        (np.zeros(160, np.int16), 22050, 0, "rate must be one of"),
        (np.zeros(160, np.int16), 0, 0, "rate must be one of"),
        (np.zeros(160, np.int16), 8000, -1, "timestamp must be >= 0"),
        ([0] * 160, 8000, 0, "numpy array, got list"),
    ],
)
def test_invalid_frames_are_refused(
    samples: object, rate: int, timestamp: int, message: str
) -> None:
    with pytest.raises(FrameError, match=message):
        Frame(samples, rate, timestamp)  # type: ignore[arg-type]


def test_frame_error_is_a_value_error() -> None:
    assert issubclass(FrameError, ValueError)


@pytest.mark.parametrize(
    ("rate", "expected"), [(8000, 160), (16000, 320), (32000, 640), (48000, 960)]
)
def test_standard_frames_last_20_ms(rate: int, expected: int) -> None:
    assert FRAME_MS == 20
    assert samples_per_frame(rate) == expected
    frame = Frame(np.zeros(expected, np.int16), rate, 3 * expected)
    assert frame.duration_ms == 20.0
    assert frame.timestamp_ms == 60.0


def test_samples_per_frame_refuses_fractions() -> None:
    assert samples_per_frame(22050) == 441
    assert samples_per_frame(8000, 10) == 80
    with pytest.raises(ValueError, match="not a whole number"):
        samples_per_frame(44100, 1)
    with pytest.raises(ValueError, match="positive"):
        samples_per_frame(8000, 0)


def test_frame_is_immutable_and_leaves_the_callers_array_alone() -> None:
    samples = np.arange(160, dtype=np.int16)
    frame = Frame(samples, 8000, 0)
    with pytest.raises(ValueError, match="read-only"):
        frame.samples[0] = 1
    with pytest.raises(AttributeError):
        frame.rate = 16000  # type: ignore[misc]
    samples[0] = 7  # the caller's array stays writeable; the frame views it
    assert samples.flags.writeable
    assert frame.samples[0] == 7


def test_frames_compare_by_value() -> None:
    a = Frame(np.arange(160, dtype=np.int16), 8000, 160)
    assert a == Frame(np.arange(160, dtype=np.int16), 8000, 160)
    assert a != Frame(np.arange(160, dtype=np.int16), 8000, 0)
    assert a != Frame(np.arange(160, dtype=np.int16), 16000, 160)
    assert a != Frame(np.zeros(160, dtype=np.int16), 8000, 160)
    assert a != Frame(np.arange(161, dtype=np.int16), 8000, 160)
    with pytest.raises(TypeError):
        hash(a)
