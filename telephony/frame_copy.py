"""Copying PCM in and out of pjsua2 ``ByteVector`` buffers on the media clock thread.

SWIG's own conversions (``bytes(frame.buf)``) walk the vector element by element: about 120 us per
20 ms frame at 8 kHz, which alone would let ~80 calls saturate a core (shared/notes/pjsua2.md,
"Frame buffers"). The fast path reads the ``std::vector``'s begin/end pointers through ctypes and
copies the bytes in one ``memmove``: under 1 us.

The media port's callbacks go one step further and read and write the ``pj::MediaFrame`` itself
through its layout (``type``, then the ``buf`` vector, then ``size``): SWIG's attribute access
builds a proxy object per field, and ``frame.buf`` alone costs more than the copy (measured here:
reading a frame 5.9 us through the attributes, 2.0 us through the layout; writing 10.2 us and
4.5 us).

That relies on the libstdc++ layout of ``std::vector`` (three pointers, begin first) and on
``MediaFrame``'s, so the fast path is verified against the slow one at start-up
(:func:`select_copier`) and the slow one is used if they ever disagree.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Protocol

import pjsua2 as pj

_Span = ctypes.c_size_t * 2
AUDIO = pj.PJMEDIA_FRAME_TYPE_AUDIO


class _MediaFrame(ctypes.Structure):
    # pj::MediaFrame: pjmedia_frame_type type; ByteVector buf; unsigned size.
    _fields_ = (
        ("type", ctypes.c_int),
        ("begin", ctypes.c_size_t),
        ("end", ctypes.c_size_t),
        ("capacity_end", ctypes.c_size_t),
        ("size", ctypes.c_uint),
    )


def _span(vector: Any) -> tuple[int, int]:
    # ``vector.this`` is SWIG's pointer object; its int value is the address of the std::vector,
    # whose first two words are its begin and end pointers.
    begin, end = _Span.from_address(int(vector.this))
    return begin, end


def fast_read(vector: Any) -> bytes:
    begin, end = _span(vector)
    return ctypes.string_at(begin, end - begin)


def fast_write(vector: Any, data: bytes) -> None:
    n = len(data)
    if vector.size() != n:
        vector.resize(n)
    begin, _ = _span(vector)
    ctypes.memmove(begin, data, n)


def fast_read_frame(frame: Any) -> bytes | None:
    """The audio of an incoming ``MediaFrame``, or None when it carries none."""
    view = _MediaFrame.from_address(int(frame.this))
    if view.type != AUDIO:
        return None
    return ctypes.string_at(view.begin, view.end - view.begin)


def fast_write_frame(frame: Any, data: bytes) -> None:
    """Fill the ``MediaFrame`` PJSIP asks for with ``data`` (it arrives with an empty buffer)."""
    n = len(data)
    view = _MediaFrame.from_address(int(frame.this))
    if view.end - view.begin != n:
        frame.buf.resize(n)
    ctypes.memmove(view.begin, data, n)
    view.type = AUDIO
    view.size = n


def slow_read_frame(frame: Any) -> bytes | None:
    if frame.type != AUDIO:
        return None
    return bytes(frame.buf)


def slow_write_frame(frame: Any, data: bytes) -> None:
    frame.type = AUDIO
    slow_write(frame.buf, data)
    frame.size = len(data)


def slow_read(vector: Any) -> bytes:
    return bytes(vector)


def slow_write(vector: Any, data: bytes) -> None:
    # SWIG's slice assignment converts in C++ (about 18 us a frame), replacing the whole content.
    vector[0 : vector.size()] = data


class FrameReader(Protocol):
    def __call__(self, frame: Any) -> bytes | None: ...


class FrameWriter(Protocol):
    def __call__(self, frame: Any, data: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class Copier:
    """The pair of frame copy functions the media bridge uses; ``fast`` says which pair."""

    read_frame: FrameReader
    write_frame: FrameWriter
    fast: bool


FAST = Copier(fast_read_frame, fast_write_frame, fast=True)
SLOW = Copier(slow_read_frame, slow_write_frame, fast=False)


def verify_fast_copy(vector_factory: Any, frame_factory: Any = pj.MediaFrame) -> bool:
    """Check the fast copy against SWIG's slow path on real ``ByteVector`` and ``MediaFrame``s.

    ``vector_factory`` is ``pjsua2.ByteVector``. Covers the sizes a frame can have (0, an odd size,
    20 ms at 8/16/48 kHz), a write that has to grow and then shrink the vector, and frames with
    and without audio.
    """
    try:
        if not _verify_frames(vector_factory, frame_factory):
            return False
        for size in (0, 1, 7, 320, 640, 1920):
            pattern = bytes((i * 37 + size) & 0xFF for i in range(size))
            vec = vector_factory(pattern) if size else vector_factory()
            if fast_read(vec) != slow_read(vec) or fast_read(vec) != pattern:
                return False
            target = vector_factory()
            fast_write(target, pattern)
            if slow_read(target) != pattern:
                return False
            fast_write(target, pattern[: size // 2])
            if slow_read(target) != pattern[: size // 2]:
                return False
    except (ValueError, TypeError, AttributeError, OSError):
        return False
    return True


def _verify_frames(vector_factory: Any, frame_factory: Any) -> bool:
    for size in (0, 7, 320, 640, 1920):
        pattern = bytes((i * 29 + size) & 0xFF for i in range(size))
        incoming = frame_factory()
        incoming.type = AUDIO
        incoming.buf = vector_factory(pattern) if size else vector_factory()
        incoming.size = size
        if fast_read_frame(incoming) != pattern or slow_read_frame(incoming) != pattern:
            return False
        incoming.type = pj.PJMEDIA_FRAME_TYPE_NONE
        if fast_read_frame(incoming) is not None:
            return False
        # As PJSIP hands it over to be filled: no type, an empty buffer, a size asked for.
        requested = frame_factory()
        requested.size = 640
        fast_write_frame(requested, pattern)
        if (requested.type, bytes(requested.buf), requested.size) != (AUDIO, pattern, size):
            return False
    return True


def select_copier(vector_factory: Any, *, allow_fast: bool = True) -> Copier:
    """Return the fast copier when it is verified on this build, else the slow one."""
    if allow_fast and verify_fast_copy(vector_factory):
        return FAST
    return SLOW
