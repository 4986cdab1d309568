"""The session state machine: ``step(state, event, now) -> (state, effects)``. No I/O; time only
via ``now``.

Every transition is in this module, one ``_on_<event>`` function per event type, and one table,
:data:`TRANSITIONS` (at the bottom, after the functions it names), lists every event type, the
signaling states it may occur in, and what happens elsewhere: refused, or ignored as stale. A
function either returns the new state and its effects, or raises :class:`IllegalTransition`
(naming the state and the event) and changes nothing. Stale events (an older recovery
generation, a response that already ended) are not errors: they are ignored, state unchanged,
with a :class:`~session.effects.StaleEventIgnored` effect the runtime counts.

The actions the transitions share live in modules named for them: :mod:`session.gate` (freeze,
reconcile, open), :mod:`session.recovery` (interrupt, recover, the retry schedule),
:mod:`session.ending` (the terminal transition and its reasons), :mod:`session.deadlines` (timer
names, no-input), :mod:`session.playback` (generations).

The rules, with their sources:
- Any interruption (media gap, re-INVITE, transfer, agent-link loss) freezes the side-effect gate,
  cancels the active response and bumps the playback generation in the same step (seed 000, "On
  disconnect, first freeze new side effects, cancel/isolate the old response").
- Transport recovery does not open the gate; reconciliation does: no outstanding intents -> open;
  receipts committed/failed/not-started -> recorded, then open; unknown -> needs_human (seed 000's
  table).
- One recovery owns the session at a time: a generation, a deadline and a bounded, jittered retry
  schedule; leaving cancels it at once (seed 001).
- A timeout is a transition with effects (stop generation and tool calls, clear playout, persist
  outstanding intents, release media, tell the caller), never an exception (seed 000).
- Every session ends in exactly one terminal state and never leaves it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from session import away, bridge, callback, ending, ledger, legs, transfer
from session import effects as fx
from session import events as ev
from session.deadlines import Timer, arm, arm_no_input, drop, drop_all, forget
from session.errors import GateClosed, IllegalTransition, SessionTerminated
from session.gate import require_open, set_gate
from session.playback import bump_generation, cut_playback, end_response, on_prompt_cut
from session.recovery import (
    dialog_gone,
    finished,
    interrupt,
    recovered,
    retry_delay,
    schedule_retry,
    stale_generation,
)
from session.state import (
    AgentLink,
    Gate,
    Media,
    Outstanding,
    Policy,
    Response,
    SessionState,
    Signaling,
    Terminal,
    Turn,
)
from session.transfer_phase import end_phase
from session.transfer_phase import stale as stale_transfer
from session.vocabulary import (
    INTENT_KINDS,
    RECEIPT_OUTCOMES,
    SPEECH_DECISIONS,
    EndingStage,
    IntentKind,
    IntentStage,
    Interruption,
    Outcome,
    RecoveryOutcome,
    TransferOutcome,
)

Effects = fx.Effects
Result = tuple[SessionState, Effects]

# Kept for importers outside session/: voicegate/call/live_call.py imports RETRY from here.
RETRY = Timer.RETRY


def _ignored(event: ev.Event, why: str) -> Effects:
    """A stale event's step: nothing changes but one ``StaleEventIgnored`` (counted)."""
    return [fx.StaleEventIgnored(event.type, why)]


def _caller_present(state: SessionState) -> bool:
    """Someone is on the line to be told and hung up on (the dialog is up)."""
    return state.signaling in DIALOG_ALIVE


# --- signaling ----------------------------------------------------------------------------------


def _on_call_offered(state: SessionState, event: ev.CallOffered, now: float) -> Result:
    return replace(state, signaling=Signaling.OFFERED, policy=Policy.from_dict(event.policy)), []


def _on_call_answered(state: SessionState, event: ev.CallAnswered, now: float) -> Result:
    out: Effects = []
    state = drop(state, (Timer.RING,), out)  # an outbound leg's (session.legs)
    if state.policy.max_duration_s > 0:
        state = arm(state, Timer.MAX_DURATION, now + state.policy.max_duration_s, 0, out)
    state = replace(
        state, signaling=Signaling.UP, media=Media.FLOWING, media_since=now, answered_at=now
    )
    return arm_no_input(state, now, out), out


def _on_reinvite_started(state: SessionState, event: ev.ReinviteStarted, now: float) -> Result:
    out: Effects = []
    state = replace(state, signaling=Signaling.REINVITE_PENDING)
    return interrupt(state, Interruption.REINVITE, now, out), out


def _on_reinvite_finished(state: SessionState, event: ev.ReinviteFinished, now: float) -> Result:
    if why := stale_generation(state, event.generation):
        return state, _ignored(event, why)
    # RFC 6141: a failed re-INVITE leaves the previous session (and media) in place.
    out: Effects = []
    state = replace(state, signaling=Signaling.UP)
    return recovered(state, Interruption.REINVITE, now, out), out


