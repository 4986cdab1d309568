"""One lasting Python thread state for each PJSIP thread that runs Python callbacks.

SWIG wraps every director callback (``AudioMediaPort.onFrameReceived`` / ``onFrameRequested``)
in ``PyGILState_Ensure`` / ``PyGILState_Release``. On a thread Python did not start, such as
PJSIP's media clock thread, the outermost release deletes the thread state and the next ensure
builds a new one, and CPython 3.11 maps a fresh frame stack for every new state and unmaps it on
delete. That is an ``mmap``, a page fault and a ``munmap`` (with a TLB shoot-down across CPUs)
per callback, two callbacks per call every 20 ms: measured here with 4 calls, 400 ``mmap`` and
400 ``munmap`` calls a second on the clock thread and about 85 us per callback instead of 16
(measured with strace and perf on a worker; docs/benchmarks.md).

:meth:`ThreadStatePins.pin` takes one extra ``PyGILState_Ensure`` on the calling thread and never
releases it, so SWIG's release no longer drops the state. PJSIP stops the clock thread when it
closes the idle sound device and starts a new one for the next call; a pinned state of a thread
that has ended is then cleared and freed, so call after call does not leak one.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Our own handle on the interpreter's C API (ctypes.pythonapi's prototypes are shared); PyDLL
# keeps the GIL held across each call, as these functions require.
_api = ctypes.PyDLL(None)
_api.PyGILState_Ensure.restype = ctypes.c_int
_api.PyGILState_Ensure.argtypes = []
_api.PyGILState_GetThisThreadState.restype = ctypes.c_void_p
_api.PyGILState_GetThisThreadState.argtypes = []
_api.PyThreadState_Clear.restype = None
_api.PyThreadState_Clear.argtypes = [ctypes.c_void_p]
_api.PyThreadState_Delete.restype = None
_api.PyThreadState_Delete.argtypes = [ctypes.c_void_p]


@dataclass(frozen=True, slots=True)
class _Pinned:
    native_id: int
    state: int  # PyThreadState *


class _Here(threading.local):
    # Per thread *state*: a state SWIG builds afresh for a callback sees the class default.
    pinned = False


def _python_threads() -> Mapping[int, object]:
    # threading's registry of the threads it started (and of foreign threads that asked for
    # current_thread(), which pinned callbacks never do).
    active: Mapping[int, object] = getattr(threading, "_active", {})
    return active


def thread_alive(native_id: int) -> bool:
    """Whether a thread of this process with that kernel thread id still runs."""
    return Path(f"/proc/self/task/{native_id}").exists()


class ThreadStatePins:
    """The thread states pinned so far.

    A callback checks ``pins.here.pinned`` (a thread-local attribute: about 100 ns) and calls
    :meth:`pin` when it is false, which happens once per thread. Only threads Python did not
    start are pinned: a Python thread's state already lives as long as the thread, and Python
    frees it when the thread ends, so it must not be freed here too.
    """

    __slots__ = ("_alive", "_pinned", "freed", "here")

    def __init__(self, alive: Callable[[int], bool] = thread_alive) -> None:
        self._alive = alive
        self._pinned: list[_Pinned] = []
        self.here = _Here()
        self.freed = 0
        """States of ended threads cleared and freed so far."""

    @property
    def pinned(self) -> int:
        """Thread states held now: one per live callback thread (more would be a leak)."""
        return len(self._pinned)

    def pin(self) -> None:
        """Keep the calling thread's state past the callback. Call with the GIL held."""
        if self.here.pinned:
            return
        if threading.get_ident() in _python_threads():
            self.here.pinned = True  # nothing to do on this thread, ever
            return
        self._free_ended()
        _api.PyGILState_Ensure()
        state = _api.PyGILState_GetThisThreadState()
        self._pinned.append(_Pinned(threading.get_native_id(), int(state or 0)))
        self.here.pinned = True

    def _free_ended(self) -> None:
        kept = []
        for pinned in self._pinned:
            if pinned.state and not self._alive(pinned.native_id):
                # A state no thread runs on: safe to clear and free with the GIL held.
                _api.PyThreadState_Clear(pinned.state)
                _api.PyThreadState_Delete(pinned.state)
                self.freed += 1
            else:
                kept.append(pinned)
        self._pinned = kept
