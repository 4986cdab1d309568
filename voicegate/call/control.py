"""What the agent may ask of its call (:class:`agents.base.CallControl`).

Audio goes through response handles the session records (responses.py); a hang-up is ours
(hangup.py); a tool request goes through the call's write path (voicegate/tools/call_tools.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from audio.speech.masking import mask_digits
from session import events as sev
from session.recovery import current_generation
from session.vocabulary import SpeechDecision
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallState
from voicegate.call.callback_keys import new_code
from voicegate.call.hangup import HangingUp, HangupPlan
from voicegate.call.responses import ResponseHandle, Responses
from voicegate.call.services import CallServices
from voicegate.call.transfer import CallTransfer
from voicegate.call.turns import CallerTurns
from voicegate.tools.call_tools import CallTools


@dataclass(frozen=True, slots=True)
class AgentWork:
    """Work an agent's own task hands to the call's task (:meth:`AgentControl.call_soon`)."""

    run: Callable[[], None]


@dataclass(frozen=True, slots=True)
class ResumeCodeReady:
    """The session's resume code, for the agent to read out (delivered from the call's task)."""

    code: str

    def __repr__(self) -> str:
        return "ResumeCodeReady(<code>)"  # a secret: never in a log line


class AgentControl:
    def __init__(
        self,
        state: CallState,
        services: CallServices,
        responses: Responses,
        hangup: HangingUp,
        turns: CallerTurns,
        tools: CallTools,
        transfer: CallTransfer,
        steps: SessionSteps | None = None,
        post: Callable[[object], None] | None = None,
    ) -> None:
        self._state = state
        self._services = services
        self._responses = responses
        self._hangup = hangup
        self._turns = turns
        self._tools = tools
        self._transfer = transfer
        self._steps = steps
        self._post = post
        # Set by a caller_said "confirmed", taken by the next tool request (the spoken yes).
        self._spoken_confirmation = False
        responses.on_admitted = self._admitted

    @property
    def rate(self) -> int:
        channel = self._state.channel
        return channel.rate if channel else 8000

    def respond(self) -> ResponseHandle:
        return self._responses.respond()

    def prompt(self, name: str) -> NDArray[np.int16]:
        return self._services.prompt(name, self.rate)

    def _admitted(self) -> None:
        if self._tools.receipts_seen:
            # Seed 000's last crash window: response audio buffered for playout after a receipt.
            self._services.faults.reached("during_playout")

    def hangup(self, reason: str, *, after_playout: bool = True) -> None:
        self._hangup.end(HangupPlan("completed", reason), after_playout=after_playout)

    def request_tool(
        self, tool: str, arguments: Mapping[str, Any], *, key: str | None = None
    ) -> str:
        # Approval by key press: only a request made while handling the caller's DTMF counts;
        # by voice: only the request right after a logged spoken confirmation.
        spoken, self._spoken_confirmation = self._spoken_confirmation, False
        key = self._tools.request(
            tool, arguments, key, approved=self._turns.in_dtmf, spoken=spoken
        )
        self._resume_code_for(tool, key)
        return key

    def _resume_code_for(self, tool: str, key: str) -> None:
        """A write started (its intent is the session's): issue the session's resume code, once,
        so a caller whose call drops can continue it (voicegate/call/callbacks.py); the agent is
        told the code to read out. Only its keyed digest is kept (session/callback.py)."""
        keys = self._services.callback_keys
        session = self._state.session_state
        settings = self._services.tools.get(tool)
        if keys is None or session is None or settings is None or self._steps is None:
            return
        if settings.kind != "write" or session.policy.callback_window_s <= 0:
            return
        if session.resume_code or key not in session.outstanding_keys():
            return
        code = new_code()
        issued = self._steps.try_apply(sev.ResumeCodeIssued(keys.code(self._state.call_id, code)))
        if issued and self._post is not None:
            self._post(ResumeCodeReady(code))

    def caller_said(
        self,
        text: str,
        grammar: str,
        confidence: float,
        decision: str,
        *,
        reason: str = "",
        sensitive: bool = False,
    ) -> None:
        if decision not in set(SpeechDecision):
            known = ", ".join(SpeechDecision)
            raise ValueError(f"decision {decision!r} is not one of {known}")
        said = sev.CallerSaid(
            mask_digits(text, sensitive=sensitive), grammar, round(confidence, 3), decision,
            reason,
        )  # fmt: skip
        session = self._state.session_state
        applied = (
            self._steps is not None
            and session is not None
            and not session.terminal
            and self._steps.try_apply(said)
        )
        if applied:
            self._services.metrics.caller_said.labels(decision).inc()
        self._spoken_confirmation = bool(applied) and decision == SpeechDecision.CONFIRMED

    def transfer(
        self, target: str | None = None, *, mode: str | None = None, complete: str | None = None
    ) -> str | None:
        refused = self._transfer.start(target, mode, complete)
        return None if refused is None else refused.message

    def consult_say(
        self, text: str | None = None, *, prompt: str | None = None, say_id: str = ""
    ) -> str | None:
        _id, refused = self._transfer.say(text=text, prompt=prompt, say_id=say_id)
        return None if refused is None else refused.message

    def consult_complete(self) -> str | None:
        refused = self._transfer.complete(by="agent")
        return None if refused is None else refused.message

    def consult_cancel(self) -> str | None:
        refused = self._transfer.cancel()
        return None if refused is None else refused.message

    # --- a remote agent's link (agents/remote/): the session's agent-link dimension --------------

    def link_lost(self) -> None:
        self._apply_link(sev.AgentLinkLost())

    def link_restored(self) -> None:
        session = self._state.session_state
        # AgentLinkRestored names the recovery it ends, or the transfer it came back during;
        # without either there is nothing to restore.
        if session is not None and (generation := current_generation(session)):
            self._apply_link(sev.AgentLinkRestored(generation))

    def link_failed(self, reason: str) -> None:
        self._apply_link(sev.AgentLinkFailed(reason))

    def _apply_link(self, event: sev.Event) -> None:
        session = self._state.session_state
        # A link event once the session ended (or before the call was set up) is moot.
        if self._steps is not None and session is not None and not session.terminal:
            self._steps.try_apply(event)

    def call_soon(self, work: Callable[[], None]) -> None:
        # STYLE.md habit 5: one task owns the call; an agent's own task hands work to it.
        if self._post is not None:
            self._post(AgentWork(work))

    @property
    def queued_ms(self) -> int:
        channel = self._state.channel
        return channel.playout.queued_ms if channel is not None else 0