def _on_caller_hangup(state: SessionState, event: ev.CallerHangup, now: float) -> Result:
    out: Effects = []
    # Seed 001: leaving invalidates recovery at once (RecoveryFinished: canceled, timers cancelled).
    if state.signaling is Signaling.BRIDGED:
        return bridge.on_bridge_ended(state, ev.BridgeEnded("caller"), now)
    if state.outstanding:
        # Before the answer too: a caller who called back (session.callback) is offered again
        # with the intents of the call that dropped, and canceled needs them reconciled (seed 000).
        terminal, stage = Terminal.NEEDS_HUMAN, EndingStage.HANGUP
        reason = f"caller hung up with {ending.unknown_outcomes(state)}"
    elif state.signaling is Signaling.OFFERED:
        terminal, reason, stage = Terminal.CANCELED, "caller hung up before answer", None
    elif state.signaling is Signaling.TRANSFERRING:
        # The BYE overtook the final NOTIFY (or replaced it): the caller's side ended our leg
        # while carrying out the REFER, so our part is over, but the outcome was not reported.
        terminal, stage = Terminal.COMPLETED, None
        reason = f"caller left during transfer (last NOTIFY {state.transfer_status or 'none'})"
    elif state.recovery is not None or state.gate is not Gate.OPEN:
        terminal, reason, stage = Terminal.CANCELED, "caller hung up during recovery", None
    else:
        terminal, reason, stage = Terminal.COMPLETED, "caller hung up", None
    state = end_phase(state, TransferOutcome.CALLER_LEFT, now, out)
    return ending.terminate(state, terminal, reason, stage, now, out, caller_present=False), out


def _on_dialog_failed(state: SessionState, event: ev.DialogFailed, now: float) -> Result:
    out: Effects = []
    reason = ending.dialog_failed(event.status, event.reason, state)
    return ending.terminate(
        state, Terminal.FAILED, reason, EndingStage.SIGNALING, now, out, caller_present=False
    ), out


def _on_agent_failed(state: SessionState, event: ev.AgentFailed, now: float) -> Result:
    return _agent_gone(state, f"agent failed: {event.reason}", EndingStage.AGENT, now)


def _on_session_expired(state: SessionState, event: ev.SessionExpired, now: float) -> Result:
    out: Effects = []
    reason = ending.session_expired(event.reason, state)
    # PJSIP has already sent the BYE: nobody is on the line to tell.
    return ending.terminate(
        state, Terminal.TIMED_OUT, reason, EndingStage.SESSION_TIMER, now, out, caller_present=False
    ), out


def _on_server_hangup(state: SessionState, event: ev.ServerHangup, now: float) -> Result:
    if event.outcome not in (Terminal.COMPLETED, Terminal.CANCELED):
        raise IllegalTransition(state, event, "a server hang-up ends completed or canceled")
    out: Effects = []
    terminal, reason, stage = Terminal(event.outcome), event.reason, None
    if state.outstanding:
        terminal, reason = Terminal.NEEDS_HUMAN, ending.with_unknown(event.reason, state)
        stage = EndingStage.HANGUP
    caller_present = state.signaling is not Signaling.GONE
    return ending.terminate(
        state, terminal, reason, stage, now, out, caller_present=caller_present
    ), out


# --- media and agent link -----------------------------------------------------------------------


def _on_media_lost(state: SessionState, event: ev.MediaLost, now: float) -> Result:
    if state.media is not Media.FLOWING:
        raise IllegalTransition(state, event, "media is not flowing")
    out: Effects = []
    state = replace(state, media=Media.INTERRUPTED, media_since=now)
    return _interrupted(state, Interruption.MEDIA, now, out), out


def _on_media_restored(state: SessionState, event: ev.MediaRestored, now: float) -> Result:
    if state.media is not Media.INTERRUPTED:
        return state, _ignored(event, "media is not interrupted")
    if why := _stale_restore(state, event.generation):
        return state, _ignored(event, why)
    out: Effects = []
    state = replace(state, media=Media.FLOWING, media_since=now)
    return _restored(state, Interruption.MEDIA, now, out), out


def _on_agent_link_lost(state: SessionState, event: ev.AgentLinkLost, now: float) -> Result:
    if state.agent_link is not AgentLink.CONNECTED:
        raise IllegalTransition(state, event, "the agent link is not connected")
    out: Effects = []
    state = replace(state, agent_link=AgentLink.LOST)
    return _interrupted(state, Interruption.AGENT_LINK, now, out), out


def _on_agent_link_restored(state: SessionState, event: ev.AgentLinkRestored, now: float) -> Result:
    if state.agent_link is not AgentLink.LOST:
        return state, _ignored(event, "the agent link is not lost")
    if why := _stale_restore(state, event.generation):
        return state, _ignored(event, why)
    out: Effects = []
    state = replace(state, agent_link=AgentLink.CONNECTED)
    return _restored(state, Interruption.AGENT_LINK, now, out), out


