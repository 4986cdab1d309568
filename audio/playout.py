"""The per-call playout buffer: agent audio in from asyncio, one 20 ms frame out per media tick.

Every chunk belongs to a response, and every response to a playback generation (the session's
counter, bumped by barge-in, disconnect, transfer and timeout; ARCHITECTURE.md, "Threads and the
frame path"). A chunk whose generation is not the current one, or whose response was already
interrupted or finished, is dropped at admission and counted: stale audio never enters the queue.

Two threads share one structure:

* asyncio calls :meth:`Playout.begin`, :meth:`~Playout.admit`, :meth:`~Playout.mark`,
  :meth:`~Playout.finish`, :meth:`~Playout.interrupt` and, every tick, :meth:`~Playout.poll`;
* the media clock thread calls :meth:`Playout.pull` once per tick.

They share a ``collections.deque`` of ``(pcm, response, n)`` items, ``n`` being the frame's number
within its response, and no lock. ``deque.popleft``, ``deque.clear`` and attribute stores are
each one atomic step under the GIL, but a sequence of them is not, so the cut works like this:

1. :meth:`~Playout.interrupt` marks every live response ``cut``, then clears the queue in one
   call (clearing item by item would let a pull take a later frame from the middle);
2. :meth:`~Playout.pull` checks ``cut`` on the response of the frame it popped and plays silence
   instead of a cut frame, so nothing of a replaced generation leaves it, even when the pop raced
   the cut;
3. a pull that popped and checked just before the cut still plays its frame; ``pull`` flags
   itself busy while it works, and ``interrupt`` yields the GIL until that pull has recorded the
   frame (``response.pulled``) before it reads how much was heard. So ``heard_ms`` is exact, not
   off by an in-flight frame. The media thread never waits for anything.

The media thread only writes its own counters and ``response.pulled``; asyncio reads them in
:meth:`~Playout.poll` to report marks heard and responses drained.

With a :class:`FrameRing` attached (:meth:`Playout.attach_ring`; voicegate's C media port,
telephony.c_media_port), no Python runs on the media thread at all: asyncio moves whole frames
into the ring, each tagged with a number, and the ring reports the tag of the last frame it
played, from which ``response.pulled`` and the counters are set. ``interrupt`` cuts the ring,
which says in the same step which frame played last, so ``heard_ms`` stays exact.
"""

from __future__ import annotations

import enum
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Final, Protocol

import numpy as np
from numpy.typing import NDArray

from audio.frame import FRAME_MS, FRAME_RATES, FrameError, samples_per_frame
from audio.resample import StreamResampler

_PCM_DTYPE: Final = np.dtype("<i2")
# How long an interrupt waits for a pull caught mid-way, sleeping in small steps so the media
# thread gets the GIL (a bare sleep(0) often takes it straight back: CPython forces a hand-over
# only after the waiting thread has waited a whole switch interval, 5 ms by default). The pull
# needs a few microseconds; running out means the media thread is starved anyway, and then
# heard_ms may miss that one frame.
_PULL_WAIT_S: Final = 0.05
_PULL_WAIT_STEP_S: Final = 50e-6


class PlayoutError(RuntimeError):
    """Playout used against its contract by our own code (a wiring bug, not the caller's)."""


class PlayoutFull(PlayoutError):
    """Admitting the chunk would queue more than ``max_ms`` of audio; nothing was admitted."""


class GenerationError(PlayoutError):
    """``begin`` with a generation other than the current one, or an interrupt that does not
    move the generation forward."""


class ResponseError(PlayoutError):
    """``begin`` of a response id already used, or while another response is still open."""


class UnknownResponse(KeyError):
    """No response of this id was ever begun on this playout."""


@dataclass(frozen=True, slots=True)
class Interrupted:
    """A response cut by :meth:`Playout.interrupt`; the caller heard ``heard_ms`` of it."""

    response_id: str
    heard_ms: int
    # The marks of it the caller never reached, in order (each is also a MarkCleared event).
    marks_cleared: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MarkHeard:
    """The frame carrying the end of the audio admitted before this mark has left the bridge."""

    response_id: str
    mark_id: str


@dataclass(frozen=True, slots=True)
class MarkCleared:
    """The response was cut before the frame carrying the end of this mark's audio was played:
    the caller never heard up to it. Every mark ends in exactly one MarkHeard or MarkCleared."""

    response_id: str
    mark_id: str


