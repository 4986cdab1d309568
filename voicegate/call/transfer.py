"""A call's transfer, from the request to the outcome: blind (RFC 3515, RFC 5589 section 6),
bridged, or attended (RFC 5589 section 7: the consult leg, then REFER with Replaces), the last
two with their leg in voicegate/call/bridge.py, and the bridge as a blind transfer's fallback.

Who may ask: the control API, the agent (``CallControl.transfer``), the demo agent's key 0, and
the session's own needs_human ending when ``transfer.human_target`` is set (the handoff). The
session machine decides what each outcome means (session/machine.py: the gate, the guard, the
honest line); this module checks a request, sends the REFER once the TransferStarted step is
durable, and turns pjsua's progress reports into session events.

The handoff happens after the session has ended needs_human (it is already terminal, so nothing
more is logged as session events): the caller hears ``handoff`` instead of the goodbye, the REFER
goes to the human target with the same context headers, and the BYE follows the final NOTIFY or
the guard, whichever comes first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from agents.base import TransferUpdate
from audio.espeak import check_text
from audio.prompts import UnknownPrompt
from config.settings import CONSULT_COMPLETIONS, TRANSFER_MODES, TransferSettings
from session import events as sev
from session.resume import Handle
from session.state import Signaling
from telephony import events as ev
from telephony.sip_message import mask_uri
from telephony.transfer import context_headers
from voicegate.call.acting import SessionSteps
from voicegate.call.bridge import ATTENDED, BRIDGE, CallBridge
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.clock import SessionClock
from voicegate.call.consult import ConsultRefused
from voicegate.call.hangup import HangingUp
from voicegate.call.resume import CallResume
from voicegate.call.services import CallServices
from voicegate.call.timers import SessionTimers

log = logging.getLogger("voicegate.call")

HANDOFF_TIMER = "handoff_notify"
PROMPT_NAME = re.compile(r"[a-z0-9_]{1,64}")  # config.rules.prompt_name: a file name, no path
MODE = "blind"


@dataclass(frozen=True, slots=True)
class TransferRefused:
    """Why a transfer request changed nothing: ``status`` is the HTTP answer the control API
    gives (400 bad field, 403 target not allowed, 409 not now), ``field`` the field concerned."""

    status: int
    message: str
    field: str = ""


def status_class(status: int) -> str:
    return f"{min(max(status // 100, 1), 6)}xx"


class CallTransfer:
    def __init__(
        self,
        state: CallState,
        services: CallServices,
        steps: SessionSteps,
        hangup: HangingUp,
        timers: SessionTimers,
        clock: SessionClock,
        resume: CallResume,
    ) -> None:
        self._resume = resume
        self._state = state
        self._services = services
        self._steps = steps
        self._hangup = hangup
        self._timers = timers
        self._clock = clock
        self._accepted = False  # the REFER of the transfer in progress got its 2xx
        self._handoff: str | None = None  # the human target a handoff went to
        self._handoff_done = False
        self.mode = MODE  # the transfer in progress's: blind, or bridge (voicegate/call/bridge.py)
        self.bridge = CallBridge(state, services, steps, resume)
        hangup.before_bye = self._maybe_hand_off
        # How the agent hears of the transfer's progress (voicegate/call/notices.py).
        self.tell: Callable[[TransferUpdate], None] = lambda update: None
        self.bridge.tell = lambda update: self.tell(update)  # whatever ``tell`` is set to later

    @property
    def settings(self) -> TransferSettings:
        return self._services.transfer_for(self._state.tenant)

    # --- requests --------------------------------------------------------------------------------

    def check(self, target: str | None, mode: str | None) -> tuple[str, TransferRefused | None]:
        """The target a request resolves to, and why it is refused, if it is (changes nothing)."""
        settings = self.settings
        if mode is not None and mode not in TRANSFER_MODES:
            return "", TransferRefused(
                400,
                f"mode must be one of {', '.join(TRANSFER_MODES)}",
                "mode",
            )
        target = (target or settings.default_target).strip()
        if not target:
            return "", TransferRefused(
                409, "no target given and transfer.default_target is unset", "target"
            )
        if not settings.allows(target):
            return target, TransferRefused(
                403, "target is not in transfer.allowed_targets", "target"
            )
        state = self._state.session_state
        if self._state.phase is not CallPhase.ANSWERED or state is None or state.terminal:
            return target, TransferRefused(409, "the call is not answered", "call_id")
        if state.signaling is Signaling.TRANSFERRING:
            return target, TransferRefused(409, "a transfer is already in progress", "call_id")
        if state.signaling is not Signaling.UP or state.recovery is not None:
            return target, TransferRefused(
                409, f"the call cannot be transferred now ({state.status()})", "call_id"
            )
        wanted = mode or settings.default_mode
        if wanted in (BRIDGE, ATTENDED) and not self.bridge.has_slot():
            leg = "the bridge's leg" if wanted == BRIDGE else "the consult leg"
            return target, TransferRefused(
                503,
                f"no free call slot for {leg} to the target (the pair holds two)",
                "mode",
            )
        return target, None

    def start(
        self, target: str | None = None, mode: str | None = None, complete: str | None = None
    ) -> TransferRefused | None:
        """Start a transfer; None once it is under way (the REFER, or the leg to the target,
        follows the durable TransferStarted), else why not. ``complete`` overrides
        transfer.consult_complete for this (attended) transfer."""
        target, refused = self.check(target, mode)
        if refused is None and complete is not None:
            if complete not in CONSULT_COMPLETIONS:
                refused = TransferRefused(
                    400, f"complete must be one of {', '.join(CONSULT_COMPLETIONS)}", "complete"
                )
            elif (mode or self.settings.default_mode) != ATTENDED:
                refused = TransferRefused(
                    400, "complete applies to an attended transfer only", "complete"
                )
        if refused is not None:
            log.info(
                "transfer.refused",
                extra={
                    "call_id": self._state.call_id,
                    "why": refused.message,
                    "target": mask_uri(target),
                },
            )
            return refused
        mode = mode or self.settings.default_mode
        if not self._steps.try_apply(sev.TransferStarted(target, mode)):
            return TransferRefused(409, "the session refused the transfer now", "call_id")
        self._accepted = False
        self.mode = mode
        log.info(
            "transfer.started",
            extra={"call_id": self._state.call_id, "target": mask_uri(target), "mode": mode},
        )
        if mode in (BRIDGE, ATTENDED):
            # Both start with a leg of ours to the target: the bridge's, or the consult leg.
            consult = mode == ATTENDED
            self._steps.after_durable(
                lambda: self.bridge.place(target, consult=consult, complete=complete)
            )
        else:
            self._steps.after_durable(lambda: self._send_refer(target))
        self.tell(TransferUpdate("started"))
        return None

    def _send_refer(self, target: str) -> None:
        # Every transfer of an open session carries a new resume handle, durable before the
        # REFER leaves. A needs_human handoff has none: its session has ended, nothing to resume.
        def send(handle: Handle | None) -> None:
            headers = context_headers(self._state.call_id, handle.text if handle else None)
            self._services.submit(ev.Transfer(self._state.call_id, target, headers))

        state = self._state.session_state
        if state is not None and state.terminal:
            send(None)
        else:
            self._resume.issue("transfer", send)

    def consult_stage(self) -> str | None:
        consultation = self.bridge.consultation
        if consultation is None or self.bridge.leg_id is None:
            return None
        return consultation.stage.value

    def complete(self, by: str = "api") -> TransferRefused | None:
        """``POST /v1/calls/{id}/transfer/complete`` (``by`` the agent: its consult_complete):
        hand the caller over to the person on the consult leg now (transfer.consult_complete =
        api or person, or to cut the brief short)."""
        why = self.bridge.complete(by)
        return TransferRefused(409, why, "call_id") if why is not None else None

    def say(
        self, *, text: str | None = None, prompt: str | None = None, say_id: str = ""
    ) -> tuple[str, TransferRefused | None]:
        """``POST /v1/calls/{id}/transfer/say`` (or the agent's consult_say): the say's id once
        it is queued for the person on the consult leg, else why not (400 naming the field:
        both or neither of text and prompt, a bad text, an unknown prompt; 409: no answered
        consult leg, or the hand-over under way). Nothing changes when it is refused."""
        if (text is None) == (prompt is None):
            return "", TransferRefused(400, "give exactly one of text and prompt", "text")
        if text is not None and (why := check_text(text)) is not None:
            return "", TransferRefused(400, why, "text")
        if prompt is not None and not PROMPT_NAME.fullmatch(prompt):
            return "", TransferRefused(
                400, "prompt must be 1 to 64 lower-case letters, digits or '_'", "prompt"
            )
        try:
            return self.bridge.say(text=text, prompt=prompt, say_id=say_id), None
        except ConsultRefused as exc:
            return "", TransferRefused(409, str(exc), "call_id")
        except UnknownPrompt:
            return "", TransferRefused(400, f"no prompt named {prompt}", "prompt")

    def cancel(self) -> TransferRefused | None:
        """``POST /v1/calls/{id}/transfer/cancel``: call the consultation off; the caller goes
        back to the agent."""
        why = self.bridge.cancel()
        return TransferRefused(409, why, "call_id") if why is not None else None

    # --- progress --------------------------------------------------------------------------------

    def status(self, report: ev.TransferStatus) -> None:
        """pjsua's report of the REFER we sent: progress, or the transfer's outcome."""
        metrics = self._services.metrics
        metrics.transfer_notifies.labels(
            status_class(report.status), "true" if report.final else "false"
        ).inc()
        log.info(
            "transfer.progress",
            extra={
                "call_id": self._state.call_id,
                "status": report.status,
                "final": report.final,
            },
        )
        if self._handoff is not None:
            if report.final:
                self._end_handoff(self._outcome(report))
            elif report.status == 100:
                self._accepted = True
            return
        state = self._state.session_state
        if state is None or state.signaling is not Signaling.TRANSFERRING or state.transfer is None:
            return  # late: the guard took the caller back, or the call is over
        if not report.final:
            if report.status == 100 and not self._accepted:
                self._accepted = True  # the REFER's 2xx (pjsua reports it as 100 Accepted)
            if self._steps.try_apply(sev.TransferProgress(report.status)):
                self.tell(TransferUpdate("trying", report.status))
            return
        ok = 200 <= report.status < 300
        generation = state.transfer.generation
        if not ok and not self._accepted and self._falls_back():
            # The REFER itself was refused (a carrier without REFER): bridge instead.
            if self._steps.try_apply(sev.TransferFellBack(generation, report.status)):
                metrics.transfers.labels(self.mode, "refused").inc()
                self.mode = BRIDGE
                target = state.transfer_target
                log.info("transfer.fell_back", extra={"call_id": self._state.call_id})
                self.tell(TransferUpdate("trying", report.status, "REFER refused: bridging"))
                self._steps.after_durable(lambda: self.bridge.place(target))
            return
        if self._steps.try_apply(sev.TransferFinished(generation, ok=ok, status=report.status)):
            outcome = self._outcome(report)
            metrics.transfers.labels(self.mode, outcome).inc()
            self.tell(TransferUpdate(outcome, report.status))
            if not ok:
                self.bridge.give_up()  # an attended transfer's consult leg, if still there

    def _falls_back(self) -> bool:
        return (
            self.mode == MODE and self.settings.fallback == BRIDGE and self.bridge.has_slot()
        )

    def _outcome(self, report: ev.TransferStatus) -> str:
        if 200 <= report.status < 300:
            return "completed"
        return "failed" if self._accepted else "refused"

    def guard_fired(self, was_transferring: bool) -> None:
        """The session's NOTIFY guard went off (its step is applied by the call's task)."""
        state = self._state.session_state
        if was_transferring and state is not None and state.signaling is Signaling.UP:
            self._services.metrics.transfers.labels(self.mode, "timed_out").inc()
            log.warning("transfer.timed_out", extra={"call_id": self._state.call_id})
            self.bridge.give_up()
            self.tell(TransferUpdate("failed", 0, "no final NOTIFY in time"))

    def caller_left(self, was_transferring: bool) -> None:
        if was_transferring:
            self._services.metrics.transfers.labels(self.mode, "caller_left").inc()

    # --- the needs_human handoff -----------------------------------------------------------------

    def hands_off(self) -> bool:
        """Whether an ending that leaves outcomes unknown goes to a person (not just goodbye)."""
        return bool(self.settings.human_target) and self._state.phase is CallPhase.ANSWERED

    def prompt(self, name: str) -> str:
        """The prompt a session Say plays: an unknown outcome is told the handoff instead."""
        return "handoff" if name == "outcome_unknown" and self.hands_off() else name

    def _maybe_hand_off(self) -> bool:
        """Called before our BYE: True if a handoff takes its place (the BYE comes later)."""
        state = self._state.session_state
        if self._handoff_done or self._handoff is not None or state is None:
            return False
        if not (state.terminal and state.outstanding and self.hands_off()):
            return False
        target = self._handoff = self.settings.human_target
        self._accepted = False
        log.info(
            "transfer.handoff",
            extra={"call_id": self._state.call_id, "target": mask_uri(target), "mode": MODE},
        )
        self._send_refer(target)
        self._timers.arm(HANDOFF_TIMER, self._clock.now() + self.settings.notify_timeout_s, 0, 0)
        return True

    def handoff_timed_out(self) -> None:
        if self._handoff is not None and not self._handoff_done:
            self._end_handoff("timed_out")

    def _end_handoff(self, outcome: str) -> None:
        self._handoff_done = True
        self._timers.cancel(HANDOFF_TIMER)
        self._services.metrics.transfers.labels(MODE, outcome).inc()
        log.info(
            "transfer.handoff_ended", extra={"call_id": self._state.call_id, "outcome": outcome}
        )
        # RFC 5589 section 6: the transferor's BYE; after a failure there is nobody else to
        # hand the caller to, and the caller already heard why.
        self._hangup.bye_now()
