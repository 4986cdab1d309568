"""What a live call does while the session store does not answer (docs/storage.md).

Nothing acts on what is not durable, so a call whose step waits for the store is frozen where
it matters by construction: no tool request leaves without its intent on disk, no transfer, no
ending. Its audio goes on (the media path never waits for the store). What is left is what the
caller hears, seed 004's ladder of honesty for a phone:

- under :data:`HONEST_AFTER_S`, nothing: a blip of the database is silence, the writer retries;
- then, once, the ``reconnecting`` line ("one moment, I'm reconnecting");
- at ``storage.unavailable_deadline_s``, the ``technical_problem`` line, and the call is let go:
  it stops acting for its session (nothing more of it is decided here) and hangs up once the
  line is heard. Its queued steps are still written when the store answers; the reaper then
  finalises the session from what is durable (``failed``, stage ``process``), and every tool
  intent stays to be reconciled by key, never sent again.

"Waiting" counts the call's heartbeat too (voicegate/call/live_call.py), so within
``session.heartbeat_s`` of an outage every live call is on the ladder: a call that cannot record
that it is alive cannot record how it ends either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from session.store import StoreUnavailable

log = logging.getLogger("voicegate.call")

HONEST_AFTER_S = 2.0
RECONNECTING = "reconnecting"
GIVING_UP = "technical_problem"
# How long the last line may take before the BYE goes anyway.
LAST_LINE_MAX_S = 8.0


class OutageCall(Protocol):
    call_id: str

    @property
    def waiting_on_store(self) -> bool: ...

    @property
    def answered(self) -> bool: ...

    def stop_playback(self) -> None: ...

    def announce(self, prompt: str) -> float:
        """Play a system line; returns its length in seconds."""
        ...

    def give_up_on_store(self, why: StoreUnavailable) -> None: ...


class StoreOutage:
    """Walks the live calls down the ladder while the store is away; call :meth:`check` often
    (the runtime does every half second) with how long the store has been down."""

    def __init__(
        self,
        calls: Callable[[], Iterable[OutageCall]],
        deadline_s: float,
        on_given_up: Callable[[], None],
    ) -> None:
        self._calls = calls
        self.deadline_s = deadline_s
        self._on_given_up = on_given_up
        self._told: set[str] = set()
        self._given_up: set[str] = set()

    def check(self, down_for: float | None) -> None:
        if down_for is None:
            self._told.clear()  # a later outage is told again
            return
        if down_for < HONEST_AFTER_S:
            return
        for call in list(self._calls()):
            if not call.waiting_on_store or call.call_id in self._given_up:
                continue
            if down_for >= self.deadline_s:
                self._give_up(call, down_for)
            elif call.call_id not in self._told and call.answered:
                self._told.add(call.call_id)
                log.warning("call.store_wait_told", extra={"call_id": call.call_id})
                call.announce(RECONNECTING)

    def _give_up(self, call: OutageCall, down_for: float) -> None:
        self._given_up.add(call.call_id)
        self._on_given_up()
        why = StoreUnavailable(
            f"the session store did not answer for {down_for:.0f} s"
            f" (storage.unavailable_deadline_s = {self.deadline_s:g})"
        )
        line_s = 0.0
        if call.answered:
            call.stop_playback()
            line_s = min(call.announce(GIVING_UP), LAST_LINE_MAX_S)
        log.error("call.store_gave_up", extra={"call_id": call.call_id, "after_s": down_for})
        # The BYE follows the line: the call stops acting once the caller has heard it.
        asyncio.get_running_loop().call_later(line_s + 0.2, call.give_up_on_store, why)

    def forget(self, call_id: str) -> None:
        self._told.discard(call_id)
        self._given_up.discard(call_id)