@dataclass(frozen=True, slots=True)
class ResponseDrained:
    """A finished response has been played out completely: ``heard_ms`` of it."""

    response_id: str
    heard_ms: int


PlaybackEvent = MarkHeard | MarkCleared | ResponseDrained


@dataclass(frozen=True, slots=True)
class RingStatus:
    """What a :class:`FrameRing` has done since the call was attached to it."""

    ticks: int  # media ticks seen (frames asked for, audio or silence)
    played: int  # frames played from the ring
    last_tag: int  # tag of the last frame played; 0 before the first
    underruns: int  # dry spells while more audio was due
    last_audio_ns: int  # time.monotonic_ns() clock at the last frame played
    queued: int  # frames in the ring not yet played
    accepted: int = 0  # frames the push that returned this status took


class FrameRing(Protocol):
    """A bounded ring of outbound frames that the media thread plays from, one per tick.

    Every method returns None once the ring no longer serves this call (its port was given to
    the next call): from then on nothing more of this call is played.
    """

    @property
    def capacity(self) -> int:
        """Frames the ring holds."""
        ...

    def push(self, pcm: bytes, first_tag: int, more_due: bool) -> RingStatus | None:
        """Queue whole frames (as many as fit), tagged ``first_tag`` onwards; ``more_due`` says
        whether more audio follows them (the ring running dry after them is an underrun)."""
        ...

    def cut(self) -> RingStatus | None:
        """Drop every frame not played yet."""
        ...

    def status(self) -> RingStatus | None: ...


class _State(enum.Enum):
    OPEN = "open"  # accepting chunks
    FINISHED = "finished"  # no more chunks; playing out what is queued
    DRAINED = "drained"  # every frame played
    INTERRUPTED = "interrupted"  # cut by an interrupt


class _Response:
    """One response's bookkeeping; ``pulled`` is written by the media thread only."""

    __slots__ = (
        "cut",
        "generation",
        "heard_frames",
        "in_samples",
        "kept",
        "marks",
        "pulled",
        "queued",
        "resampler",
        "response_id",
        "skip",
        "state",
        "tail",
    )

    def __init__(self, response_id: str, generation: int, resampler: StreamResampler | None):
        self.response_id = response_id
        self.generation = generation
        self.state = _State.OPEN
        self.cut = False  # set by interrupt before it clears the queue; read by pull
        self.queued = 0  # frames put in the queue
        self.pulled = 0  # frame number of the last frame the media thread took
        self.heard_frames = 0  # final figure once DRAINED or INTERRUPTED
        self.tail = b""  # PCM short of a whole frame, waiting for the next chunk or finish
        self.in_samples = 0  # samples admitted, at the source rate
        self.marks: deque[tuple[int, str]] = deque()  # (frame number that ends it, mark id)
        self.resampler = resampler
        self.skip = resampler.delay if resampler is not None else 0  # filter warm-up to drop
        self.kept = 0  # resampled samples kept (after the skip)


_Item = tuple[bytes, _Response, int]