def _interrupted(
    state: SessionState, kind: Interruption, now: float, out: Effects
) -> SessionState:
    """A dimension broke. During a transfer it is only recorded: the session is halted already
    and the caller is being handed over, so there is nothing to recover unless the transfer
    fails (session.transfer.back_to_agent recovers it then)."""
    if state.transfer is not None:
        return state
    return interrupt(state, kind, now, out)


def _restored(state: SessionState, kind: Interruption, now: float, out: Effects) -> SessionState:
    return state if state.transfer is not None else recovered(state, kind, now, out)


def _stale_restore(state: SessionState, generation: int) -> str | None:
    """A restoring event names the recovery it ends, or the transfer it came back during."""
    if state.recovery is None and state.transfer is not None:
        return stale_transfer(state, generation)
    return stale_generation(state, generation)


def _on_agent_link_failed(state: SessionState, event: ev.AgentLinkFailed, now: float) -> Result:
    # Seed 000: past the deadline the ending is a transition with effects, never an exception.
    return _agent_gone(state, f"agent link failed: {event.reason}", EndingStage.AGENT_LINK, now)


def _agent_gone(state: SessionState, what: str, stage: EndingStage, now: float) -> Result:
    """The agent (or its link) is gone for good: the call cannot go on without it."""
    out: Effects = []
    reason = ending.with_unknown(what.rstrip(": "), state)
    # A tool call whose outcome nobody knows yet needs a person, as on any other hang-up.
    terminal = Terminal.NEEDS_HUMAN if state.outstanding else Terminal.FAILED
    # The caller is told (seed 004: never dead air, never a silent loss), then hung up on.
    return ending.terminate(
        state,
        terminal,
        reason,
        stage,
        now,
        out,
        caller_present=_caller_present(state),
        say="outcome_unknown" if state.outstanding else "technical_problem",
    ), out


# --- conversation -------------------------------------------------------------------------------


def _on_turn_started(state: SessionState, event: ev.TurnStarted, now: float) -> Result:
    require_open(state, event, "turn")
    if state.turn is not None and not state.turn.committed:
        raise IllegalTransition(state, event, f"turn {state.turn.turn_id} is still open")
    out: Effects = []
    return arm_no_input(replace(state, turn=Turn(event.turn_id)), now, out), out


def _on_turn_committed(state: SessionState, event: ev.TurnCommitted, now: float) -> Result:
    if state.turn is None or state.turn.turn_id != event.turn_id or state.turn.committed:
        raise IllegalTransition(state, event, f"turn {event.turn_id} is not open")
    out: Effects = []
    return arm_no_input(replace(state, turn=replace(state.turn, committed=True)), now, out), out


def _on_response_started(state: SessionState, event: ev.ResponseStarted, now: float) -> Result:
    require_open(state, event, "response")
    if state.response is not None:
        raise IllegalTransition(state, event, f"response {state.response.response_id} is active")
    response = Response(event.response_id, event.turn_id, state.playback_generation)
    out: Effects = [fx.BindResponse(event.response_id, state.playback_generation)]
    return replace(state, response=response), out


def _on_response_interrupted(
    state: SessionState, event: ev.ResponseInterrupted, now: float
) -> Result:
    if state.response is None or state.response.response_id != event.response_id:
        return state, _ignored(event, f"response {event.response_id} is not the active one")
    # Barge-in: the same generation bump and clear as every other interruption.
    out: Effects = []
    state = bump_generation(end_response(state, event, event.response_id), out)
    out.append(
        fx.NotifyAgent("response_interrupted", f"{event.response_id} heard_ms={event.heard_ms}")
    )
    return state, out


def _on_response_finished(state: SessionState, event: ev.ResponseFinished, now: float) -> Result:
    if state.response is None or state.response.response_id != event.response_id:
        return state, _ignored(event, f"response {event.response_id} is not the active one")
    return end_response(state, event, event.response_id), []


def _on_barge_in_judged(state: SessionState, event: ev.BargeInJudged, now: float) -> Result:
    # A record for the log and the SRE: the cut already happened (ResponseInterrupted), and
    # resuming is the agent's own new response, so nothing in the session moves.
    if event.outcome not in ("confirmed", "false"):
        raise IllegalTransition(state, event, f"outcome {event.outcome!r} is not confirmed/false")
    return state, []


# --- side effects -------------------------------------------------------------------------------


def _find(state: SessionState, key: str) -> Outstanding | None:
    return next((o for o in state.outstanding if o.key == key), None)


