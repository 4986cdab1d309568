"""The C media port without a bridge: its rings, epochs and counters, and a playout through it.

``vg_port_tick`` runs the port's own two callbacks as PJSIP's bridge does each tick, so the frames
here go through exactly the C code the media clock thread runs. The playout state machine of
test_audio_playout runs again with the ring in place of ``pull``: what asyncio learns lags what
was played until it next feeds the ring, but no frame of a cut response ever plays and
``heard_ms`` is still exact at the cut.
"""

from __future__ import annotations

import ctypes
from collections import deque

import numpy as np
import pytest
from hypothesis import settings

from audio.playout import Playout, PlayoutError, ResponseDrained
from telephony.c_media_port import IN_FRAMES, OUT_FRAMES, CPortLibrary, CRing
from telephony.media_bridge import MediaChannel
from tests.unit.test_audio_playout import FB, RATE, SILENCE, PlayoutMachine, chunk, owner

LIB = CPortLibrary.load()


def new_port(rate: int = RATE) -> int:
    return LIB.new_port("test", rate)


def new_ring(port: int, rate: int = RATE) -> CRing:
    return CRing(LIB, port, LIB.vg.vg_port_attach(port), rate // 50 * 2)


def tick(port: int, caller: bytes | None = None, frame_bytes: int = FB) -> bytes:
    """One bridge tick: the frame the port plays, after handing it ``caller`` (None: nothing)."""
    out = ctypes.create_string_buffer(frame_bytes)
    LIB.vg.vg_port_tick(port, out, caller)
    return out.raw


def frames(*values: int) -> bytes:
    return b"".join(chunk(v, FB // 2).tobytes() for v in values)


@pytest.mark.parametrize("rate", [8000, 16000])
def test_pjsip_fills_the_port_info_where_the_port_expects_it(rate: int) -> None:
    port = new_port(rate)
    assert LIB.vg.vg_port_layout_ok(port, rate) == 1
    assert LIB.vg.vg_port_layout_ok(port, rate * 2) == 0


def test_frames_play_in_order_with_their_tags_then_silence() -> None:
    port = new_port()
    ring = new_ring(port)
    status = ring.push(frames(1, 2, 3), 10, False)
    assert status is not None and (status.accepted, status.queued) == (3, 3)
    assert [owner(tick(port)) for _ in range(3)] == [1, 2, 3]
    assert tick(port) == SILENCE
    status = ring.status()
    assert status is not None
    assert (status.ticks, status.played, status.last_tag, status.queued) == (4, 3, 12, 0)
    # It ended with nothing more due: not an underrun.
    assert status.underruns == 0


def test_a_full_ring_takes_what_fits() -> None:
    port = new_port()
    ring = new_ring(port)
    status = ring.push(frames(*range(1, OUT_FRAMES + 5)), 1, True)
    assert status is not None and status.accepted == OUT_FRAMES
    tick(port)
    status = ring.push(frames(7, 8), 100, True)
    assert status is not None and (status.accepted, status.queued) == (1, OUT_FRAMES)


def test_running_dry_while_more_is_due_is_one_underrun_per_dry_spell() -> None:
    port = new_port()
    ring = new_ring(port)
    ring.push(frames(1), 1, True)
    tick(port)
    tick(port)
    tick(port)
    ring.push(frames(2), 2, True)
    tick(port)
    tick(port)
    status = ring.status()
    assert status is not None and status.underruns == 2


def test_cut_drops_what_was_not_played_and_names_the_last_frame_that_was() -> None:
    port = new_port()
    ring = new_ring(port)
    ring.push(frames(1, 2, 3, 4), 1, True)
    tick(port)
    tick(port)
    status = ring.cut()
    assert status is not None and (status.last_tag, status.played, status.queued) == (2, 2, 0)
    assert tick(port) == SILENCE
    status = ring.status()
    assert status is not None and status.underruns == 0


def test_caller_frames_are_taken_oldest_first_and_the_oldest_dropped_when_full() -> None:
    port = new_port()
    ring = new_ring(port)
    tick(port, None)  # the bridge's empty frame to a port nobody transmits to: not audio
    for value in range(1, IN_FRAMES + 4):
        tick(port, frames(value))
    taken = ring.take()
    assert [owner(f) for f in taken] == list(range(4, IN_FRAMES + 4))
    assert (ring.rx_frames, ring.rx_overflow) == (IN_FRAMES + 3, 3)
    assert ring.take() == []


def test_a_ring_of_an_ended_call_cannot_touch_the_next_call() -> None:
    port = new_port()
    old = new_ring(port)
    old.push(frames(1, 2), 1, True)
    tick(port, frames(9))
    new = new_ring(port)  # the port is lent to the next call
    assert old.push(frames(3), 3, True) is None
    assert old.cut() is None and old.status() is None and old.take() == []
    # Nothing of the old call is left to play or to take, and the counters start afresh.
    assert tick(port) == SILENCE
    status = new.status()
    assert status is not None and (status.ticks, status.played) == (1, 0)
    assert new.take() == [] and new.rx_frames == 0


def test_a_channel_collects_caller_frames_from_its_ring() -> None:
    port = new_port()
    channel = MediaChannel(RATE)
    channel.use_ring(new_ring(port))
    channel.collect()
    assert not channel.inbound
    tick(port, frames(1))
    tick(port, frames(2))
    channel.collect()
    assert [owner(f) for f in channel.inbound] == [1, 2]
    assert channel.rx_frames == 2


def test_a_playout_reports_marks_and_drains_from_what_the_ring_played() -> None:
    port = new_port()
    playout = Playout(RATE)
    playout.attach_ring(new_ring(port))
    playout.begin("r1", 0)
    playout.admit("r1", 0, chunk(1, 3 * FB // 2))
    playout.mark("r1", "m1")
    playout.finish("r1")
    # Admitted audio is in the ring at once; nothing is heard until it plays.
    assert playout.poll() == []
    assert playout.heard_ms("r1") == 0
    played = [tick(port) for _ in range(4)]
    assert [owner(f) for f in played[:3]] == [1, 1, 1] and played[3] == SILENCE
    events = playout.poll()
    assert [type(e).__name__ for e in events] == ["MarkHeard", "ResponseDrained"]
    assert events[1] == ResponseDrained("r1", 60)
    assert playout.audio_frames == 3 and playout.pulls == 4


def test_attaching_a_ring_after_audio_is_refused() -> None:
    playout = Playout(RATE)
    playout.begin("r1", 0)
    playout.admit("r1", 0, chunk(1, FB))
    with pytest.raises(PlayoutError):
        playout.attach_ring(new_ring(new_port()))


def test_a_long_response_reaches_the_ring_as_it_plays() -> None:
    port = new_port()
    playout = Playout(RATE)
    playout.attach_ring(new_ring(port))
    playout.begin("r1", 0)
    n = 3 * OUT_FRAMES
    playout.admit("r1", 0, np.concatenate([chunk(v, FB // 2) for v in range(1, n + 1)]))
    playout.finish("r1")
    heard = []
    for _ in range(n + 2):
        heard.append(owner(tick(port)))
        playout.poll()  # asyncio's tick, here after every media tick
    assert heard[:n] == list(range(1, n + 1))
    assert playout.heard_ms("r1") == n * 20 and playout.underruns == 0


# --- the playout state machine, through the ring ----------------------------------------------


class RingPlayoutMachine(PlayoutMachine):
    """PlayoutMachine whose media ticks are the C port's; the model tracks what is in the ring."""

    def __init__(self) -> None:
        super().__init__()
        self.port = new_port()
        self.playout.attach_ring(new_ring(self.port))
        self.ring: deque[tuple[str, bytes]] = deque()
        self.seen_queued = 0  # the ring's fill as the playout last saw it
        self.more_due = False
        self.known: dict[str, int] = {}
        self.underruns_known = 0
        self.ring_known = 0

    def _learn(self) -> None:
        self.known = {rid: m.pulled for rid, m in self.responses.items()}
        self.underruns_known = self.underruns
        self.ring_known = len(self.ring)
        self.seen_queued = len(self.ring)

    def fed(self) -> None:
        room = OUT_FRAMES - self.seen_queued
        if self.queue and room > 0:
            moved = min(room, len(self.queue))
            self.more_due = self.open is not None or len(self.queue) > moved
            for _ in range(moved):
                self.ring.append(self.queue.popleft())
        self._learn()

    def cut(self) -> None:
        self.ring.clear()
        self.more_due = False
        self.sounding = False
        self._learn()

    def known_pulled(self, rid: str) -> int:
        return self.known.get(rid, 0)

    def known_underruns(self) -> int:
        return self.underruns_known

    def queued_frames(self) -> int:
        return len(self.queue) + self.ring_known

    def pull_one(self) -> None:
        frame = tick(self.port)
        if not self.ring:
            assert frame == SILENCE
            if self.sounding:
                self.sounding = False
                if self.more_due:
                    self.underruns += 1
            return
        self.played(frame, *self.ring.popleft())


RingPlayoutMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=80, deadline=None
)
TestRingPlayoutInterleavings = RingPlayoutMachine.TestCase