class Playout:
    """The outbound buffer of one call at ``rate`` Hz, bounded to ``max_ms`` of queued audio.

    Chunks are given at ``source_rate`` (default: ``rate``) and converted per response with a
    stream resampler, so chunk boundaries leave no seams. Chunks need not be whole frames: the
    remainder waits for the next chunk, and :meth:`finish` pads the last partial frame with
    silence. The generation starts at ``generation``.
    """

    def __init__(
        self,
        rate: int,
        max_ms: int = 60_000,
        *,
        source_rate: int | None = None,
        generation: int = 0,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if rate not in FRAME_RATES:
            raise FrameError(f"rate must be one of {sorted(FRAME_RATES)} Hz, got {rate}")
        if max_ms < FRAME_MS:
            raise ValueError(f"max_ms must be at least {FRAME_MS}, got {max_ms}")
        self.rate = rate
        self.source_rate = source_rate or rate
        if self.source_rate != rate:
            StreamResampler(self.source_rate, rate)  # refuse an unsupported pair now
        self.frame_samples = samples_per_frame(rate)
        self.frame_bytes = self.frame_samples * 2
        self.max_frames = max_ms // FRAME_MS
        self.generation = generation
        g = math.gcd(self.source_rate, rate)
        self._up, self._down = rate // g, self.source_rate // g
        self._silence = bytes(self.frame_bytes)
        self._queue: deque[_Item] = deque()
        self._responses: dict[str, _Response] = {}
        self._live: list[_Response] = []  # OPEN or FINISHED, oldest first
        self._open: _Response | None = None
        self._events: list[PlaybackEvent] = []
        self._clock = clock_ns
        # asyncio-side counters.
        self.stale_dropped = 0  # chunks refused at admission
        self.stale_dropped_frames = 0  # the 20 ms frames those chunks would have made
        # Media-thread counters (read racily but safely elsewhere).
        self.pulls = 0  # every pull, audio or silence: the media ticks seen
        self.audio_frames = 0  # pulls that returned agent audio
        self.underruns = 0
        self.last_audio_pull = 0  # value of ``pulls`` at the last audio frame
        self.last_audio_pull_ns = 0  # clock_ns() at the last audio frame
        self._sounding = False
        self._in_pull = False
        self._ring: FrameRing | None = None
        self._in_ring: deque[tuple[int, _Response, int]] = deque()  # (tag, response, n)
        self._next_tag = 1
        self._ring_queued = 0
        # The ring's promise after a cut: every frame it plays has a tag handed out after the cut
        # (the new generation's). Checked from its counters at each look: frames played since
        # the cut beyond the new tags it reports are stale audio that reached the caller.
        self.stale_played_frames = 0
        self._stale_before_cut = 0
        self._played_at_cut: int | None = None
        self._first_tag_after_cut = 0

    # --- media clock thread -----------------------------------------------------------------

    def pull(self) -> bytes:
        """Exactly one 20 ms frame for the caller: the next queued frame, or silence.

        O(1), no lock, no numpy, never blocks. An underrun (nothing queued right after audio,
        while a response is still open) is counted once per dry spell.
        """
        self._in_pull = True
        self.pulls += 1
        if self._queue:
            try:
                data, response, n = self._queue.popleft()
            except IndexError:  # an interrupt emptied it after the check
                pass
            else:
                if not response.cut:
                    self.last_audio_pull_ns = self._clock()
                    response.pulled = n
                    self._sounding = True
                    self.audio_frames += 1
                    self.last_audio_pull = self.pulls
                    self._in_pull = False
                    return data
        if self._sounding:
            self._sounding = False
            if self._open is not None:
                self.underruns += 1
        self._in_pull = False
        return self._silence

    # --- asyncio side -----------------------------------------------------------------------

    def attach_ring(self, ring: FrameRing) -> None:
        """Play through ``ring`` from now on instead of :meth:`pull`; attach before any audio."""
        if self._queue or self._in_ring or self.audio_frames:
            raise PlayoutError("attach_ring after audio was queued")
        self._ring = ring

    def feed(self) -> None:
        """With a ring: learn what it played, then move queued frames into it (as many as fit).

        :meth:`poll`, :meth:`admit` and :meth:`finish` call this; call it on its own only to push
        audio sooner.
        """
        ring = self._ring
        if ring is None:
            return
        queue = self._queue
        # The ring only drains between two looks, so the room seen last time is a safe bound.
        room = ring.capacity - self._ring_queued
        if not queue or room <= 0:
            status = ring.status()
        else:
            items = list(islice(queue, room))
            first = self._next_tag
            more_due = self._open is not None or len(queue) > len(items)
            status = ring.push(b"".join(item[0] for item in items), first, more_due)
            if status is not None:
                in_ring = self._in_ring
                for i in range(status.accepted):
                    _, response, n = queue.popleft()
                    in_ring.append((first + i, response, n))
                self._next_tag = first + status.accepted
        if status is not None:
            self._apply(status)

    def _apply(self, status: RingStatus) -> None:
        in_ring = self._in_ring
        last = status.last_tag
        while in_ring and in_ring[0][0] <= last:
            _, response, n = in_ring.popleft()
            response.pulled = n
        if self._played_at_cut is not None:
            since_cut = status.played - self._played_at_cut
            fresh = max(0, status.last_tag - self._first_tag_after_cut + 1)
            stale = max(0, since_cut - fresh)
            self.stale_played_frames = self._stale_before_cut + stale
        if status.played != self.audio_frames:
            self.last_audio_pull = status.ticks
        self.pulls = status.ticks
        self.audio_frames = status.played
        self.underruns = status.underruns
        self.last_audio_pull_ns = status.last_audio_ns
        self._ring_queued = status.queued

    @property
    def playing(self) -> str | None:
        """The response the caller is hearing or about to hear (begun, not drained or cut)."""
        return self._live[0].response_id if self._live else None

    @property
    def queued_ms(self) -> int:
        """Audio waiting to be played, in milliseconds (whole frames only)."""
        return (len(self._queue) + len(self._in_ring)) * FRAME_MS

    def begin(self, response_id: str, generation: int) -> None:
        """Open ``response_id`` in ``generation``, which must be the current generation.

        A previous response must be finished or interrupted first (it may still be playing out;
        the new one queues behind it).
        """
        if generation != self.generation:
            raise GenerationError(
                f"begin({response_id!r}) in generation {generation}, current is {self.generation}"
            )
        if response_id in self._responses:
            raise ResponseError(f"response {response_id!r} was already begun")
        if self._open is not None:
            raise ResponseError(
                f"begin({response_id!r}) while {self._open.response_id!r} is still open"
            )
        resampler = None
        if self.source_rate != self.rate:
            resampler = StreamResampler(self.source_rate, self.rate)
        response = _Response(response_id, generation, resampler)
        self._responses[response_id] = response
        self._live.append(response)
        self._open = response

    def admit(self, response_id: str, generation: int, samples: NDArray[np.int16]) -> bool:
        """Queue a chunk of ``response_id``; False (and counted) if it is stale.

        Stale means: ``generation`` is not the current one, or ``response_id`` is not the open
        response (never begun, finished, interrupted). Raises :class:`PlayoutFull` instead of
        queueing whole frames past ``max_ms``; then nothing of the chunk is queued.
        """
        if samples.dtype != np.int16 or samples.ndim != 1:
            raise FrameError(f"expected 1-D int16 samples, got {samples.dtype} {samples.shape}")
        response = self._open
        if generation != self.generation or response is None or response.response_id != response_id:
            self.stale_dropped += 1
            out = len(samples) * self._up / self._down
            self.stale_dropped_frames += math.ceil(out / self.frame_samples)
            return False
        if len(samples) == 0:
            return True
        expected = len(response.tail) // 2 + len(samples) * self._up // self._down
        frames = expected // self.frame_samples
        # finish() may pad one frame past max_ms; a chunk that adds no whole frame is let in.
        if frames and len(self._queue) + frames > self.max_frames:
            raise PlayoutFull(
                f"response {response_id!r}: {len(samples)} more samples would queue over "
                f"{self.max_frames * FRAME_MS} ms"
            )
        response.in_samples += len(samples)
        converted = self._convert(response, samples)
        self._enqueue(response, response.tail + converted.astype(_PCM_DTYPE, copy=False).tobytes())
        self.feed()
        return True

    def mark(self, response_id: str, mark_id: str) -> bool:
        """Place ``mark_id`` after everything admitted so far to the open ``response_id``.

        :meth:`poll` reports :class:`MarkHeard` once the frame carrying the end of that audio has
        been pulled (immediately if nothing was admitted). A mark whose audio is not yet a whole
        frame waits for the next chunk or for :meth:`finish`. Marks not yet heard when the
        response is interrupted are reported as :class:`MarkCleared` by the next :meth:`poll`.
        False if the response is not open.
        """
        response = self._open
        if response is None or response.response_id != response_id:
            return False
        end = -(-response.in_samples * self._up // self._down)  # at the playout rate
        response.marks.append((-(-end // self.frame_samples), mark_id))
        return True

    def finish(self, response_id: str) -> bool:
        """No more chunks for ``response_id``; it ends with :class:`ResponseDrained` once played.

        Pads its last partial frame with silence. False (nothing changes) if it is not open.
        """
        response = self._open
        if response is None or response.response_id != response_id:
            return False
        tail = response.tail
        if response.resampler is not None:
            tail += self._flush_resampler(response).astype(_PCM_DTYPE, copy=False).tobytes()
        if tail:
            tail += bytes(-len(tail) % self.frame_bytes)
        response.tail = b""
        self._enqueue(response, tail)
        response.state = _State.FINISHED
        response.resampler = None
        self._open = None
        self.feed()
        return True

    def interrupt(self, new_generation: int) -> list[Interrupted]:
        """Cut everything: bump the generation to ``new_generation``, empty the queue, end every
        response still open or playing out, and say how much of each the caller heard.

        Returns one :class:`Interrupted` per response cut, oldest first (empty if nothing was
        playing). Marks heard before the cut are still reported by the next :meth:`poll`, and
        the others as cleared; a response that had in fact played out completely is reported
        there as drained instead.
        """
        if new_generation <= self.generation:
            raise GenerationError(
                f"interrupt to generation {new_generation}, current is {self.generation}"
            )
        self.generation = new_generation
        self._open = None
        live = self._live
        for response in live:
            response.cut = True
        self._queue.clear()
        if self._ring is not None:
            # The ring drops what it has not played and says, in the same step, what it has.
            status = self._ring.cut()
            if status is not None:
                self._apply(status)
                self._stale_before_cut = self.stale_played_frames
                self._played_at_cut = status.played
                self._first_tag_after_cut = self._next_tag
            self._in_ring.clear()
        elif self._in_pull:
            # A pull that took a frame just before the cut plays it; let it record that first.
            deadline = time.monotonic() + _PULL_WAIT_S
            while self._in_pull and time.monotonic() < deadline:
                time.sleep(_PULL_WAIT_STEP_S)
        cut: list[Interrupted] = []
        for response in live:
            heard = response.pulled
            while response.marks and response.marks[0][0] <= heard:
                self._events.append(MarkHeard(response.response_id, response.marks.popleft()[1]))
            cleared: list[str] = []
            while response.marks:
                cleared.append(response.marks.popleft()[1])
                self._events.append(MarkCleared(response.response_id, cleared[-1]))
            if response.state is _State.FINISHED and heard == response.queued:
                self._end(response, _State.DRAINED, heard)
                self._events.append(ResponseDrained(response.response_id, heard * FRAME_MS))
            else:
                self._end(response, _State.INTERRUPTED, heard)
                cut.append(Interrupted(response.response_id, heard * FRAME_MS, tuple(cleared)))
        live.clear()
        return cut

    def poll(self) -> list[PlaybackEvent]:
        """Marks heard and responses drained since the last poll, in the order they happened."""
        self.feed()
        self._collect()
        events, self._events = self._events, []
        return events

    def heard_ms(self, response_id: str) -> int:
        """Milliseconds of ``response_id`` pulled so far (final once drained or interrupted)."""
        response = self._responses.get(response_id)
        if response is None:
            raise UnknownResponse(response_id)
        if response.state in (_State.DRAINED, _State.INTERRUPTED):
            return response.heard_frames * FRAME_MS
        return response.pulled * FRAME_MS

    # --- internals ----------------------------------------------------------------------------

    def _collect(self) -> None:
        live = self._live
        if not live:
            return
        events = self._events
        for response in list(live):
            pulled = response.pulled
            marks = response.marks
            while marks and marks[0][0] <= pulled:
                events.append(MarkHeard(response.response_id, marks.popleft()[1]))
            if response.state is _State.FINISHED and pulled >= response.queued:
                while marks:  # cannot happen (finish pads to the last mark) but never lose one
                    events.append(MarkHeard(response.response_id, marks.popleft()[1]))
                self._end(response, _State.DRAINED, pulled)
                events.append(ResponseDrained(response.response_id, pulled * FRAME_MS))
                live.remove(response)

    def _end(self, response: _Response, state: _State, heard_frames: int) -> None:
        response.state = state
        response.heard_frames = heard_frames
        response.marks.clear()
        response.tail = b""
        response.resampler = None

    def _enqueue(self, response: _Response, pcm: bytes) -> None:
        fb = self.frame_bytes
        whole = len(pcm) // fb
        first = response.queued + 1
        # Built as a list first: deque.extend(list) runs in C without a GIL switch, so the media
        # thread never sees half a chunk (it would be harmless, but this is cheaper too).
        items = [(pcm[i * fb : (i + 1) * fb], response, first + i) for i in range(whole)]
        self._queue.extend(items)
        response.queued += whole
        response.tail = pcm[whole * fb :]

    def _convert(self, response: _Response, samples: NDArray[np.int16]) -> NDArray[np.int16]:
        resampler = response.resampler
        if resampler is None:
            return samples
        out = resampler.process(samples)
        if response.skip:
            dropped = min(response.skip, len(out))
            response.skip -= dropped
            out = out[dropped:]
        response.kept += len(out)
        return out

    def _flush_resampler(self, response: _Response) -> NDArray[np.int16]:
        """The rest of a resampled response: its filter tail, cut at the converted length."""
        resampler = response.resampler
        assert resampler is not None
        want = -(-response.in_samples * self._up // self._down)
        missing = want - response.kept
        if missing <= 0:
            return np.zeros(0, dtype=np.int16)
        # Silence after the end pushes the remaining outputs (and any warm-up still owed) out.
        needed_out = missing + response.skip
        zeros = np.zeros(-(-needed_out * self._down // self._up) + 1, dtype=np.int16)
        out = self._convert(response, zeros)
        return out[:missing]
