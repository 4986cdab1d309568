"""Telephony events as session events: how the dialog ended, media lost and back, re-INVITEs,
and the answer to a recovery's dialog probe.

The session machine decides what each means; this module only says which session event a SIP
event is, given the call's phase and the session's state.
"""

from __future__ import annotations

import logging

from session import events as sev
from session.recovery import current_generation
from session.state import Signaling
from telephony import events as ev
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.hangup import HangingUp
from voicegate.call.responses import Responses
from voicegate.call.services import CallServices

log = logging.getLogger("voicegate.call")


class SipEvents:
    def __init__(
        self,
        state: CallState,
        services: CallServices,
        steps: SessionSteps,
        responses: Responses,
        hangup: HangingUp,
    ) -> None:
        self._state = state
        self._services = services
        self._steps = steps
        self._responses = responses
        self._hangup = hangup
        # What telephony.media_health last said (shown by /v1/calls).
        self.media_health = "flowing"

    def ended(self, ended: ev.CallEnded) -> None:
        """The dialog ended: the session records why, unless it has already ended."""
        session = self._state.session
        if session is not None and session.state.signaling in (Signaling.AWAY, Signaling.DROPPED):
            # Our BYE after a transfer, or after the media was lost for good: the session waits
            # for its caller to come back (session/away.py, session/callback.py).
            return
        if session is not None and not session.state.terminal:
            plan = self._hangup.plan
            if self._state.outbound and not ended.answered and not (ended.by == "server" and plan):
                # Our INVITE's final answer (486, 603, ...), or our own 503 for one that never
                # left: an outbound leg's explicit outcome (session.legs).
                self._steps.try_apply(sev.LegUnanswered(ended.status, ended.reason))
            elif ended.by == "caller" and ended.status in (200, 487):
                # 200: the caller's BYE; 487: the caller's CANCEL before we answered.
                self._steps.try_apply(sev.CallerHangup())
            elif ended.status == 408 and "refresh" in ended.reason.lower():
                # RFC 4028 expiry: PJSIP's session timer ended the dialog.
                self._steps.try_apply(sev.SessionExpired(ended.reason))
            elif ended.by == "server" and plan is not None:
                self._steps.try_apply(sev.ServerHangup(plan.outcome, plan.reason))
            else:
                self._steps.try_apply(sev.DialogFailed(ended.status, ended.reason))

    def media_health_changed(self, health: str) -> None:
        """RTP stopped or came back (telephony.media_health): the session's media dimension."""
        self.media_health = health
        state = self._state.session_state
        if state is None or state.terminal or self._state.phase is not CallPhase.ANSWERED:
            return
        if state.signaling is Signaling.BRIDGED:
            return  # people talk through the bridge: a gap is theirs to notice, not the agent's
        log.info("call.media_health", extra={"call_id": self._state.call_id, "health": health})
        if health == "interrupted":
            self._services.metrics.media_gaps.inc()
        if health == "interrupted" and state.media.value == "flowing":
            # The step cuts the response; what the caller heard of it is recorded just before
            # (voicegate/call/acting.py), so it is not forgotten here.
            self._steps.try_apply(sev.MediaLost())
        elif health in ("flowing", "held") and state.media.value == "interrupted":
            self._steps.try_apply(sev.MediaRestored(current_generation(state)))

    def reinvite_started(self) -> None:
        if self._state.phase is CallPhase.ANSWERED:
            self._steps.try_apply(sev.ReinviteStarted())  # cut as MediaLost is

    def reinvite_finished(self, ok: bool) -> None:
        state = self._state.session_state
        if state is not None and state.recovery is not None:
            self._steps.try_apply(sev.ReinviteFinished(state.recovery.generation, ok))

    def dialog_probed(self, probed: ev.DialogProbed) -> None:
        log.info(
            "recovery.probed",
            extra={
                "call_id": self._state.call_id,
                "status": probed.status,
                "attempt": probed.attempt,
            },
        )
        self._steps.try_apply(
            sev.RecoveryProbed(probed.generation, probed.attempt, probed.status, probed.reason)
        )
