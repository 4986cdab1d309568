"""Copying PCM in and out of pjsua2 ``ByteVector`` buffers on the media clock thread.

SWIG's own conversions (``bytes(frame.buf)``) walk the vector element by element: about 120 us per
20 ms frame at 8 kHz, which alone would let ~80 calls saturate a core (shared/notes/pjsua2.md,
"Frame buffers"). The fast path reads the ``std::vector``'s begin/end pointers through ctypes and
copies the bytes in one ``memmove``: under 1 us.

That relies on the libstdc++ layout of ``std::vector`` (three pointers, begin first), so the fast
path is verified against the slow one at start-up (:func:`select_copier`) and the slow one is used
if they ever disagree.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Protocol

_Span = ctypes.c_size_t * 2


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


def slow_read(vector: Any) -> bytes:
    return bytes(vector)


def slow_write(vector: Any, data: bytes) -> None:
    # SWIG's slice assignment converts in C++ (about 18 us a frame), replacing the whole content.
    vector[0 : vector.size()] = data


class Reader(Protocol):
    def __call__(self, vector: Any) -> bytes: ...


class Writer(Protocol):
    def __call__(self, vector: Any, data: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class Copier:
    """The pair of copy functions the media bridge uses; ``fast`` says which pair it is."""

    read: Reader
    write: Writer
    fast: bool


FAST = Copier(fast_read, fast_write, fast=True)
SLOW = Copier(slow_read, slow_write, fast=False)


def verify_fast_copy(vector_factory: Any) -> bool:
    """Check the fast copy against SWIG's slow path on real ``ByteVector`` objects.

    ``vector_factory`` is ``pjsua2.ByteVector``. Covers the sizes a frame can have (0, an odd size,
    20 ms at 8/16/48 kHz) and a write that has to grow and then shrink the vector.
    """
    try:
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


def select_copier(vector_factory: Any, *, allow_fast: bool = True) -> Copier:
    """Return the fast copier when it is verified on this build, else the slow one."""
    if allow_fast and verify_fast_copy(vector_factory):
        return FAST
    return SLOW
