"""The session state machine: ``handle(event, now) -> effects``. No I/O; time only via ``now``.

Every transition is in this module, one ``_on_<event>`` function per event type, dispatched from
one table (:data:`_HANDLERS`). A function either returns the new state and its effects, or raises
:class:`IllegalTransition` (naming the state and the event) and changes nothing. Stale events (an
older recovery generation, a finished response's chunk) are not errors: they are ignored, state
unchanged, with a :class:`~session.effects.StaleEventIgnored` effect the runtime counts.

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

import random
from collections.abc import Callable
from dataclasses import replace

from session import effects as fx
from session import events as ev
from session.state import (
    AgentLink,
    Deadline,
    Ending,
    Gate,
    Media,
    Outstanding,
    Policy,
    Recovery,
    Response,
    SessionState,
    Signaling,
    Terminal,
    Turn,
)

Effects = list[fx.Effect]
Result = tuple[SessionState, Effects]


class IllegalTransition(Exception):
    """``event`` cannot happen in ``state``; nothing changed. The caller decides what to answer."""

    def __init__(self, state: SessionState, event: ev.Event, why: str) -> None:
        self.state_status = state.status()
        self.event_type = event.type
        self.why = why
        super().__init__(f"{event.type} is illegal in state [{self.state_status}]: {why}")


class GateClosed(IllegalTransition):
    """New work (a turn, a response, a write) while the side-effect gate is not open."""


class SessionTerminated(IllegalTransition):
    """Anything after the session reached its terminal state."""


# --- helpers ------------------------------------------------------------------------------------

_ACTIVE = (Signaling.UP, Signaling.REINVITE_PENDING, Signaling.TRANSFERRING)
HONESTY = "honesty"
RECOVERY = "recovery"
RETRY = "recovery_retry"
MAX_DURATION = "max_duration"
NO_INPUT = "no_input"
NO_INPUT_FINAL = "no_input_final"


def retry_delay(session_id: str, generation: int, attempt: int, policy: Policy) -> float:
    """Exponential backoff with full jitter, seeded so replays and tests are deterministic."""
    ceiling = min(policy.retry_cap_s, policy.retry_base_s * (2**attempt))
    rng = random.Random(f"{session_id}/{generation}/{attempt}")
    floor = min(policy.retry_base_s / 2, ceiling)
    return float(floor + rng.random() * (ceiling - floor))


def _stale(event: ev.Event, why: str) -> Effects:
    return [fx.StaleEventIgnored(event.type, why)]


def _set_gate(state: SessionState, gate: Gate, now: float, out: Effects) -> SessionState:
    if state.gate is gate:
        return state
    frozen_s = 0.0
    if state.gate in (Gate.FROZEN, Gate.RECONCILING) and state.gate_since is not None:
        frozen_s = now - state.gate_since
    if gate is Gate.OPEN or gate is Gate.CLOSED:
        since = None
    elif state.gate in (Gate.FROZEN, Gate.RECONCILING):
        since = state.gate_since  # frozen time runs on through reconciliation
        frozen_s = 0.0
    else:
        since = now
    out.append(fx.GateChanged(state.gate.value, gate.value, round(frozen_s, 6)))
    return replace(state, gate=gate, gate_since=since)


def _cut_playback(state: SessionState, out: Effects) -> SessionState:
    """Cancel the active response and bump the playback generation, in one step."""
    if state.response is not None:
        out.append(fx.CancelResponse(state.response.response_id))
        out.append(fx.StopGeneration())
    generation = state.playback_generation + 1
    out.append(fx.ClearPlayout(generation))
    return replace(state, response=None, playback_generation=generation)


def _interrupt(state: SessionState, kind: str, now: float, out: Effects) -> SessionState:
    """Any interruption: freeze, cut playback, and start (or join) the one recovery."""
    state = _cut_playback(state, out)
    if state.gate is not Gate.CLOSED:
        state = _set_gate(state, Gate.FROZEN, now, out)
    in_flight = tuple(o.key for o in state.outstanding if o.stage == "sent")
    if in_flight:
        out.append(fx.CancelToolCalls(in_flight))
    recovery = state.recovery
    if recovery is not None:
        if kind not in recovery.interruptions:
            recovery = replace(recovery, interruptions=(*recovery.interruptions, kind))
        return replace(state, recovery=recovery)
    generation = state.recovery_generation + 1
    policy = state.policy
    recovery = Recovery(generation, (kind,), now, now + policy.recovery_timeout_s)
    deadlines = dict(state.deadlines)
    deadlines[RECOVERY] = Deadline(recovery.deadline, generation)
    deadlines[HONESTY] = Deadline(now + policy.honesty_after_s, generation)
    first_retry = now + retry_delay(state.session_id, generation, 0, policy)
    out.append(fx.StartRecovery(generation, kind, recovery.deadline))
    out.append(fx.NotifyAgent("interrupted", kind))
    out.append(fx.ScheduleTimer(RECOVERY, recovery.deadline, generation))
    out.append(fx.ScheduleTimer(HONESTY, deadlines[HONESTY].due, generation))
    if policy.retry_max_attempts > 0 and first_retry < recovery.deadline:
        deadlines[RETRY] = Deadline(first_retry, generation)
        out.append(fx.ScheduleTimer(RETRY, first_retry, generation, attempt=0))
    return replace(state, recovery=recovery, recovery_generation=generation, deadlines=deadlines)


def _drop_deadlines(state: SessionState, names: tuple[str, ...], out: Effects) -> SessionState:
    present = [n for n in names if n in state.deadlines]
    if not present:
        return state
    for name in present:
        out.append(fx.CancelTimer(name))
    return replace(state, deadlines={k: v for k, v in state.deadlines.items() if k not in names})


def _recovered(state: SessionState, kind: str, now: float, out: Effects) -> SessionState:
    """One interruption is over; when none is left, hand the gate to reconciliation."""
    recovery = state.recovery
    assert recovery is not None
    left = tuple(k for k in recovery.interruptions if k != kind)
    if left:
        return replace(state, recovery=replace(recovery, interruptions=left))
    out.append(
        fx.RecoveryFinished(
            recovery.generation,
            recovery.interruptions,
            "recovered",
            round(now - recovery.started_at, 6),
        )
    )
    state = _drop_deadlines(replace(state, recovery=None), (RECOVERY, HONESTY, RETRY), out)
    out.append(fx.NotifyAgent("resumed", "+".join(recovery.interruptions)))
    return _reconcile(state, now, out)


def _reconcile(state: SessionState, now: float, out: Effects) -> SessionState:
    if state.gate is Gate.CLOSED:
        return state
    if not state.outstanding:
        # Seed 000: no outstanding calls -> open the gate (the old response stays cancelled).
        return _set_gate(state, Gate.OPEN, now, out)
    state = _set_gate(state, Gate.RECONCILING, now, out)
    out.append(fx.Reconcile(state.outstanding_keys()))
    return state


def _terminate(
    state: SessionState,
    terminal: Terminal,
    reason: str,
    stage: str | None,
    now: float,
    out: Effects,
    *,
    caller_present: bool,
    say: str | None = None,
) -> SessionState:
    """End the session with the effects seed 000 lists for a timeout, in this order."""
    if state.turn is not None and state.response is None:
        out.append(fx.StopGeneration())  # with a response, _cut_playback says it
    in_flight = tuple(o.key for o in state.outstanding if o.stage == "sent")
    if in_flight:
        out.append(fx.CancelToolCalls(in_flight))
    state = _cut_playback(replace(state, turn=None), out)
    if state.outstanding:
        out.append(fx.PersistOutstanding(state.outstanding_keys()))
    if state.recovery is not None:
        recovery = state.recovery
        outcome = {Terminal.TIMED_OUT: "timed_out", Terminal.FAILED: "failed"}.get(
            terminal, "canceled"
        )
        out.append(
            fx.RecoveryFinished(
                recovery.generation,
                recovery.interruptions,
                outcome,
                round(now - recovery.started_at, 6),
            )
        )
    if caller_present and say is not None:
        out.append(fx.Say(say))
    for name in sorted(state.deadlines):
        out.append(fx.CancelTimer(name))
    state = _set_gate(state, Gate.CLOSED, now, out)
    out.append(fx.ReleaseMedia())
    if caller_present:
        out.append(fx.HangUp(reason))
    out.append(fx.Finished(terminal.value, reason, stage))
    return replace(
        state,
        recovery=None,
        deadlines={},
        media=Media.RELEASED if state.media is not Media.NONE else Media.NONE,
        agent_link=AgentLink.CLOSED,
        signaling=Signaling.GONE,
        ended=Ending(terminal.value, reason, stage, now),
    )


def _unknown_outcomes(state: SessionState) -> str:
    n = len(state.outstanding)
    return f"{n} tool call{'s' if n != 1 else ''} with unknown outcome"


# --- transitions --------------------------------------------------------------------------------


def _on_call_offered(state: SessionState, event: ev.CallOffered, now: float) -> Result:
    if state.signaling is not Signaling.NONE:
        raise IllegalTransition(state, event, "the call was already offered")
    policy = Policy.from_dict(event.policy)
    return replace(state, signaling=Signaling.OFFERED, policy=policy), []


def _on_call_answered(state: SessionState, event: ev.CallAnswered, now: float) -> Result:
    if state.signaling is not Signaling.OFFERED:
        raise IllegalTransition(state, event, "only an offered call can be answered")
    out: Effects = []
    deadlines = dict(state.deadlines)
    if state.policy.max_duration_s > 0:
        deadlines[MAX_DURATION] = Deadline(now + state.policy.max_duration_s, 0)
        out.append(fx.ScheduleTimer(MAX_DURATION, deadlines[MAX_DURATION].due, 0))
    new = replace(
        state,
        signaling=Signaling.UP,
        media=Media.FLOWING,
        media_since=now,
        answered_at=now,
        deadlines=deadlines,
    )
    return _arm_no_input(new, now, out), out


def _arm_no_input(state: SessionState, now: float, out: Effects) -> SessionState:
    """(Re)start the no-input deadline: the caller did something, count from now."""
    if state.policy.no_input_s <= 0:
        return state
    deadlines = {k: v for k, v in state.deadlines.items() if k != NO_INPUT_FINAL}
    if NO_INPUT_FINAL in state.deadlines:
        out.append(fx.CancelTimer(NO_INPUT_FINAL))
    deadlines[NO_INPUT] = Deadline(now + state.policy.no_input_s, 0)
    out.append(fx.ScheduleTimer(NO_INPUT, deadlines[NO_INPUT].due, 0))
    return replace(state, deadlines=deadlines)


def _require_call_up(state: SessionState, event: ev.Event) -> None:
    if state.signaling not in _ACTIVE:
        raise IllegalTransition(state, event, "the call is not up")


def _check_generation(state: SessionState, event: ev.Event, generation: int) -> str | None:
    recovery = state.recovery
    if recovery is None:
        return "no recovery is running"
    if generation != recovery.generation:
        return f"generation {generation} is not the current {recovery.generation}"
    return None


def _on_media_lost(state: SessionState, event: ev.MediaLost, now: float) -> Result:
    _require_call_up(state, event)
    if state.media is not Media.FLOWING:
        raise IllegalTransition(state, event, "media is not flowing")
    out: Effects = []
    state = replace(state, media=Media.INTERRUPTED, media_since=now)
    return _interrupt(state, "media", now, out), out


def _on_media_restored(state: SessionState, event: ev.MediaRestored, now: float) -> Result:
    if state.media is not Media.INTERRUPTED:
        return state, _stale(event, "media is not interrupted")
    if why := _check_generation(state, event, event.generation):
        return state, _stale(event, why)
    out: Effects = []
    state = replace(state, media=Media.FLOWING, media_since=now)
    return _recovered(state, "media", now, out), out


def _on_reinvite_started(state: SessionState, event: ev.ReinviteStarted, now: float) -> Result:
    if state.signaling is not Signaling.UP:
        raise IllegalTransition(state, event, "a re-INVITE needs an established dialog")
    out: Effects = []
    state = replace(state, signaling=Signaling.REINVITE_PENDING)
    return _interrupt(state, "reinvite", now, out), out


def _on_reinvite_finished(state: SessionState, event: ev.ReinviteFinished, now: float) -> Result:
    if state.signaling is not Signaling.REINVITE_PENDING:
        return state, _stale(event, "no re-INVITE is pending")
    if why := _check_generation(state, event, event.generation):
        return state, _stale(event, why)
    # RFC 6141: a failed re-INVITE leaves the previous session (and media) in place.
    out: Effects = []
    state = replace(state, signaling=Signaling.UP)
    return _recovered(state, "reinvite", now, out), out


def _on_transfer_started(state: SessionState, event: ev.TransferStarted, now: float) -> Result:
    if state.signaling is not Signaling.UP:
        raise IllegalTransition(state, event, "a transfer needs an established dialog")
    out: Effects = []
    state = replace(state, signaling=Signaling.TRANSFERRING)
    return _interrupt(state, "transfer", now, out), out


def _on_transfer_progress(state: SessionState, event: ev.TransferProgress, now: float) -> Result:
    if state.signaling is not Signaling.TRANSFERRING:
        raise IllegalTransition(state, event, "no transfer is in progress")
    return state, []


def _on_transfer_finished(state: SessionState, event: ev.TransferFinished, now: float) -> Result:
    if state.signaling is not Signaling.TRANSFERRING:
        return state, _stale(event, "no transfer is in progress")
    if why := _check_generation(state, event, event.generation):
        return state, _stale(event, why)
    out: Effects = []
    if event.ok:
        # The caller is with the target now: this session's part ends, honestly.
        if state.outstanding:
            return (
                _terminate(
                    state,
                    Terminal.NEEDS_HUMAN,
                    f"transferred with {_unknown_outcomes(state)}",
                    "transfer",
                    now,
                    out,
                    caller_present=False,
                ),
                out,
            )
        return (
            _terminate(
                state, Terminal.COMPLETED, "transferred", None, now, out, caller_present=False
            ),
            out,
        )
    state = replace(state, signaling=Signaling.UP)
    return _recovered(state, "transfer", now, out), out


def _on_agent_link_lost(state: SessionState, event: ev.AgentLinkLost, now: float) -> Result:
    _require_call_up(state, event)
    if state.agent_link is not AgentLink.CONNECTED:
        raise IllegalTransition(state, event, "the agent link is not connected")
    out: Effects = []
    state = replace(state, agent_link=AgentLink.LOST)
    return _interrupt(state, "agent_link", now, out), out


def _on_agent_link_restored(state: SessionState, event: ev.AgentLinkRestored, now: float) -> Result:
    if state.agent_link is not AgentLink.LOST:
        return state, _stale(event, "the agent link is not lost")
    if why := _check_generation(state, event, event.generation):
        return state, _stale(event, why)
    out: Effects = []
    state = replace(state, agent_link=AgentLink.CONNECTED)
    return _recovered(state, "agent_link", now, out), out


def _require_gate_open(state: SessionState, event: ev.Event, what: str) -> None:
    if state.gate is not Gate.OPEN:
        raise GateClosed(state, event, f"no new {what} while the gate is {state.gate.value}")


def _on_turn_started(state: SessionState, event: ev.TurnStarted, now: float) -> Result:
    _require_call_up(state, event)
    _require_gate_open(state, event, "turn")
    if state.turn is not None and not state.turn.committed:
        raise IllegalTransition(state, event, f"turn {state.turn.turn_id} is still open")
    out: Effects = []
    return _arm_no_input(replace(state, turn=Turn(event.turn_id)), now, out), out


def _on_turn_committed(state: SessionState, event: ev.TurnCommitted, now: float) -> Result:
    if state.turn is None or state.turn.turn_id != event.turn_id or state.turn.committed:
        raise IllegalTransition(state, event, f"turn {event.turn_id} is not open")
    out: Effects = []
    return _arm_no_input(replace(state, turn=replace(state.turn, committed=True)), now, out), out


def _on_response_started(state: SessionState, event: ev.ResponseStarted, now: float) -> Result:
    _require_call_up(state, event)
    _require_gate_open(state, event, "response")
    if state.response is not None:
        raise IllegalTransition(state, event, f"response {state.response.response_id} is active")
    response = Response(event.response_id, event.turn_id, state.playback_generation)
    out: Effects = [fx.BindResponse(event.response_id, state.playback_generation)]
    return replace(state, response=response), out


def _on_response_chunk(state: SessionState, event: ev.ResponseChunk, now: float) -> Result:
    if state.response is None or state.response.response_id != event.response_id:
        return state, _stale(event, f"response {event.response_id} is not the active one")
    return state, []


def _end_response(state: SessionState, event: ev.Event, response_id: str) -> SessionState:
    if state.response is None or state.response.response_id != response_id:
        raise IllegalTransition(state, event, f"response {response_id} is not active")
    turn = state.turn
    if turn is not None and turn.turn_id == state.response.turn_id:
        turn = None
    return replace(state, response=None, turn=turn)


def _on_response_interrupted(
    state: SessionState, event: ev.ResponseInterrupted, now: float
) -> Result:
    if state.response is None or state.response.response_id != event.response_id:
        return state, _stale(event, f"response {event.response_id} is not the active one")
    # Barge-in: the same generation bump and clear as every other interruption.
    out: Effects = []
    state = _end_response(state, event, event.response_id)
    generation = state.playback_generation + 1
    out.append(fx.ClearPlayout(generation))
    out.append(
        fx.NotifyAgent("response_interrupted", f"{event.response_id} heard_ms={event.heard_ms}")
    )
    return replace(state, playback_generation=generation), out


def _on_response_finished(state: SessionState, event: ev.ResponseFinished, now: float) -> Result:
    if state.response is None or state.response.response_id != event.response_id:
        return state, _stale(event, f"response {event.response_id} is not the active one")
    return _end_response(state, event, event.response_id), []


def _find(state: SessionState, key: str) -> Outstanding | None:
    return next((o for o in state.outstanding if o.key == key), None)


def _on_tool_intent(state: SessionState, event: ev.ToolIntent, now: float) -> Result:
    _require_call_up(state, event)
    if event.kind not in ("read", "write"):
        raise IllegalTransition(state, event, f"tool kind {event.kind!r} is neither read nor write")
    if event.kind == "write":
        _require_gate_open(state, event, "write tool call")
    elif state.gate is Gate.CLOSED:
        raise GateClosed(state, event, "the gate is closed")
    if _find(state, event.key) is not None:
        raise IllegalTransition(state, event, f"intent {event.key} is already outstanding")
    intent = Outstanding(
        event.key,
        event.tool,
        event.kind,
        event.digest,
        event.turn_id,
        arguments=dict(event.arguments),
    )
    out: Effects = [fx.SendToolRequest(event.key)]
    return replace(state, outstanding=(*state.outstanding, intent)), out


def _on_tool_request_sent(state: SessionState, event: ev.ToolRequestSent, now: float) -> Result:
    intent = _find(state, event.key)
    if intent is None or intent.stage != "intended":
        raise IllegalTransition(state, event, f"intent {event.key} is not waiting to be sent")
    if state.gate is not Gate.OPEN and intent.kind == "write":
        raise GateClosed(state, event, f"no write request while the gate is {state.gate.value}")
    updated = tuple(
        replace(o, stage="sent") if o.key == event.key else o for o in state.outstanding
    )
    return replace(state, outstanding=updated), []


_OUTCOMES = ("committed", "failed", "not_started", "unknown")


def _on_tool_receipt(state: SessionState, event: ev.ToolReceipt, now: float) -> Result:
    if event.outcome not in _OUTCOMES:
        raise IllegalTransition(
            state, event, f"outcome {event.outcome!r} is not one of {_OUTCOMES}"
        )
    intent = _find(state, event.key)
    if intent is None:
        raise IllegalTransition(state, event, f"intent {event.key} is not outstanding")
    out: Effects = []
    if event.outcome == "unknown":
        # Never assume: an unknown outcome keeps the intent and stops automatic continuation.
        updated = tuple(
            replace(o, stage="unknown") if o.key == event.key else o for o in state.outstanding
        )
        state = replace(state, outstanding=updated)
        return (
            _terminate(
                state,
                Terminal.NEEDS_HUMAN,
                _unknown_outcomes(state),
                "reconciliation",
                now,
                out,
                caller_present=state.signaling in _ACTIVE,
                say="outcome_unknown",
            ),
            out,
        )
    remaining = tuple(o for o in state.outstanding if o.key != event.key)
    state = replace(state, outstanding=remaining)
    out.append(fx.NotifyAgent("tool_receipt", f"{event.key} {event.outcome}"))
    if state.gate is Gate.RECONCILING and not remaining:
        state = _set_gate(state, Gate.OPEN, now, out)
    return state, out


def _on_approval_given(state: SessionState, event: ev.ApprovalGiven, now: float) -> Result:
    _require_call_up(state, event)
    if event.approval_id in state.approvals:
        raise IllegalTransition(state, event, f"approval {event.approval_id} was already given")
    return replace(state, approvals=(*state.approvals, event.approval_id)), []


def _on_caller_hangup(state: SessionState, event: ev.CallerHangup, now: float) -> Result:
    out: Effects = []
    # Seed 001: leaving invalidates recovery at once (RecoveryFinished: canceled, timers cancelled).
    if state.signaling is Signaling.OFFERED:
        terminal, reason, stage = Terminal.CANCELED, "caller hung up before answer", None
    elif state.outstanding:
        terminal, reason, stage = (
            Terminal.NEEDS_HUMAN,
            f"caller hung up with {_unknown_outcomes(state)}",
            "hangup",
        )
    elif state.recovery is not None or state.gate is not Gate.OPEN:
        terminal, reason, stage = Terminal.CANCELED, "caller hung up during recovery", None
    else:
        terminal, reason, stage = Terminal.COMPLETED, "caller hung up", None
    return _terminate(state, terminal, reason, stage, now, out, caller_present=False), out


def _on_dialog_failed(state: SessionState, event: ev.DialogFailed, now: float) -> Result:
    out: Effects = []
    reason = f"dialog failed: {event.status} {event.reason}".strip()
    if state.outstanding:
        reason = f"{reason}, with {_unknown_outcomes(state)}"
    return _terminate(
        state, Terminal.FAILED, reason, "signaling", now, out, caller_present=False
    ), out


def _on_session_expired(state: SessionState, event: ev.SessionExpired, now: float) -> Result:
    out: Effects = []
    reason = f"session timer expired: {event.reason}".rstrip(": ")
    if state.outstanding:
        reason = f"{reason}, with {_unknown_outcomes(state)}"
    # PJSIP has already sent the BYE: nobody is on the line to tell.
    return (
        _terminate(
            state, Terminal.TIMED_OUT, reason, "session_timer", now, out, caller_present=False
        ),
        out,
    )


def _on_server_hangup(state: SessionState, event: ev.ServerHangup, now: float) -> Result:
    if event.outcome not in ("completed", "canceled"):
        raise IllegalTransition(state, event, "a server hang-up ends completed or canceled")
    out: Effects = []
    terminal, reason, stage = Terminal(event.outcome), event.reason, None
    if state.outstanding:
        terminal, reason, stage = (
            Terminal.NEEDS_HUMAN,
            f"{event.reason}, with {_unknown_outcomes(state)}",
            "hangup",
        )
    caller_present = state.signaling is not Signaling.GONE
    return _terminate(state, terminal, reason, stage, now, out, caller_present=caller_present), out


def _on_deadline_fired(state: SessionState, event: ev.DeadlineFired, now: float) -> Result:
    deadline = state.deadlines.get(event.name)
    if deadline is None or deadline.generation != event.generation:
        return state, _stale(event, f"no current deadline {event.name}/{event.generation}")
    if event.name == RETRY:
        return state, _stale(event, "retries arrive as recovery_retry_due")
    out: Effects = []
    state = replace(state, deadlines={k: v for k, v in state.deadlines.items() if k != event.name})
    caller_present = state.signaling in _ACTIVE
    if event.name == HONESTY:
        # Seed 004's ladder: past about two seconds of trouble, say so (once).
        if caller_present:
            out.append(fx.Say("reconnecting"))
        return state, out
    if event.name == RECOVERY:
        recovery = state.recovery
        assert recovery is not None
        reason = (
            f"{'+'.join(recovery.interruptions)} not recovered within "
            f"{state.policy.recovery_timeout_s:g} s"
        )
        say = "outcome_unknown" if state.outstanding else "timed_out"
        return (
            _terminate(
                state,
                Terminal.TIMED_OUT,
                reason,
                "recovery",
                now,
                out,
                caller_present=caller_present,
                say=say,
            ),
            out,
        )
    if event.name == NO_INPUT:
        if state.recovery is not None or (state.turn is not None and not state.turn.committed):
            # Nothing to answer while the line is down, or while the caller is still talking.
            return _arm_no_input(state, now, out), out
        # Seed 004's ladder: ask once, then end honestly.
        grace = Deadline(now + state.policy.no_input_grace_s, 0)
        out.append(fx.Say("still_there"))
        out.append(fx.ScheduleTimer(NO_INPUT_FINAL, grace.due, 0))
        return replace(state, deadlines={**state.deadlines, NO_INPUT_FINAL: grace}), out
    if event.name == NO_INPUT_FINAL:
        reason = (
            f"no input from the caller for "
            f"{state.policy.no_input_s + state.policy.no_input_grace_s:g} s"
        )
        say = "outcome_unknown" if state.outstanding else "goodbye"
        return (
            _terminate(
                state,
                Terminal.TIMED_OUT,
                reason,
                "no_input",
                now,
                out,
                caller_present=caller_present,
                say=say,
            ),
            out,
        )
    if event.name == MAX_DURATION:
        reason = f"call reached its maximum duration of {state.policy.max_duration_s:g} s"
        say = "outcome_unknown" if state.outstanding else "timed_out"
        return (
            _terminate(
                state,
                Terminal.TIMED_OUT,
                reason,
                "max_duration",
                now,
                out,
                caller_present=caller_present,
                say=say,
            ),
            out,
        )
    raise IllegalTransition(state, event, f"unknown deadline {event.name!r}")


def _on_recovery_retry_due(state: SessionState, event: ev.RecoveryRetryDue, now: float) -> Result:
    if why := _check_generation(state, event, event.generation):
        return state, _stale(event, why)
    recovery = state.recovery
    assert recovery is not None
    if event.attempt != recovery.attempt:
        return state, _stale(
            event, f"attempt {event.attempt} is not the current {recovery.attempt}"
        )
    scheduled = state.deadlines.get(RETRY)
    if scheduled is None or scheduled.generation != recovery.generation:
        # The budget (retry_max_attempts, the deadline) scheduled no such retry.
        return state, _stale(event, f"no retry is scheduled for attempt {event.attempt}")
    out: Effects = [
        fx.AttemptRecovery(recovery.generation, recovery.attempt, recovery.interruptions)
    ]
    attempt = recovery.attempt + 1
    deadlines = {k: v for k, v in state.deadlines.items() if k != RETRY}
    policy = state.policy
    due = now + retry_delay(state.session_id, recovery.generation, attempt, policy)
    if attempt < policy.retry_max_attempts and due < recovery.deadline:
        deadlines[RETRY] = Deadline(due, recovery.generation)
        out.append(fx.ScheduleTimer(RETRY, due, recovery.generation, attempt=attempt))
    return replace(state, recovery=replace(recovery, attempt=attempt), deadlines=deadlines), out


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
            state, event, f"{_unknown_outcomes(state)} forbid ending {terminal.value}"
        )
    out: Effects = []
    caller_present = state.signaling in _ACTIVE
    reason = f"resolved by an operator: {event.note}" if event.note else "resolved by an operator"
    return (
        _terminate(state, terminal, reason, "operator", now, out, caller_present=caller_present),
        out,
    )


def _on_owner_lost(state: SessionState, event: ev.OwnerLost, now: float) -> Result:
    if state.agent_link is AgentLink.CLOSED and state.signaling is Signaling.GONE:
        raise IllegalTransition(state, event, "the owner is already known to be lost")
    out: Effects = []
    if state.turn is not None or state.response is not None:
        out.append(fx.StopGeneration())
    state = _cut_playback(replace(state, turn=None), out)
    if state.recovery is not None:
        recovery = state.recovery
        out.append(
            fx.RecoveryFinished(
                recovery.generation,
                recovery.interruptions,
                "failed",
                round(now - recovery.started_at, 6),
            )
        )
    for name in sorted(state.deadlines):
        out.append(fx.CancelTimer(name))
    state = replace(
        state,
        recovery=None,
        deadlines={},
        signaling=Signaling.GONE,
        media=Media.RELEASED if state.media is not Media.NONE else Media.NONE,
        agent_link=AgentLink.CLOSED,
    )
    if state.gate is not Gate.CLOSED:
        state = _set_gate(state, Gate.FROZEN, now, out)
        state = _reconcile(state, now, out)
    return state, out


def _on_session_reaped(state: SessionState, event: ev.SessionReaped, now: float) -> Result:
    out: Effects = []
    known = [f"last known: {state.status()}"]
    if state.outstanding:
        known.append(f"{_unknown_outcomes(state)} left for reconciliation")
    reason = f"{event.reason}; {'; '.join(known)}"
    # The process is gone, so nobody is on the line to tell, and nothing is assumed.
    return _terminate(
        state, Terminal.FAILED, reason, "process", now, out, caller_present=False
    ), out


_Handler = Callable[[SessionState, ev.Event, float], Result]

_HANDLERS: dict[type[ev.Event], _Handler] = {
    ev.CallOffered: _on_call_offered,  # type: ignore[dict-item]
    ev.CallAnswered: _on_call_answered,  # type: ignore[dict-item]
    ev.MediaLost: _on_media_lost,  # type: ignore[dict-item]
    ev.MediaRestored: _on_media_restored,  # type: ignore[dict-item]
    ev.ReinviteStarted: _on_reinvite_started,  # type: ignore[dict-item]
    ev.ReinviteFinished: _on_reinvite_finished,  # type: ignore[dict-item]
    ev.TransferStarted: _on_transfer_started,  # type: ignore[dict-item]
    ev.TransferProgress: _on_transfer_progress,  # type: ignore[dict-item]
    ev.TransferFinished: _on_transfer_finished,  # type: ignore[dict-item]
    ev.AgentLinkLost: _on_agent_link_lost,  # type: ignore[dict-item]
    ev.AgentLinkRestored: _on_agent_link_restored,  # type: ignore[dict-item]
    ev.TurnStarted: _on_turn_started,  # type: ignore[dict-item]
    ev.TurnCommitted: _on_turn_committed,  # type: ignore[dict-item]
    ev.ResponseStarted: _on_response_started,  # type: ignore[dict-item]
    ev.ResponseChunk: _on_response_chunk,  # type: ignore[dict-item]
    ev.ResponseInterrupted: _on_response_interrupted,  # type: ignore[dict-item]
    ev.ResponseFinished: _on_response_finished,  # type: ignore[dict-item]
    ev.ToolIntent: _on_tool_intent,  # type: ignore[dict-item]
    ev.ToolRequestSent: _on_tool_request_sent,  # type: ignore[dict-item]
    ev.ToolReceipt: _on_tool_receipt,  # type: ignore[dict-item]
    ev.ApprovalGiven: _on_approval_given,  # type: ignore[dict-item]
    ev.CallerHangup: _on_caller_hangup,  # type: ignore[dict-item]
    ev.ServerHangup: _on_server_hangup,  # type: ignore[dict-item]
    ev.DialogFailed: _on_dialog_failed,  # type: ignore[dict-item]
    ev.SessionExpired: _on_session_expired,  # type: ignore[dict-item]
    ev.DeadlineFired: _on_deadline_fired,  # type: ignore[dict-item]
    ev.RecoveryRetryDue: _on_recovery_retry_due,  # type: ignore[dict-item]
    ev.OperatorResolution: _on_operator_resolution,  # type: ignore[dict-item]
    ev.SessionReaped: _on_session_reaped,  # type: ignore[dict-item]
    ev.OwnerLost: _on_owner_lost,  # type: ignore[dict-item]
}


# A session row can exist without its first event (a crash between the two writes): only the
# offer, and the endings an operator or the reaper give, apply to it.
_BEFORE_OFFER = (ev.CallOffered, ev.SessionReaped, ev.OperatorResolution)


def step(state: SessionState, event: ev.Event, now: float) -> Result:
    """Fold one event into ``state``. Pure: the same inputs always give the same outputs."""
    if state.ended is not None:
        raise SessionTerminated(state, event, f"the session ended {state.ended.terminal_state}")
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise IllegalTransition(state, event, "no transition handles this event")
    if state.signaling is Signaling.NONE and not isinstance(event, _BEFORE_OFFER):
        raise IllegalTransition(state, event, "the call has not been offered")
    new, out = handler(state, event, now)
    # Every accepted event is a step of the log, except stale ones and audio chunks (which change
    # nothing and would flood it); the runtime persists exactly the events that moved ``version``.
    if not isinstance(event, ev.ResponseChunk) and not (
        len(out) == 1 and isinstance(out[0], fx.StaleEventIgnored)
    ):
        new = replace(new, version=state.version + 1)
    return new, out


class SessionMachine:
    """A session's live state and the one entry point that moves it."""

    def __init__(self, state: SessionState) -> None:
        self.state = state

    @classmethod
    def new(cls, session_id: str) -> SessionMachine:
        return cls(SessionState(session_id))

    def handle(self, event: ev.Event, now: float) -> list[fx.Effect]:
        """Apply ``event`` at ``now``; on :class:`IllegalTransition` the state is unchanged."""
        self.state, out = step(self.state, event, now)
        return out


def replay(state: SessionState, events: list[tuple[ev.Event, float]]) -> SessionState:
    """Fold logged events (with the times they were handled) onto a checkpointed state."""
    for event, at in events:
        state, _ = step(state, event, at)
    return state


__all__ = [
    "GateClosed",
    "IllegalTransition",
    "SessionMachine",
    "SessionTerminated",
    "replay",
    "retry_delay",
    "step",
]
