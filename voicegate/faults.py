"""Fault injection for tests: exit abruptly at a named crash window (seed 000, "How to validate").

``faults.crash_at = "after_request_send"`` makes the process die the first time the write path
passes that window; ``"after_turn_commit#5"`` the fifth time. The exit is ``os._exit``: no
``finally`` blocks, no shutdown, no flushing of anything but the log line that says why — as
close to ``kill -9`` as a process can do to itself, but at an exact point.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger("voicegate.faults")

EXIT_CODE = 86


class Faults:
    def __init__(self, crash_at: str, before_crash: Callable[[], None] | None = None) -> None:
        window, _, nth = crash_at.partition("#")
        self.window = window
        self.nth = int(nth) if nth else 1
        self._seen = 0
        # Writes leave the event loop (session/store/writer.py): a window "after" a write is
        # reached once the write is durable, so the crash comes after it, as it would on disk.
        self._before_crash = before_crash

    def reached(self, window: str) -> None:
        if not self.window or window != self.window:
            return
        self._seen += 1
        if self._seen < self.nth:
            return
        if self._before_crash is not None:
            self._before_crash()
        log.critical("fault.crash", extra={"window": window, "time": self._seen})
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_CODE)
