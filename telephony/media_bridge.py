"""The per-call ``AudioMediaPort`` that moves 20 ms PCM frames between PJSIP and asyncio.

Its two callbacks run on PJSIP's media clock thread, serially for every port of the process, under
the GIL (shared/notes/pjsua2.md, "Threading"). They therefore do nothing but one copy into or out of
a deque: ``deque.append``/``popleft`` are O(1), atomic under the GIL and never block, so the asyncio
side needs no lock. No numpy, no logging, no pjsua2 calls here.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import pjsua2 as pj

from audio.frame import FRAME_MS
from audio.playout import Playout
from telephony.frame_copy import Copier
from telephony.thread_state import ThreadStatePins

if TYPE_CHECKING:
    from telephony.c_media_port import CRing

def frame_bytes(rate: int) -> int:
    """Bytes of one 20 ms mono 16-bit frame at ``rate``."""
    return rate * FRAME_MS // 1000 * 2


class MediaChannel:
    """The asyncio-facing half of a call's media: plain Python, no pjsua2 object.

    ``inbound`` keeps at most ``inbound_frames`` frames of caller audio; if asyncio falls that far
    behind, the oldest are dropped and counted rather than growing without bound. ``playout`` is
    the call's outbound buffer (audio.playout): agent audio tagged with its response and playback
    generation, one frame pulled per media tick, silence when empty, never a stale frame.

    Keeping this apart from :class:`MediaBridge` means asyncio never holds a pjsua2 object: a port
    collected after ``libDestroy`` aborts the process, so only the SIP thread owns ports.

    On a C port (telephony.c_media_port) the media thread touches none of this: the port's
    :class:`~telephony.c_media_port.CRing` holds the frames in between, ``playout`` plays
    through it, and :meth:`collect` moves caller frames from it into ``inbound``.

    When that port runs the evidence detector (``detecting``), :meth:`collect` brings its
    ``records`` instead (flat: index, kind, timestamp, speech_ms per frame worth acting on;
    indices and timestamps count from this channel's first frame), its time per frame
    (``take_timing``), ``stirring``, and the caller's frames only while ``wants_pcm``.
    """

    __slots__ = (
        "_timing",
        "detecting",
        "frame_size",
        "inbound",
        "playout",
        "rate",
        "rec_overflow",
        "records",
        "ring",
        "rx_frames",
        "rx_overflow",
        "stirring",
        "wants_pcm",
    )

    def __init__(
        self, rate: int, inbound_frames: int = 50, *, playout: Playout | None = None
    ) -> None:
        self.rate = rate
        self.frame_size = frame_bytes(rate)
        self.inbound: deque[bytes] = deque(maxlen=inbound_frames)
        self.playout = playout or Playout(rate)
        # Written only by the media thread; read (racily but safely) by others.
        self.rx_frames = 0
        self.rx_overflow = 0
        self.ring: CRing | None = None
        self.detecting = False
        self.records: list[int] = []
        self.rec_overflow = 0
        self.stirring = False
        self.wants_pcm = False
        self._timing: list[int] = []

    def use_ring(self, ring: CRing) -> None:
        """Take audio through a C port's ring from now on (before the call has any audio)."""
        self.ring = ring
        self.detecting = ring.detecting
        self.playout.attach_ring(ring)

    def collect(self) -> None:
        """asyncio, each tick: caller frames waiting in the C port's ring join ``inbound``."""
        ring = self.ring
        if ring is None:
            return
        if self.detecting:
            frames, records, timing = ring.drain(self.wants_pcm)
            if frames:
                self.inbound.extend(frames)
            if records:
                self.records.extend(records)
            if timing and timing[-1]:
                mine = self._timing
                if mine:
                    timing = [a + b for a, b in zip(mine, timing, strict=True)]
                self._timing = timing
            self.rx_frames = ring.rx_frames
            self.rx_overflow = ring.rx_overflow
            self.stirring = ring.stirring
            self.rec_overflow = ring.rec_overflow
            return
        frames = ring.take()
        if frames:
            self.inbound.extend(frames)
            self.rx_frames = ring.rx_frames
            self.rx_overflow = ring.rx_overflow

    def record_speech_at(self, speech_ms: tuple[int, ...]) -> None:
        """With the detector: of the frames while the caller speaks, bring records only of
        those on which the segment's ``speech_ms`` reaches one of these."""
        if self.ring is not None and self.detecting:
            self.ring.mark(speech_ms)

    def take_timing(self) -> list[int]:
        """The detector's frame times since the last call (bucket counts, then their sum in
        ns; empty if none)."""
        timing, self._timing = self._timing, []
        return timing

    def discard_inbound(self) -> None:
        """Drop the caller's audio collected so far, and the detector's records of it; the
        detector starts afresh, so whoever acts on this channel's audio next (a callback
        offer's call when the offer ends) starts from a new detector, as with Python's."""
        self.inbound.clear()
        self.records.clear()
        if self.detecting and self.ring is not None:
            self.ring.restart()

    def push_inbound(self, data: bytes) -> None:
        inbound = self.inbound
        if len(inbound) == inbound.maxlen:
            self.rx_overflow += 1
        inbound.append(data)
        self.rx_frames += 1


class MediaBridge(pj.AudioMediaPort):  # type: ignore[misc]
    """A pjsua2 port, lent to one call at a time; owned by the SIP thread only.

    Ports are recycled, never destroyed while the conference clock runs: in PJSIP 2.15 removing
    a port from the conference is queued for the clock thread, but ``~AudioMediaPort`` frees the
    port at once, so destroying one mid-call-churn let the clock thread use freed memory (a
    SIGSEGV seen at shutdown). :meth:`attach` swaps in the next call's channel instead.

    A pooled port costs even while no call uses it: while the clock runs, the bridge sends every
    port that nothing transmits to an empty ``put_frame`` each tick (``write_port`` in PJSIP's
    conference.c), so each idle port is one more Python callback per 20 ms.
    """

    def __init__(
        self, name: str, channel: MediaChannel, copier: Copier, pins: ThreadStatePins
    ) -> None:
        super().__init__()
        self.name = name
        self._pins = pins
        self._here = pins.here
        self.rate = channel.rate
        self._read_frame = copier.read_frame
        self._write_frame = copier.write_frame
        self.attach(channel)

    def attach(self, channel: MediaChannel) -> None:
        """Serve ``channel`` from the next tick on (each assignment is atomic under the GIL)."""
        self.channel = channel
        self._pull = channel.playout.pull
        self._push = channel.push_inbound

    def connect(self, audio: Any) -> None:
        """Both ways between this port and a call's ``pj.AudioMedia``."""
        audio.startTransmit(self)
        self.startTransmit(audio)

    def disconnect(self, audio: Any) -> None:
        try:
            audio.stopTransmit(self)
            self.stopTransmit(audio)
        except pj.Error:
            pass  # the stream is already gone with the call

    def create(self) -> None:
        """Register the port with the conference bridge. Call on the SIP thread."""
        fmt = pj.MediaFormatAudio()
        fmt.init(pj.PJMEDIA_FORMAT_PCM, self.rate, 1, FRAME_MS * 1000, 16)
        self.createPort(self.name, fmt)

    # --- media clock thread -------------------------------------------------------------------

    def onFrameReceived(self, frame: Any) -> None:
        data = self._read_frame(frame)
        if data is not None:
            self._push(data)

    def onFrameRequested(self, frame: Any) -> None:
        if not self._here.pinned:
            self._pins.pin()  # once per clock thread (telephony.thread_state)
        self._write_frame(frame, self._pull())
