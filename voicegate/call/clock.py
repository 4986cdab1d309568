"""Session time: monotonic, read from the event loop, anchored once to the wall clock.

The session machine's ``now`` (every deadline, duration and recorded ``at``) must not move when
the system clock is stepped (NTP, an operator, a VM resumed): it is ``loop.time()``, which is
``time.monotonic()``, plus one offset taken when the process starts, so that recorded times
still read as dates. Timers are armed with ``loop.call_at`` on the same scale. Wall-clock time
is read only here (the anchor) and where a timestamp is recorded for another process (the
store's heartbeat ``touched_at``, which the reaper compares across processes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class SessionClock:
    def __init__(
        self,
        monotonic: Callable[[], float] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._monotonic = monotonic or _loop_time
        self._offset = wall() - self._monotonic()
        self._wall = wall

    def now(self) -> float:
        """Session time: seconds since the epoch as of the anchor, advancing monotonically."""
        return self._monotonic() + self._offset

    def loop_time(self, at: float) -> float:
        """The event loop's time of session time ``at`` (for ``loop.call_at``)."""
        return at - self._offset

    def wall(self) -> float:
        """The system clock: only for timestamps another process compares (heartbeats)."""
        return self._wall()


def _loop_time() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:  # outside a loop (start-up, tests): the loop's own clock source
        return time.monotonic()
