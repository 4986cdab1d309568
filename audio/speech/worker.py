"""The recognition thread: every call's recogniser runs here, never on the media clock thread
or the event loop.

pocketsphinx holds the GIL while it decodes (about 0.8 ms per 20 ms frame of speech), so it must
not run inside anything with a deadline: the media clock thread only copies frames into rings,
and the event loop hands each frame to this thread through one bounded queue and returns. One
thread serves every stream of the process, so each decoder is only ever touched by one thread
(a decoder is not thread-safe), and a burst of speech from several callers is decoded in turn
rather than by threads fighting for the GIL. Results go back through ``deliver``, which this
thread calls; a stream opened with a loop wraps it in ``loop.call_soon_threadsafe``.

A full queue drops frames (counted in :attr:`RecognitionThread.dropped`) rather than make the
event loop wait: recognition falls behind, calls never do.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from audio.speech.grammar import Grammar
from audio.speech.recognizer import Heard, Recognizer

log = logging.getLogger("voicegate.speech")

MAX_QUEUED: Final = 2000  # 20 ms frames: 40 s of one caller, or 10 s each of four


@dataclass(frozen=True, slots=True)
class _Open:
    stream: int
    grammars: tuple[Grammar, ...]
    rate: int
    deliver: Callable[[Heard], None]


@dataclass(frozen=True, slots=True)
class _Audio:
    stream: int
    samples: NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class _Use:
    stream: int
    grammar: str


@dataclass(frozen=True, slots=True)
class _Close:
    stream: int


@dataclass(frozen=True, slots=True)
class _Prepare:
    grammars: tuple[Grammar, ...]
    count: int


_STOP: Final = object()
_Item = _Open | _Audio | _Use | _Close | _Prepare | object
MAX_SPARE: Final = 8  # decoders kept for reuse per grammar set (about 9 MB each)


class SpeechStream:
    """One caller's side of the thread. Every method returns at once; none raises once the
    stream is open (a closed stream ignores what it is given)."""

    def __init__(self, owner: RecognitionThread, stream: int) -> None:
        self._owner = owner
        self._id = stream
        self.closed = False

    def feed(self, samples: NDArray[np.int16]) -> bool:
        """Queue 20 ms of caller audio; False if the thread is that far behind (dropped)."""
        if self.closed:
            return False
        return self._owner._put(_Audio(self._id, samples), droppable=True)

    def use(self, grammar: str) -> None:
        """Switch to ``grammar`` (a name given at open) from the next utterance on."""
        if not self.closed:
            self._owner._put(_Use(self._id, grammar), droppable=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._owner._put(_Close(self._id), droppable=False)


class RecognitionThread:
    """A daemon thread holding one :class:`Recognizer` per open stream."""

    def __init__(self, max_queued: int = MAX_QUEUED) -> None:
        self._queue: queue.Queue[_Item] = queue.Queue(max_queued)
        self._recognizers: dict[int, tuple[Recognizer, Callable[[Heard], None]]] = {}
        self._spare: dict[tuple[Grammar, ...], list[Recognizer]] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0  # frames dropped on a full queue
        self.decoded_frames = 0
        self.failures = 0
        self.decoders_built = 0
        self.cpu_s = 0.0  # the thread's own CPU time spent on items (time.thread_time)

    def prepare(self, grammars: Sequence[Grammar], count: int = 1) -> None:
        """Build ``count`` decoders for ``grammars`` now (at start-up), so that the first calls
        do not build theirs while other calls are running."""
        self._start()
        self._put(_Prepare(tuple(grammars), count), droppable=False)

    def build_spares(self, grammars: Sequence[Grammar], count: int) -> None:
        """Build ``count`` decoders for ``grammars`` on the calling thread, before this thread
        ever runs. The pool's fork server does, so that every worker forked from it finds its
        decoders built and shares their acoustic model's pages (about 12 MB a decoder) instead
        of loading its own."""
        if self._thread is not None:
            raise RuntimeError("decoders are built on the calling thread only before it starts")
        self._fill_spares(tuple(grammars), count)

    def _fill_spares(self, grammars: tuple[Grammar, ...], count: int) -> None:
        kept = self._spare.setdefault(grammars, [])
        while len(kept) < min(count, MAX_SPARE):
            kept.append(Recognizer(grammars, 16000))
            self.decoders_built += 1

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="voicegate-speech", daemon=True
                )
                self._thread.start()

    def open(
        self, grammars: Sequence[Grammar], rate: int, deliver: Callable[[Heard], None]
    ) -> SpeechStream:
        """A new stream at ``rate`` Hz listening with ``grammars[0]``; its decoder is built on
        the thread. ``deliver`` is called on the thread with each utterance."""
        self._start()
        with self._lock:
            self._next += 1
            stream = self._next
        self._put(_Open(stream, tuple(grammars), rate, deliver), droppable=False)
        return SpeechStream(self, stream)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after what is queued (tests and shutdown)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout)

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def _put(self, item: _Item, *, droppable: bool) -> bool:
        try:
            if droppable:
                self._queue.put_nowait(item)
            else:
                # Control items are rare and tiny; a short wait beats losing a close.
                self._queue.put(item, timeout=1.0)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            started = time.thread_time()
            try:
                self._handle(item)
            except Exception:
                self.failures += 1
                log.exception("speech.failure")
            self.cpu_s += time.thread_time() - started

    def _handle(self, item: _Item) -> None:
        match item:
            case _Audio(stream, samples):
                found = self._recognizers.get(stream)
                if found is None:
                    return
                recognizer, deliver = found
                for heard in recognizer.feed(samples):
                    deliver(heard)
                self.decoded_frames += 1
            case _Use(stream, grammar):
                if (found := self._recognizers.get(stream)) is not None:
                    found[0].use(grammar)
            case _Open(stream, grammars, rate, deliver):
                spare = self._spare.get(grammars)
                if spare:
                    recognizer = spare.pop()
                    recognizer.restart(rate, seed=stream)
                else:
                    recognizer = Recognizer(grammars, rate, seed=stream)
                    self.decoders_built += 1
                self._recognizers[stream] = (recognizer, deliver)
            case _Close(stream):
                found = self._recognizers.pop(stream, None)
                if found is not None:
                    kept = self._spare.setdefault(found[0].grammars, [])
                    if len(kept) < MAX_SPARE:
                        found[0].reset()
                        kept.append(found[0])
            case _Prepare(grammars, count):
                self._fill_spares(grammars, count)


_shared: RecognitionThread | None = None
_shared_lock = threading.Lock()


def shared_thread() -> RecognitionThread:
    """The process's recognition thread (started by the first stream opened on it)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = RecognitionThread()
        return _shared
