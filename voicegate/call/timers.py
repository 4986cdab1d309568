"""The session's timers (ScheduleTimer and CancelTimer effects), armed on the event loop.

A timer that fires is handed to the call's task as :class:`TimerFired`, in order with every
other event of the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from voicegate.call.clock import SessionClock


@dataclass(frozen=True, slots=True)
class TimerFired:
    name: str
    generation: int
    attempt: int


class SessionTimers:
    def __init__(self, clock: SessionClock, post: Callable[[object], None]) -> None:
        self._clock = clock
        self._post = post
        self._handles: dict[str, asyncio.TimerHandle] = {}

    def arm(self, name: str, due: float, generation: int, attempt: int) -> None:
        """Arm ``name`` for session time ``due``, replacing a timer of that name."""
        previous = self._handles.pop(name, None)
        if previous is not None:
            previous.cancel()
        # Session time is the loop's clock plus a fixed offset: a wall-clock step moves nothing.
        self._handles[name] = asyncio.get_running_loop().call_at(
            self._clock.loop_time(due),
            self._post,
            TimerFired(name, generation, attempt),
        )

    def cancel(self, name: str) -> None:
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.cancel()

    def fired(self, name: str) -> None:
        """``name`` went off: it is no longer armed."""
        self._handles.pop(name, None)

    def cancel_all(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
