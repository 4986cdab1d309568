"""Stale audio that reaches the caller is measured, not only prevented: after a cut the playout
checks the ring's own counters, and frames played since the cut that carry no tag of the new
generation are counted (``voicegate_stale_frames_played_total``, a paging alert)."""

from __future__ import annotations

from audio.playout import Playout, RingStatus
from tests.unit.test_audio_playout import FB, RATE, chunk
from tests.unit.test_c_media_port import new_port, new_ring, tick


class LeakyRing:
    """A ring that breaks the cut contract: ``cut`` reports, but keeps the queued frames."""

    capacity = 50

    def __init__(self) -> None:
        self.queue: list[int] = []
        self.played = 0
        self.last_tag = 0
        self.ticks = 0

    def _status(self, accepted: int = 0) -> RingStatus:
        return RingStatus(self.ticks, self.played, self.last_tag, 0, 0, len(self.queue), accepted)

    def push(self, pcm: bytes, first_tag: int, more_due: bool) -> RingStatus:
        n = len(pcm) // FB
        self.queue += range(first_tag, first_tag + n)
        return self._status(n)

    def cut(self) -> RingStatus:
        return self._status()

    def status(self) -> RingStatus:
        return self._status()

    def tick(self) -> None:
        self.ticks += 1
        if self.queue:
            self.last_tag = self.queue.pop(0)
            self.played += 1


def test_frames_a_ring_plays_after_a_cut_from_before_it_are_counted_as_stale() -> None:
    ring = LeakyRing()
    playout = Playout(RATE)
    playout.attach_ring(ring)
    playout.begin("r1", 0)
    playout.admit("r1", 0, chunk(1, 5 * FB // 2))
    ring.tick()  # one frame heard before the cut
    playout.interrupt(1)
    assert playout.stale_played_frames == 0
    ring.tick()
    ring.tick()  # two frames of generation 0 played after it
    playout.poll()
    assert playout.stale_played_frames == 2
    # New audio of generation 1 plays behind the leftovers: only the old frames are stale.
    playout.begin("r2", 1)
    playout.admit("r2", 1, chunk(2, 2 * FB // 2))
    for _ in range(6):
        ring.tick()
    playout.poll()
    assert playout.stale_played_frames == 4


def test_the_c_port_plays_nothing_of_a_cut_generation() -> None:
    port = new_port()
    playout = Playout(RATE)
    playout.attach_ring(new_ring(port))
    playout.begin("r1", 0)
    playout.admit("r1", 0, chunk(1, 10 * FB // 2))
    tick(port)
    playout.interrupt(1)
    playout.begin("r2", 1)
    playout.admit("r2", 1, chunk(2, 3 * FB // 2))
    for _ in range(12):
        tick(port)
        playout.poll()
    assert playout.audio_frames == 4
    assert playout.stale_played_frames == 0