def _on_tool_intent(state: SessionState, event: ev.ToolIntent, now: float) -> Result:
    if event.kind not in INTENT_KINDS:
        raise IllegalTransition(state, event, f"tool kind {event.kind!r} is neither read nor write")
    if event.kind == IntentKind.WRITE:
        require_open(state, event, "write tool call")
    elif state.gate is Gate.CLOSED:
        raise GateClosed(state, event, "the gate is closed")
    if _find(state, event.key) is not None:
        raise IllegalTransition(state, event, f"intent {event.key} is already outstanding")
    intent = Outstanding(
        event.key,
        event.tool,
        IntentKind(event.kind),
        event.digest,
        event.turn_id,
        arguments=dict(event.arguments),
        valid_until=None if event.approval_valid_s is None else now + event.approval_valid_s,
    )
    out: Effects = [fx.SendToolRequest(event.key)]
    return replace(state, outstanding=(*state.outstanding, intent)), out


def _on_tool_request_sent(state: SessionState, event: ev.ToolRequestSent, now: float) -> Result:
    intent = _find(state, event.key)
    if intent is not None and intent.stage is IntentStage.HELD:
        # Admitted before the gate froze: it goes when the gate reopens (session/ledger.py).
        raise GateClosed(state, event, f"intent {event.key} is held while the gate is not open")
    if intent is None or intent.stage is not IntentStage.INTENDED:
        raise IllegalTransition(state, event, f"intent {event.key} is not waiting to be sent")
    if state.gate is not Gate.OPEN and intent.kind is IntentKind.WRITE:
        raise GateClosed(state, event, f"no write request while the gate is {state.gate.value}")
    updated = tuple(
        replace(o, stage=IntentStage.SENT) if o.key == event.key else o for o in state.outstanding
    )
    return replace(state, outstanding=updated), []


def _on_tool_request_withheld(
    state: SessionState, event: ev.ToolRequestWithheld, now: float
) -> Result:
    intent = _find(state, event.key)
    if intent is None or intent.stage is not IntentStage.SENT:
        raise IllegalTransition(state, event, f"intent {event.key} is not on its way")
    if state.gate is Gate.OPEN:
        raise IllegalTransition(state, event, "a request is withheld only by a frozen gate")
    updated = tuple(
        replace(o, stage=IntentStage.HELD) if o.key == event.key else o for o in state.outstanding
    )
    out: Effects = []
    state = replace(state, outstanding=updated)
    if state.gate is Gate.RECONCILING and not ledger.to_query(updated):
        # It was the one being asked about: nothing is left to ask, and it goes again now.
        state = set_gate(state, Gate.OPEN, now, out)
    return state, out


def _on_tool_receipt(state: SessionState, event: ev.ToolReceipt, now: float) -> Result:
    if event.outcome not in RECEIPT_OUTCOMES:
        raise IllegalTransition(
            state, event, f"outcome {event.outcome!r} is not one of {RECEIPT_OUTCOMES}"
        )
    if _find(state, event.key) is None:
        raise IllegalTransition(state, event, f"intent {event.key} is not outstanding")
    return _settle(state, event.key, ledger.evidence_of(event.outcome, event.detail), now, [])


def _on_tool_receipt_conflicted(
    state: SessionState, event: ev.ToolReceiptConflicted, now: float
) -> Result:
    if _find(state, event.key) is None:
        raise IllegalTransition(state, event, f"intent {event.key} is not outstanding")
    out: Effects = [
        fx.NotifyAgent(
            "tool_receipt_conflict", f"{event.key} {event.offered} (stored {event.stored})"
        )
    ]
    why = f"conflicting receipts for {event.key} ({event.stored} on record, {event.offered} now)"
    return _settle(state, event.key, ledger.Evidence.CONFLICTING_RECEIPT, now, out, why)


def _settle(
    state: SessionState,
    key: str,
    evidence: ledger.Evidence,
    now: float,
    out: Effects,
    why: str = "",
) -> Result:
    """Apply seed 000's row for what reconciliation learned of ``key`` (session/ledger.py)."""
    row = ledger.RECONCILIATION[evidence]
    if row.ends is not None:
        # Never assume: the intent stays outstanding and automatic continuation stops.
        if row.receipt is Outcome.UNKNOWN:
            state = replace(
                state,
                outstanding=tuple(
                    replace(o, stage=IntentStage.UNKNOWN) if o.key == key else o
                    for o in state.outstanding
                ),
            )
        if state.terminal:
            return state, out
        reason = ending.unknown_outcomes(state)
        return ending.terminate(
            state,
            row.ends,
            f"{why}, with {reason}" if why else reason,
            row.stage,
            now,
            out,
            caller_present=_caller_present(state),
            say=row.say,
        ), out
    remaining = tuple(o for o in state.outstanding if o.key != key)
    state = replace(state, outstanding=remaining)
    outcome = row.receipt.value if row.receipt is not None else ""
    out.append(fx.NotifyAgent("tool_receipt", f"{key} {outcome}"))
    if state.gate is Gate.RECONCILING and not ledger.to_query(remaining):
        state = set_gate(state, Gate.OPEN, now, out)
    return state, out


