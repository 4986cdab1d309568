"""A hang-up from our side: the plan the session records, the wait for queued audio, the BYE.

Either the process or the agent asks (:meth:`HangingUp.end`), or the session decides (its
HangUp effect, :meth:`HangingUp.send_bye`). Either way a goodbye queued for the caller is heard
first, for at most :data:`MAX_HANGUP_WAIT_S`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from session import events as sev
from telephony import events as ev
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.services import CallServices

# How long a hang-up waits for queued audio to be heard before it goes ahead anyway.
MAX_HANGUP_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class HangupPlan:
    """A hang-up we start: how the session should record it, once the BYE can go."""

    outcome: str  # completed or canceled
    reason: str


class HangingUp:
    def __init__(self, state: CallState, services: CallServices, steps: SessionSteps) -> None:
        self._state = state
        self._services = services
        self._steps = steps
        self.plan: HangupPlan | None = None
        self._waiting_since: float | None = None
        self._status = 603
        # Asked right before our BYE: True when something takes its place for now (the
        # needs_human handoff, voicegate/call/transfer.py), which calls bye_now() when done.
        self.before_bye: Callable[[], bool] | None = None

    def end(self, plan: HangupPlan, *, after_playout: bool, status: int = 603) -> None:
        """Hang up, recording ``plan`` as the session's outcome (the first plan given wins).

        With ``after_playout`` the BYE waits (at most :data:`MAX_HANGUP_WAIT_S`) until the queued
        audio has been sent, so a goodbye is heard; a later call without it hangs up at once.
        """
        state = self._state
        if state.phase in (CallPhase.ENDING, CallPhase.ENDED):
            return
        if self.plan is None:
            self.plan = plan
        if after_playout and state.phase is CallPhase.ANSWERED and self._still_playing():
            if self._waiting_since is None:
                self._waiting_since = asyncio.get_running_loop().time()
            return
        self._now(status)

    def _still_playing(self) -> bool:
        channel = self._state.channel
        return channel is not None and (
            channel.playout.queued_ms > 0 or channel.playout.playing is not None
        )

    def _now(self, status: int = 603) -> None:
        assert self.plan is not None
        self._waiting_since = None
        self._status = status
        state = self._state
        session = state.session
        if (
            session is not None
            and not session.state.terminal
            and self._steps.try_apply(sev.ServerHangup(self.plan.outcome, self.plan.reason))
        ):
            return  # the session's HangUp effect sends the BYE once the ending is durable
        if state.phase not in (CallPhase.ENDING, CallPhase.ENDED):
            self._bye()

    def on_tick(self) -> None:
        """A media tick: the BYE that waits for queued audio goes once it is heard, or late."""
        if self._waiting_since is not None and self._state.phase is CallPhase.ANSWERED:
            waited = asyncio.get_running_loop().time() - self._waiting_since
            if not self._still_playing() or waited > MAX_HANGUP_WAIT_S:
                self._now()

    def send_bye(self, reason: str, *, after_prompt: bool) -> None:
        """The session's HangUp effect: the BYE, after the prompt the same step queued."""
        state = self._state
        if state.phase in (CallPhase.ENDING, CallPhase.ENDED):
            return
        self.plan = self.plan or HangupPlan("canceled", reason)
        if after_prompt and self._still_playing():
            # The prompt this step queued (Say) is heard before the BYE.
            self._waiting_since = asyncio.get_running_loop().time()
        else:
            self._bye()

    def bye_now(self) -> None:
        """The BYE, at once, unless the call is already ending."""
        if self._state.phase not in (CallPhase.ENDING, CallPhase.ENDED):
            self._state.phase = CallPhase.ENDING
            self._services.submit(ev.Hangup(self._state.call_id, status=self._status))

    def _bye(self) -> None:
        if self.before_bye is not None and self.before_bye():
            return
        self._state.phase = CallPhase.ENDING
        self._services.submit(ev.Hangup(self._state.call_id, status=self._status))
