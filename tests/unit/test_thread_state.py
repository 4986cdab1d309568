"""Pinning thread states: only for threads Python did not start (the rest is probed with a real
clock thread in tests/integration/test_pjsua2_threads.py)."""

from __future__ import annotations

import threading

from telephony.thread_state import ThreadStatePins


def test_a_python_thread_is_never_pinned_nor_freed() -> None:
    pins = ThreadStatePins(alive=lambda native_id: False)
    pins.pin()  # the main thread: Python owns its state and frees it itself
    assert pins.pinned == 0
    assert pins.here.pinned  # and the callback's check passes from now on

    seen: list[tuple[int, bool]] = []

    def in_a_thread() -> None:
        seen.append((pins.pinned, bool(pins.here.pinned)))
        pins.pin()
        seen.append((pins.pinned, bool(pins.here.pinned)))

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    # Another thread starts unpinned (thread-local), and a Python one stays unpinned.
    assert seen == [(0, False), (0, True)]
    assert pins.freed == 0