def _on_caller_said(state: SessionState, event: ev.CallerSaid, now: float) -> Result:
    # A record for the log (what the caller said and what was made of it); it moves nothing.
    if event.decision not in SPEECH_DECISIONS:
        raise IllegalTransition(state, event, f"unknown speech decision {event.decision!r}")
    return state, []


def _on_approval_given(state: SessionState, event: ev.ApprovalGiven, now: float) -> Result:
    if event.approval_id in state.approvals:
        raise IllegalTransition(state, event, f"approval {event.approval_id} was already given")
    return replace(state, approvals=(*state.approvals, event.approval_id)), []


# --- time and people ----------------------------------------------------------------------------


def _on_deadline_fired(state: SessionState, event: ev.DeadlineFired, now: float) -> Result:
    deadline = state.deadlines.get(event.name)
    if deadline is None or deadline.generation != event.generation:
        return state, _ignored(event, f"no current deadline {event.name}/{event.generation}")
    if event.name == Timer.RETRY:
        return state, _ignored(event, "retries arrive as recovery_retry_due")
    out: Effects = []
    state = forget(state, (event.name,))
    caller_present = _caller_present(state)
    if event.name == Timer.RING:
        if state.signaling is not Signaling.OFFERED:
            return state, _ignored(event, "the leg is no longer ringing")
        return legs.on_ring_timeout(state, now, out), out
    if event.name == Timer.TRANSFER:
        if state.signaling is not Signaling.TRANSFERRING:
            return state, _ignored(event, "no transfer is in progress")
        return transfer.on_guard_fired(state, now, out), out
    if event.name == Timer.HONESTY:
        # Seed 004's ladder: past about two seconds of trouble, say so (once).
        if caller_present:
            out.append(fx.Say("reconnecting"))
        return state, out
    if event.name == Timer.RECOVERY:
        reason = ending.not_recovered(state)
        say = "outcome_unknown" if state.outstanding else "timed_out"
        if callback.may_drop(state):
            # Media lost for good: the caller may call back and continue (session.callback).
            return callback.drop(state, reason, say, now, out), out
        return ending.terminate(
            state,
            Terminal.TIMED_OUT,
            reason,
            EndingStage.RECOVERY,
            now,
            out,
            caller_present=caller_present,
            say=say,
        ), out
    if event.name == Timer.NO_INPUT:
        busy = state.recovery is not None or state.transfer is not None
        if busy or (state.turn is not None and not state.turn.committed):
            # Nothing to ask while the line is down or the caller is being transferred, or
            # while the caller is still talking.
            return arm_no_input(state, now, out), out
        # Seed 004's ladder: ask once, then end honestly.
        out.append(fx.Say("still_there"))
        return arm(state, Timer.NO_INPUT_FINAL, now + state.policy.no_input_grace_s, 0, out), out
    if event.name == Timer.NO_INPUT_FINAL:
        say = "outcome_unknown" if state.outstanding else "goodbye"
        return ending.terminate(
            state,
            Terminal.TIMED_OUT,
            ending.no_input(state),
            EndingStage.NO_INPUT,
            now,
            out,
            caller_present=caller_present,
            say=say,
        ), out
    if event.name == Timer.MAX_DURATION:
        say = "outcome_unknown" if state.outstanding else "timed_out"
        return ending.terminate(
            state,
            Terminal.TIMED_OUT,
            ending.max_duration(state),
            EndingStage.MAX_DURATION,
            now,
            out,
            caller_present=caller_present,
            say=say,
        ), out
    raise IllegalTransition(state, event, f"unknown deadline {event.name!r}")


def _on_recovery_retry_due(state: SessionState, event: ev.RecoveryRetryDue, now: float) -> Result:
    if _of_the_transfer(state, event.generation):
        return state, []
    if why := stale_generation(state, event.generation):
        return state, _ignored(event, why)
    recovery = state.recovery
    assert recovery is not None
    if event.attempt != recovery.attempt:
        return state, _ignored(
            event, f"attempt {event.attempt} is not the current {recovery.attempt}"
        )
    scheduled = state.deadlines.get(Timer.RETRY)
    if scheduled is None or scheduled.generation != recovery.generation:
        # The budget (retry_max_attempts, the deadline) scheduled no such retry.
        return state, _ignored(event, f"no retry is scheduled for attempt {event.attempt}")
    out: Effects = [
        fx.AttemptRecovery(recovery.generation, recovery.attempt, recovery.interruptions)
    ]
    recovery = replace(recovery, attempt=recovery.attempt + 1)
    state = replace(forget(state, (Timer.RETRY,)), recovery=recovery)
    return schedule_retry(state, recovery, recovery.attempt, now, out), out


