"""The leg voicegate places to a transfer's target: a bridged transfer's (and the bridge's
life), or an attended transfer's consult leg (answered: ``consult_answered``, then the
consultation, voicegate/call/consult.py: the brief and the go-ahead, then the REFER with
Replaces in the caller's dialog, telephony/refer.py; it ending before that REFER fails the
transfer, after it is the target's normal end of the consult dialog, RFC 5589 section 7.1).

Asked for as ``mode = "bridge"`` (the control API, an agent's ``transfer(target, mode=...)``,
``transfer.default_mode``), or as ``transfer.fallback = "bridge"`` when a blind transfer's REFER
is refused. The session machine decides what each step means (session/bridge.py); this module
places the leg once the step that asks for it is durable, and turns the leg's SIP events into
session events:

- the leg carries the same context as a REFER would (telephony.transfer.context_headers:
  ``User-to-User``, ``X-Voicegate-Session``, and a new ``X-Voicegate-Resume`` handle, durable
  before the INVITE leaves, docs/tenants.md) as headers of its INVITE. An attended transfer's
  REFER with Replaces carries none: pjsua builds its Refer-To (``xferReplaces``), and the call
  centre already has the handle from the consult INVITE;
- answered, the SIP thread connects both calls' audio in the conference bridge and reports
  ``Bridged`` (telephony/bridge.py): ``bridge_up``;
- the leg ends: before its answer (busy, no answer, failed) the transfer failed and the caller
  goes back to the agent; after it, the bridge is over (``bridge_ended`` by the target) and the
  caller gets our BYE. The caller's end hangs the leg up.

Slots: the bridged pair holds two of the worker's call slots. A bridge is refused up front (503)
when no slot is free for its leg, instead of failing half-way.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable

from agents.base import ConsultEvent, TransferUpdate
from session import events as sev
from session.resume import Handle
from session.state import Signaling
from telephony import events as ev
from telephony.sip_message import mask_uri
from telephony.transfer import context_headers
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallState
from voicegate.call.consult import Consultation, ConsultRefused, Synthesize
from voicegate.call.resume import CallResume
from voicegate.call.services import CallServices

log = logging.getLogger("voicegate.call")

BRIDGE = "bridge"
ATTENDED = "attended"


class CallBridge:
    def __init__(
        self, state: CallState, services: CallServices, steps: SessionSteps, resume: CallResume
    ) -> None:
        self._resume = resume
        self._state = state
        self._services = services
        self._steps = steps
        self.leg_id: str | None = None  # the leg to the target, until it has ended
        self.up = False
        self._counted = False  # the transfer's outcome went into the metric
        self.consult = False  # the leg is an attended transfer's consult leg, not a bridge's
        self._refer_sent = False  # (attended) the REFER with Replaces went out
        # (attended) the brief and the go-ahead before the REFER (voicegate/call/consult.py).
        self.consultation: Consultation | None = None
        # How the agent hears how the leg went (CallTransfer forwards it to its own ``tell``):
        # completed once bridged, failed (refused: no slot) when the target is not reached. An
        # attended transfer's completion is its REFER's final NOTIFY, told by CallTransfer.
        self.tell: Callable[[TransferUpdate], None] = lambda update: None
        # What the agent hears of a consultation (agents.base.ConsultEvent), and how text said
        # to the person is synthesised (voicegate/call/consult_speech.py); set by the call.
        self.notify: Callable[[ConsultEvent], None] = lambda event: None
        self.synthesize: Synthesize | None = None

    def has_slot(self) -> bool:
        """Whether the worker has a free call slot for the bridge's leg (the pair holds two)."""
        return self._services.free_slots() >= 1

    def owns(self, call_id: str) -> bool:
        return self.leg_id is not None and call_id == self.leg_id

    def place(self, target: str, *, consult: bool = False, complete: str | None = None) -> None:
        """Dial the target (the session's step asking for it is durable): a bridge's leg, or an
        attended transfer's consult leg (``complete``: its consult_complete, if the request
        named one). Either carries the context headers on its INVITE, with a new resume handle
        once that is durable."""
        call_id = self._state.call_id
        leg_id = self.leg_id = uuid.uuid4().hex
        self.up = self._counted = self._refer_sent = False
        self.consult = consult
        settings = self._services.transfer_for(self._state.tenant)
        if complete is not None:
            settings = dataclasses.replace(settings, consult_complete=complete)
        self.consultation = (
            Consultation(
                call_id,
                settings,
                self._services.prompt,
                self._send_replaces,
                lambda detail: self.tell(TransferUpdate("trying", 200, detail)),
                notify=lambda event: self.notify(event),
                decline=lambda: self._call_off(603, "declined", "declined by the person"),
                synthesize=self.synthesize,
            )
            if consult
            else None
        )
        self._services.adopt_leg(leg_id, call_id)
        log.info(
            "transfer.consult_dialing" if consult else "transfer.bridge_dialing",
            extra={"call_id": call_id, "leg_id": leg_id, "target": mask_uri(target)},
        )

        def dial(handle: Handle | None) -> None:
            state = self._state.session_state
            if (
                self.leg_id != leg_id
                or state is None
                or state.signaling is not Signaling.TRANSFERRING
            ):
                if self.leg_id == leg_id:
                    self.leg_id = None
                return  # the transfer ended while the handle was stored: nobody to dial for
            headers = context_headers(call_id, handle.text if handle else None)
            # The tenant's transfer.caller_id: what the centre's screen shows for the leg.
            tenant = self._state.tenant
            caller_id = self._services.transfer_for(tenant).caller_id
            if consult:
                self._services.submit(
                    ev.Dial(
                        leg_id, target, headers, consult=True, caller_id=caller_id, tenant=tenant
                    )
                )
            else:
                self._services.submit(
                    ev.Dial(
                        leg_id,
                        target,
                        headers,
                        bridge_to=call_id,
                        caller_id=caller_id,
                        tenant=tenant,
                    )
                )

        self._resume.issue("transfer", dial)

    def on_leg_event(self, event: object) -> None:
        """A SIP event of the leg (its answer, the bridge, its end); the rest is not ours."""
        state = self._state.session_state
        if state is None:
            return
        match event:
            case ev.MediaReady(channel=channel) if self.consultation is not None:
                self.consultation.media(channel)
            case ev.CallAnswered() if self.consultation is not None:
                transfer = state.transfer
                if state.signaling is not Signaling.TRANSFERRING or transfer is None:
                    return
                if self._steps.try_apply(sev.ConsultAnswered(transfer.generation)):
                    self._steps.after_durable(self.consultation.answered)
            case ev.Bridged():
                transfer = state.transfer
                if state.signaling is not Signaling.TRANSFERRING or transfer is None:
                    return
                if self._steps.try_apply(sev.BridgeUp(transfer.generation)):
                    self.up = True
                    self._services.metrics.bridged_legs.inc(2)
                    log.info("transfer.bridged", extra={"call_id": self._state.call_id})
                    self.tell(TransferUpdate("completed", 200, "bridged"))
            case ev.DtmfReceived(digit=digit, method=method) if self.consultation is not None:
                self._services.metrics.dtmf_digits.labels(method).inc()
                self.consultation.key(digit)
            case ev.CallEnded(status=status):
                self.leg_id = None
                if self.consultation is not None:
                    self.consultation.close()
                log.info(
                    "transfer.bridge_leg_ended",
                    extra={"call_id": self._state.call_id, "status": status, "bridged": self.up},
                )
                if self.up:
                    self._bridge_over()
                    if state.signaling is Signaling.BRIDGED:
                        self._steps.try_apply(sev.BridgeEnded("target"))
                elif self._refer_sent:
                    # RFC 5589 section 7.1: the target ends the consult dialog once the caller's
                    # INVITE with Replaces took its place; the REFER's NOTIFYs tell the outcome.
                    pass
                elif state.signaling is Signaling.TRANSFERRING and state.transfer is not None:
                    # Not answered: busy, no answer, failed, or no free slot after all.
                    generation = state.transfer.generation
                    if self._steps.try_apply(
                        sev.TransferFinished(generation, ok=False, status=status)
                    ):
                        outcome = "refused" if status == 503 else "failed"
                        self._count(outcome)
                        self.tell(TransferUpdate(outcome, status))
            case _:
                pass

    def _send_replaces(self) -> None:
        state = self._state.session_state
        if self.leg_id is None or state is None or state.signaling is not Signaling.TRANSFERRING:
            return  # the consult leg ended in between (its end failed the transfer), or the guard
        self._refer_sent = True
        self._services.submit(ev.TransferReplaces(self._state.call_id, self.leg_id))

    def tick(self) -> None:
        if self.consultation is not None and self.leg_id is not None:
            self.consultation.tick()

    def _consulting(self) -> Consultation | None:
        state = self._state.session_state
        if (
            self.consultation is None
            or self.leg_id is None
            or state is None
            or state.signaling is not Signaling.TRANSFERRING
        ):
            return None
        return self.consultation

    def complete(self, by: str = "api") -> str | None:
        """``POST .../transfer/complete`` (or the agent's): hand the caller over now (None),
        else why not."""
        consultation = self._consulting()
        if consultation is None:
            return "no attended transfer is consulting"
        return consultation.complete(by)

    def say(self, *, text: str | None = None, prompt: str | None = None, say_id: str = "") -> str:
        """``POST .../transfer/say`` (or the agent's): queue it for the person on the consult
        leg; the say's id, else :class:`ConsultRefused` (409) or UnknownPrompt."""
        consultation = self._consulting()
        if consultation is None:
            raise ConsultRefused("no attended transfer is consulting")
        return consultation.say(text=text, prompt=prompt, say_id=say_id)

    def cancel(self) -> str | None:
        """``POST .../transfer/cancel``: the consultation is called off before the hand-over;
        the consult leg is hung up and the caller goes back to the agent (None), else why not."""
        return self._call_off(487, "canceled", "canceled before the hand-over")

    def _call_off(self, status: int, outcome: str, detail: str) -> str | None:
        state = self._state.session_state
        consultation = self.consultation
        if consultation is None or self.leg_id is None or state is None:
            return "no attended transfer is consulting"
        if self._refer_sent:
            return "the caller is already being handed over"
        transfer = state.transfer
        if state.signaling is not Signaling.TRANSFERRING or transfer is None:
            return "no attended transfer is consulting"
        if not self._steps.try_apply(
            sev.TransferFinished(transfer.generation, ok=False, status=status)
        ):
            return "the session refused the cancel now"
        log.info(
            "transfer.consult_canceled", extra={"call_id": self._state.call_id, "why": outcome}
        )
        self._count(outcome)
        self.tell(TransferUpdate("failed", status, detail))
        self._services.submit(ev.Hangup(self.leg_id))
        return None

    def give_up(self) -> None:
        """The transfer is over without the bridge (its guard fired, the consult or its REFER
        failed): hang up the leg, or CANCEL it while it rings."""
        if self.leg_id is not None and not self.up:
            self._services.submit(ev.Hangup(self.leg_id, status=487))

    def release(self) -> None:
        """The caller's call is ending: the leg is hung up too (whoever is still on it)."""
        if self.up:
            self._bridge_over()
        if self.leg_id is not None:
            self._services.submit(ev.Hangup(self.leg_id))

    def _bridge_over(self) -> None:
        self.up = False
        self._services.metrics.bridged_legs.dec(2)
        self._count("completed")

    def _count(self, outcome: str) -> None:
        if not self._counted:
            self._counted = True
            mode = ATTENDED if self.consult else BRIDGE
            self._services.metrics.transfers.labels(mode, outcome).inc()
