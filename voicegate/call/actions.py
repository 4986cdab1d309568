"""The actions of one live call that the session's effects map onto (the
:class:`~voicegate.call.executor.EffectTarget` that voicegate/call/executor.py calls).

Each action is small: it hands the decision to the part of the call that owns what it changes
(the playout, responses, timers, tool calls, the agent's notices, the hang-up).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agents.base import GateChange
from session.vocabulary import IntentStage, Interruption
from telephony import events as ev
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.clock import SessionClock
from voicegate.call.hangup import HangingUp
from voicegate.call.notices import AgentNotices
from voicegate.call.responses import Responses
from voicegate.call.services import CallServices
from voicegate.call.timers import SessionTimers
from voicegate.tools.call_tools import CallTools

log = logging.getLogger("voicegate.call")


class CallActions:
    def __init__(
        self,
        state: CallState,
        services: CallServices,
        clock: SessionClock,
        *,
        responses: Responses,
        hangup: HangingUp,
        timers: SessionTimers,
        tools: CallTools,
        notices: AgentNotices,
        prompt_for: Callable[[str], str] = str,
    ) -> None:
        self._state = state
        self._services = services
        self._clock = clock
        self._responses = responses
        self._hangup = hangup
        self._timers = timers
        self._tools = tools
        self._notices = notices
        # What a session Say plays: the needs_human handoff tells the caller why they are being
        # put through instead of saying goodbye (voicegate/call/transfer.py).
        self._prompt_for = prompt_for
        # Told each line the session says (voicegate/call/hold.py starts after "reconnecting").
        self.on_said: Callable[[str], None] = lambda prompt: None

    def clear_playout(self, generation: int) -> None:
        channel = self._state.channel
        if channel is not None and generation > channel.playout.generation:
            # A cut the session makes itself. Whatever played was cut, and what the caller heard
            # of it recorded, just before this step (voicegate/call/cuts.py), as a barge-in or
            # a cancel cuts before theirs; so this normally finds nothing left to tell.
            was = channel.playout.generation
            self._responses.tell_cut(channel.playout.interrupt(generation), was, self._cut_reason())
        # Nothing queued before the clear may continue: the next chunk opens a new response.
        self._responses.forget()

    def _cut_reason(self) -> str:
        state = self._state.session_state
        if state is None or state.terminal:
            ended = state.ended if state is not None else None
            timed_out = ended is not None and ended.terminal_state == "timed_out"
            return "timeout" if timed_out else "ending"
        if state.transfer is not None:
            return "transfer"
        if state.recovery is not None:
            return state.recovery.interruptions[-1]
        return "ending"

    def cancel_response(self, response_id: str) -> None:
        if self._responses.response_id == response_id:
            self._responses.forget()

    def bind_response(self, response_id: str, generation: int) -> None:
        channel = self._state.channel
        if channel is not None:
            channel.playout.begin(response_id, generation)

    def stop_generation(self) -> None:
        self._notices.post("stop", "")

    def gate_changed(self, old: str, new: str) -> None:
        log.info("session.gate", extra={"call_id": self._state.call_id, "old": old, "new": new})
        # Telling the agent is not a side effect the gate guards: whatever it asks next is
        # checked against the gate in memory, which has already moved.
        self._notices.tell(GateChange(new, old, self._gate_reason(old, new)))

    def _gate_reason(self, old: str, new: str) -> str:
        state = self._state.session_state
        if state is None:
            return ""
        if new == "frozen" and state.transfer is not None:
            return "transfer"  # its own phase: the agent is not told of a fault
        if new == "frozen" and state.recovery is not None:
            return "+".join(state.recovery.interruptions)
        if new == "reconciling":
            return f"{len(state.outstanding)} tool calls to settle with the provider"
        if new == "closed":
            return state.ended.reason if state.ended is not None else "the session is ending"
        if new == "open":
            return "reconciled" if old == "reconciling" else "recovered"
        return new

    def recovery_started(self, generation: int, interruption: str, deadline: float) -> None:
        log.info(
            "recovery.started",
            extra={
                "call_id": self._state.call_id,
                "generation": generation,
                "interruption": interruption,
                "deadline_in_s": round(deadline - self._clock.now(), 3),
            },
        )

    def attempt_recovery(
        self, generation: int, attempt: int, interruptions: tuple[str, ...]
    ) -> None:
        # A re-INVITE or a transfer is its own SIP transaction and answers for itself; a media
        # gap has no transaction, so its attempt asks the dialog whether it still exists.
        log.info(
            "recovery.attempt",
            extra={"call_id": self._state.call_id, "generation": generation, "attempt": attempt},
        )
        if Interruption.MEDIA in interruptions and self._state.phase is CallPhase.ANSWERED:
            self._probe_dialog(generation, attempt)

    def _probe_dialog(self, generation: int, attempt: int) -> None:
        # RFC 3261 section 11: an OPTIONS inside the dialog. A 481 or 408 (or no transport)
        # means the peer no longer has the dialog (section 12.2.1.2): RecoveryProbed ends the
        # session failed at once, instead of waiting out session.recovery_timeout_s. (PJSIP's
        # own dialog layer then sends the BYE 12.2.1.2 asks for; the session sends none.)
        self._services.submit(ev.ProbeDialog(self._state.call_id, generation, attempt))

    def recovery_finished(self, generation: int, outcome: str) -> None:
        log.info(
            "recovery.finished",
            extra={"call_id": self._state.call_id, "generation": generation, "outcome": outcome},
        )

    def transfer_ended(self, generation: int, mode: str, outcome: str, duration_s: float) -> None:
        log.info(
            "transfer.finished",
            extra={
                "call_id": self._state.call_id,
                "generation": generation,
                "mode": mode,
                "outcome": outcome,
                "duration_s": duration_s,
            },
        )

    def schedule_timer(self, name: str, due: float, generation: int, attempt: int) -> None:
        self._timers.arm(name, due, generation, attempt)

    def cancel_timer(self, name: str) -> None:
        self._timers.cancel(name)

    def reconcile(self, keys: tuple[str, ...]) -> None:
        self._tools.reconcile(keys, tool_of=self._tool_of)

    def send_tool_request(self, key: str) -> None:
        intent = self._state.outstanding(key)
        if intent is None:
            return
        row = self._tools.persist_intent(intent)  # its row, whether it goes now or later
        if intent.stage is IntentStage.INTENDED:
            # A held one waits for the gate (session/ledger.py): the gate's release sends it.
            self._tools.send(intent, row)

    def settle_unsent(self, key: str, reason: str) -> None:
        self._tools.settle_unsent(key, reason)

    def cancel_tool_calls(self, keys: tuple[str, ...]) -> None:
        self._tools.cancel(keys)

    def persist_outstanding(self, keys: tuple[str, ...]) -> None:
        state = self._state.session_state
        if state is None:
            return
        self._tools.persist_outstanding([o for o in state.outstanding if o.key in keys])

    def say(self, prompt: str) -> None:
        self._responses.say(self._prompt_for(prompt))
        self.on_said(prompt)

    def notify_agent(self, what: str, detail: str) -> None:
        # Agents are awaited from the call's own task, never from inside a step.
        self._notices.post(what, detail)

    def release_media(self) -> None:
        # No more caller audio to VAD or the agent, and no agent audio admitted; what the
        # session itself queued (a goodbye) still plays before the BYE.
        self._state.media_released = True
        if self._state.channel is not None:
            self._state.channel.discard_inbound()

    def hang_up(self, reason: str, *, after_prompt: bool) -> None:
        self._hangup.send_bye(reason, after_prompt=after_prompt)

    def finished(self, terminal_state: str, reason: str, stage: str | None) -> None:
        self._timers.cancel_all()

    def stale_event_ignored(self, event_type: str, why: str) -> None:
        log.debug(
            "session.stale_event",
            extra={"call_id": self._state.call_id, "event_type": event_type, "why": why},
        )

    def _tool_of(self, key: str) -> str:
        intent = self._state.outstanding(key)
        return intent.tool if intent else ""