def _of_the_transfer(state: SessionState, generation: int) -> bool:
    """Logs from when a transfer ran as a recovery hold its retries (and their probes' answers),
    logged as events that moved the session: they fold as steps that change nothing (but a
    probe that found the dialog gone, which ended the session then and does now), so the log's
    seq and the state's version stay one."""
    return state.transfer is not None and stale_transfer(state, generation) is None


def _on_recovery_probed(state: SessionState, event: ev.RecoveryProbed, now: float) -> Result:
    if not _of_the_transfer(state, event.generation):
        if why := stale_generation(state, event.generation):
            return state, _ignored(event, why)
        recovery = state.recovery
        assert recovery is not None
        if not 0 <= event.attempt < recovery.attempt:
            why = f"attempt {event.attempt} was not made ({recovery.attempt} so far)"
            raise IllegalTransition(state, event, why)
    if not dialog_gone(event.status, event.reason):
        # The dialog exists: keep waiting within the recovery's deadline (nothing changes, but
        # the answer is logged).
        return state, []
    # No BYE to a dialog that no longer exists, and nobody on it to tell.
    out: Effects = []
    reason = ending.dialog_gone(event.status, event.reason, state)
    return ending.terminate(
        state, Terminal.FAILED, reason, EndingStage.SIGNALING, now, out, caller_present=False
    ), out


def _on_operator_resolution(
    state: SessionState, event: ev.OperatorResolution, now: float
) -> Result:
    try:
        terminal = Terminal(event.terminal_state)
    except ValueError:
        raise IllegalTransition(
            state, event, f"{event.terminal_state!r} is no terminal state"
        ) from None
    if terminal.value not in state.acceptable_terminal_states():
        raise IllegalTransition(
            state, event, f"{ending.unknown_outcomes(state)} forbid ending {terminal.value}"
        )
    out: Effects = []
    return ending.terminate(
        state,
        terminal,
        ending.by_operator(event.note),
        EndingStage.OPERATOR,
        now,
        out,
        caller_present=_caller_present(state),
    ), out


def _on_owner_lost(state: SessionState, event: ev.OwnerLost, now: float) -> Result:
    if event.park and not callback.may_park(state):
        raise IllegalTransition(state, event, "this session cannot wait for a callback")
    out: Effects = []
    if state.turn is not None or state.response is not None:
        out.append(fx.StopGeneration())
    state = cut_playback(replace(state, turn=None), out)
    if state.recovery is not None:
        out.append(finished(state.recovery, RecoveryOutcome.FAILED, now))
    state = drop_all(state, out)
    state = end_phase(state, TransferOutcome.ENDED, now, out)
    state = replace(
        state,
        recovery=None,
        signaling=Signaling.GONE,
        media=Media.RELEASED if state.media is not Media.NONE else Media.NONE,
        agent_link=AgentLink.CLOSED,
    )
    if state.gate is not Gate.CLOSED:
        # Nothing is sent for a call that is gone: what never left is settled as never sent,
        # what may have reached a provider is asked about (session/ledger.py).
        state = set_gate(state, Gate.FROZEN, now, out)
        query, unsent = ledger.settle_plan(state.outstanding)
        out.extend(fx.SettleUnsent(key, ledger.NEVER_SENT) for key in unsent)
        if query:
            state = set_gate(state, Gate.RECONCILING, now, out)
            out.append(fx.Reconcile(query))
    if event.park:
        # Cut off, not gone by choice: the caller may call back and hear what became of the
        # write (its receipts settle meanwhile); nobody does, and it ends as the reaper would.
        state = callback.park(state, event.reason, EndingStage.PROCESS, now)
    return state, out


def _on_session_reaped(state: SessionState, event: ev.SessionReaped, now: float) -> Result:
    out: Effects = []
    reason = ending.reaped(event.reason, state)
    # The process is gone, so nobody is on the line to tell, and nothing is assumed.
    return ending.terminate(
        state, Terminal.FAILED, reason, EndingStage.PROCESS, now, out, caller_present=False
    ), out


# --- the table ----------------------------------------------------------------------------------

# Where an event may occur, by signaling state. A session row can exist without its first event (a
# crash between the two writes): only the offer, and the endings an operator or the reaper give,
# apply to it.
ANYWHERE = frozenset(Signaling)
AWAY = frozenset({Signaling.AWAY})  # transferred out, may come back (session.away)
DROPPED = frozenset({Signaling.DROPPED})  # media lost for good, may call back (session.callback)
PARKED = AWAY | DROPPED  # no dialog: only a return or an ending applies
# Offered and not parked: a session that is away or dropped has no dialog, so no dialog's events.
AFTER_OFFER = ANYWHERE - {Signaling.NONE} - PARKED
BEFORE_OFFER = frozenset({Signaling.NONE})
OFFERED = frozenset({Signaling.OFFERED})
DIALOG_UP = frozenset({Signaling.UP})  # established, nothing else pending
CALL_UP = frozenset({Signaling.UP, Signaling.REINVITE_PENDING, Signaling.TRANSFERRING})
TRANSFERRING = frozenset({Signaling.TRANSFERRING})
BRIDGED = frozenset({Signaling.BRIDGED})  # people talk through us: no turns, responses, tools
DIALOG_ALIVE = CALL_UP | BRIDGED  # someone is on the caller's line
REINVITE_PENDING = frozenset({Signaling.REINVITE_PENDING})
OWNED = OFFERED | DIALOG_ALIVE  # a process serves the call (OwnerLost leaves it GONE)
# Bridged, the people talk and the agent's part is over: its failure (or its link's) ends nothing.
AGENT_NEEDED = AFTER_OFFER - BRIDGED

