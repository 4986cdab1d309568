"""The frame bridge: the verified pointer copy and the channel the media thread pulls from."""

from __future__ import annotations

import pjsua2 as pj
from hypothesis import given
from hypothesis import strategies as st

from telephony.frame_copy import (
    FAST,
    SLOW,
    fast_read,
    fast_read_frame,
    fast_write,
    fast_write_frame,
    select_copier,
    slow_read,
    slow_read_frame,
    slow_write_frame,
)
from telephony.media_bridge import MediaChannel, frame_bytes


def test_fast_copy_is_verified_on_this_build() -> None:
    assert select_copier(pj.ByteVector) is FAST


def test_fast_copy_can_be_refused() -> None:
    assert select_copier(pj.ByteVector, allow_fast=False) is SLOW


def test_a_copier_that_disagrees_with_the_slow_path_is_not_used() -> None:
    class Lying:
        """A vector whose fast read cannot work: no ``this`` pointer."""

        def __init__(self, data: bytes = b"") -> None:
            self.data = bytearray(data)

        def size(self) -> int:
            return len(self.data)

    assert select_copier(Lying) is SLOW


@given(st.binary(max_size=2048), st.binary(max_size=2048))
def test_fast_read_and_write_equal_swig_on_real_vectors(first: bytes, second: bytes) -> None:
    vec = pj.ByteVector(first) if first else pj.ByteVector()
    assert fast_read(vec) == slow_read(vec) == first
    fast_write(vec, second)
    assert slow_read(vec) == second
    assert vec.size() == len(second)


def test_frame_sizes() -> None:
    assert frame_bytes(8000) == 320
    assert frame_bytes(16000) == 640


def test_the_bridge_pulls_from_the_calls_playout() -> None:
    import numpy as np

    channel = MediaChannel(8000)
    playout = channel.playout
    assert playout.pull() == bytes(320)  # nothing queued: silence
    playout.begin("r1", 0)
    tone = (np.arange(320) % 50 * 100).astype(np.int16)
    assert playout.admit("r1", 0, tone)
    playout.finish("r1")
    assert playout.pull() == tone[:160].astype("<i2").tobytes()
    assert playout.pull() == tone[160:].astype("<i2").tobytes()
    assert playout.pull() == bytes(320)
    assert playout.audio_frames == 2


def test_inbound_ring_is_bounded_and_counts_what_it_drops() -> None:
    channel = MediaChannel(8000, inbound_frames=3)
    for i in range(5):
        channel.push_inbound(bytes([i]) * 320)
    assert [frame[0] for frame in channel.inbound] == [2, 3, 4]
    assert channel.rx_overflow == 2
    assert channel.rx_frames == 5


@given(st.binary(max_size=2048), st.booleans(), st.integers(0, 4096))
def test_frame_copies_through_the_layout_equal_swig(data: bytes, audio: bool, asked: int) -> None:
    incoming = pj.MediaFrame()
    incoming.type = pj.PJMEDIA_FRAME_TYPE_AUDIO if audio else pj.PJMEDIA_FRAME_TYPE_NONE
    incoming.buf = pj.ByteVector(data) if data else pj.ByteVector()
    incoming.size = len(data)
    assert fast_read_frame(incoming) == slow_read_frame(incoming) == (data if audio else None)
    # A frame as PJSIP hands it over to be filled: no type, an empty buffer, the size it wants.
    fast, slow = pj.MediaFrame(), pj.MediaFrame()
    fast.size = slow.size = asked
    fast_write_frame(fast, data)
    slow_write_frame(slow, data)
    for frame in (fast, slow):
        assert frame.type == pj.PJMEDIA_FRAME_TYPE_AUDIO
        assert bytes(frame.buf) == data
        assert frame.size == len(data)