E = TypeVar("E", bound=ev.Event)


@dataclass(frozen=True, slots=True)
class Refuse:
    """Outside its states the event raises :class:`IllegalTransition` with ``why``."""

    why: str


@dataclass(frozen=True, slots=True)
class Ignore:
    """Outside its states the event is stale: ignored, state unchanged, counted."""

    why: str


@dataclass(frozen=True, slots=True)
class Rule(Generic[E]):
    """``event`` may occur in the signaling states ``legal_in``, where ``handler`` takes it."""

    event: type[E]
    legal_in: frozenset[Signaling]
    handler: Callable[[SessionState, E, float], Result]
    elsewhere: Refuse | Ignore = Refuse("the call has not been offered")


_NOT_UP = Refuse("the call is not up")
_AGENT_DONE = Ignore("bridged: the agent's part is over")

# fmt: off
TRANSITIONS: Mapping[type[ev.Event], Rule[Any]] = {rule.event: rule for rule in (
    # signaling
    Rule(ev.CallOffered, BEFORE_OFFER, _on_call_offered, Refuse("the call was already offered")),
    Rule(ev.CallPlaced, BEFORE_OFFER, legs.on_call_placed,
         Refuse("the call was already offered")),
    Rule(ev.LegUnanswered, OFFERED, legs.on_leg_unanswered,
         Refuse("only a ringing outbound leg goes unanswered")),
    Rule(ev.CallAnswered, OFFERED, _on_call_answered,
         Refuse("only an offered call can be answered")),
    Rule(ev.ReinviteStarted, DIALOG_UP, _on_reinvite_started,
         Refuse("a re-INVITE needs an established dialog")),
    Rule(ev.ReinviteFinished, REINVITE_PENDING, _on_reinvite_finished,
         Ignore("no re-INVITE is pending")),
    Rule(ev.TransferStarted, DIALOG_UP, transfer.on_transfer_started,
         Refuse("a transfer needs an established dialog")),
    Rule(ev.TransferProgress, TRANSFERRING, transfer.on_transfer_progress,
         Refuse("no transfer is in progress")),
    Rule(ev.TransferFinished, TRANSFERRING, transfer.on_transfer_finished,
         Ignore("no transfer is in progress")),
    Rule(ev.TransferFellBack, TRANSFERRING, transfer.on_transfer_fell_back,
         Ignore("no transfer is in progress")),
    Rule(ev.ConsultAnswered, TRANSFERRING, transfer.on_consult_answered,
         Ignore("no transfer is in progress")),
    Rule(ev.BridgeUp, TRANSFERRING, bridge.on_bridge_up, Ignore("no transfer is in progress")),
    Rule(ev.BridgeEnded, BRIDGED, bridge.on_bridge_ended, Refuse("no bridge is up")),
    Rule(ev.CallRejoined, AWAY, away.on_call_rejoined,
         Refuse("only a session whose caller was transferred away is rejoined")),
    Rule(ev.AwayExpired, AWAY, away.on_away_expired, Ignore("the session is not away")),
    Rule(ev.CalledBack, DROPPED, callback.on_called_back,
         Refuse("only a session whose media was lost for good is called back")),
    Rule(ev.CallbackEnded, DROPPED, callback.on_callback_ended,
         Ignore("the session is not waiting for a callback")),
    Rule(ev.ResumeCodeIssued, CALL_UP, callback.on_resume_code_issued, _NOT_UP),
    Rule(ev.ResumeReused, AFTER_OFFER | PARKED, away.on_resume_reused),
    Rule(ev.CallerHangup, AFTER_OFFER, _on_caller_hangup),
    Rule(ev.ServerHangup, AFTER_OFFER, _on_server_hangup),
    Rule(ev.DialogFailed, AFTER_OFFER, _on_dialog_failed),
    Rule(ev.AgentFailed, AGENT_NEEDED, _on_agent_failed, _AGENT_DONE),
    Rule(ev.SessionExpired, AFTER_OFFER, _on_session_expired),
    # media and agent link
    Rule(ev.MediaLost, CALL_UP, _on_media_lost, _NOT_UP),
    Rule(ev.MediaRestored, AFTER_OFFER, _on_media_restored),
    Rule(ev.AgentLinkLost, CALL_UP, _on_agent_link_lost, _NOT_UP),
    Rule(ev.AgentLinkRestored, AFTER_OFFER, _on_agent_link_restored),
    Rule(ev.AgentLinkFailed, AGENT_NEEDED, _on_agent_link_failed, _AGENT_DONE),
    # conversation
    Rule(ev.TurnStarted, CALL_UP, _on_turn_started, _NOT_UP),
    Rule(ev.TurnCommitted, AFTER_OFFER, _on_turn_committed),
    Rule(ev.ResponseStarted, CALL_UP, _on_response_started, _NOT_UP),
    Rule(ev.ResponseInterrupted, AFTER_OFFER, _on_response_interrupted),
    Rule(ev.ResponseFinished, AFTER_OFFER, _on_response_finished),
    Rule(ev.BargeInJudged, AFTER_OFFER, _on_barge_in_judged),
    Rule(ev.PromptCut, AFTER_OFFER, on_prompt_cut),
    # side effects: receipts still settle after the owner is lost (reconciliation)
    Rule(ev.ToolIntent, CALL_UP, _on_tool_intent, _NOT_UP),
    Rule(ev.ToolRequestSent, AFTER_OFFER, _on_tool_request_sent),
    Rule(ev.ToolRequestWithheld, AFTER_OFFER, _on_tool_request_withheld),
    # ... and while a session whose process died waits for its caller to call back
    Rule(ev.ToolReceipt, AFTER_OFFER | DROPPED, _on_tool_receipt),
    Rule(ev.ToolReceiptConflicted, AFTER_OFFER | DROPPED, _on_tool_receipt_conflicted),
    Rule(ev.ApprovalGiven, CALL_UP, _on_approval_given, _NOT_UP),
    Rule(ev.CallerSaid, CALL_UP, _on_caller_said, Ignore("the call is not up")),
    # time and people
    Rule(ev.DeadlineFired, AFTER_OFFER, _on_deadline_fired),
    Rule(ev.RecoveryRetryDue, AFTER_OFFER, _on_recovery_retry_due),
    # only a call that is up has a recovery, so a probe's answer anywhere else is late
    Rule(ev.RecoveryProbed, CALL_UP, _on_recovery_probed, Ignore("no recovery is running")),
    Rule(ev.OperatorResolution, ANYWHERE, _on_operator_resolution),
    Rule(ev.OwnerLost, OWNED, _on_owner_lost, Refuse("the owner is already known to be lost")),
    Rule(ev.SessionReaped, ANYWHERE, _on_session_reaped),
)}
# fmt: on

_NOT_OFFERED = "the call has not been offered"
_AWAY = "the caller was transferred away: only a rejoin or an ending applies"
_DROPPED = "the call dropped: only a callback or an ending applies"


def step(state: SessionState, event: ev.Event, now: float) -> Result:
    """Fold one event into ``state``. Pure: the same inputs always give the same outputs.

    Raises :class:`SessionTerminated` after the end, :class:`IllegalTransition` (or its
    :class:`GateClosed`) for an event its rule or handler refuses; either way nothing changed.
    Returns the new state with ``version`` one up, except for a stale event (state unchanged and a
    single :class:`~session.effects.StaleEventIgnored`): the runtime logs exactly the events that
    moved ``version``.
    """
    if state.ended is not None:
        raise SessionTerminated(state, event, f"the session ended {state.ended.terminal_state}")
    rule = TRANSITIONS.get(type(event))
    if rule is None:
        raise IllegalTransition(state, event, "no transition handles this event")
    if state.signaling not in rule.legal_in:
        if state.signaling is Signaling.NONE:
            raise IllegalTransition(state, event, _NOT_OFFERED)
        if state.signaling is Signaling.AWAY and isinstance(rule.elsewhere, Refuse):
            raise IllegalTransition(state, event, _AWAY)
        if state.signaling is Signaling.DROPPED and isinstance(rule.elsewhere, Refuse):
            raise IllegalTransition(state, event, _DROPPED)
        if isinstance(rule.elsewhere, Ignore):
            return state, _ignored(event, rule.elsewhere.why)
        raise IllegalTransition(state, event, rule.elsewhere.why)
    new, out = rule.handler(state, event, now)
    if not (len(out) == 1 and isinstance(out[0], fx.StaleEventIgnored)):
        new = replace(new, version=state.version + 1)
    return new, out


def replay(state: SessionState, events: list[tuple[ev.Event, float]]) -> SessionState:
    """Fold logged events (with the times they were handled) onto a checkpointed state."""
    for event, at in events:
        state, _ = step(state, event, at)
    return state


__all__ = [
    "RETRY",
    "TRANSITIONS",
    "GateClosed",
    "IllegalTransition",
    "Rule",
    "SessionTerminated",
    "replay",
    "retry_delay",
    "step",
]
