"""How a session ends: the one terminal transition and the reasons it gives.

Every session reaches exactly one terminal state and never leaves it. Ending is a transition with
effects, in the order seed 000 lists for a timeout: stop generation and tool calls, clear playout,
persist outstanding intents, tell the caller what is known (if anyone is on the line), release
media, hang up. Outstanding intents are kept in the final state for reconciliation, never assumed.
That sequence is :func:`leave_line`; a session that hangs up without ending yet (dropped, waiting
for a callback; away, waiting for a transferred caller) leaves the line by it too.
The reasons are written for people reading a session's status; each says what is still unknown.
"""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session.deadlines import drop_all
from session.gate import set_gate
from session.playback import cut_playback
from session.recovery import finished, in_flight
from session.state import AgentLink, Ending, Gate, Media, SessionState, Signaling
from session.transfer_phase import end_phase
from session.vocabulary import EndingStage, RecoveryOutcome, Terminal, TransferOutcome

# How an ending reports a recovery it cut short; any other ending cancels it.
_RECOVERY_ENDED_BY = {
    Terminal.TIMED_OUT: RecoveryOutcome.TIMED_OUT,
    Terminal.FAILED: RecoveryOutcome.FAILED,
}


def leave_line(
    state: SessionState,
    now: float,
    out: fx.Effects,
    *,
    recovery_outcome: RecoveryOutcome,
    gate: Gate,
    signaling: Signaling,
    say: str | None,
    hang_up: str | None,
    stop_turn: bool = True,
) -> SessionState:
    """Leave the line with the effects seed 000 lists for a timeout, in this order: stop
    generation and the tool calls on the wire, clear playout, persist outstanding intents, end the
    recovery, tell the caller (``say``), cancel every timer, move the gate, release media, hang up
    (``hang_up``: the BYE's reason).

    The one sequence of an ending (:func:`terminate`), a drop that waits for a callback
    (session.callback) and a transfer that waits for the caller to come back (session.away);
    what differs is passed in. ``recovery_outcome``: how a running recovery is reported ended.
    ``gate``: where the gate goes, unless it is closed already (closed for good, or frozen while
    the session waits). ``say``/``hang_up``: None when nobody is on the line to be told or hung
    up on. ``stop_turn``: False leaves a turn that has no response yet without a StopGeneration
    (a successful transfer's hand-off has never sent one). Outstanding intents stay in the state
    for reconciliation, never assumed. The state returned has no recovery, no turn, response or
    timer, the agent link closed, media released (if there was any) and ``signaling``.
    """
    if stop_turn and state.turn is not None and state.response is None:
        out.append(fx.StopGeneration())  # with a response, cut_playback says it
    if keys := in_flight(state):
        out.append(fx.CancelToolCalls(keys))
    state = cut_playback(replace(state, turn=None), out)
    if state.outstanding:
        out.append(fx.PersistOutstanding(state.outstanding_keys()))
    if state.recovery is not None:
        out.append(finished(state.recovery, recovery_outcome, now))
    # A transfer still under way ends with the session; a transfer's own endings (the caller
    # with the target, or gone) have ended its phase with their outcome already.
    state = end_phase(state, TransferOutcome.ENDED, now, out)
    if say is not None:
        out.append(fx.Say(say))
    state = drop_all(state, out)
    if state.gate is not Gate.CLOSED:
        state = set_gate(state, gate, now, out)
    out.append(fx.ReleaseMedia())
    if hang_up is not None:
        out.append(fx.HangUp(hang_up))
    return replace(
        state,
        recovery=None,
        media=Media.RELEASED if state.media is not Media.NONE else Media.NONE,
        agent_link=AgentLink.CLOSED,
        signaling=signaling,
    )


def terminate(
    state: SessionState,
    terminal: Terminal,
    reason: str,
    stage: EndingStage | None,
    now: float,
    out: fx.Effects,
    *,
    caller_present: bool,
    say: str | None = None,
) -> SessionState:
    """End the session: :func:`leave_line` with the gate closed for good, then ``Finished``.

    ``caller_present``: someone is on the line to be told (``say``) and hung up on; False when
    the dialog is already gone (the caller left, PJSIP ended it, the process died).
    """
    state = leave_line(
        state,
        now,
        out,
        recovery_outcome=_RECOVERY_ENDED_BY.get(terminal, RecoveryOutcome.CANCELED),
        gate=Gate.CLOSED,
        signaling=Signaling.GONE,
        say=say if caller_present else None,
        hang_up=reason if caller_present else None,
    )
    out.append(fx.Finished(terminal, reason, stage))
    # Nobody may come back to an ended session: an operator or the reaper ending one that is
    # away or dropped leaves no window behind (the runtime reads one as "not ended yet").
    return replace(
        state,
        ended=Ending(terminal, reason, stage, now),
        away_until=None,
        dropped_until=None,
        dropped_stage="",
    )


# --- reasons ------------------------------------------------------------------------------------


def unknown_outcomes(state: SessionState) -> str:
    """What an ending leaves for reconciliation: "N tool call(s) with unknown outcome"."""
    n = len(state.outstanding)
    return f"{n} tool call{'s' if n != 1 else ''} with unknown outcome"


def with_unknown(reason: str, state: SessionState) -> str:
    """``reason``, plus the outstanding tool calls if there are any."""
    return f"{reason}, with {unknown_outcomes(state)}" if state.outstanding else reason


def dialog_failed(status: int, text: str, state: SessionState) -> str:
    return with_unknown(f"dialog failed: {status} {text}".strip(), state)


def dialog_gone(status: int, text: str, state: SessionState) -> str:
    """A recovery probe found no dialog: say what answered (or that nothing did)."""
    if status == 0:
        answer = f"OPTIONS got no answer ({text or 'transport error'})"
    else:
        answer = f"OPTIONS answered {status} {text}".strip()
    return with_unknown(f"dialog gone: {answer}", state)


def session_expired(text: str, state: SessionState) -> str:
    return with_unknown(f"session timer expired: {text}".rstrip(": "), state)


def not_recovered(state: SessionState) -> str:
    recovery = state.recovery
    assert recovery is not None
    return (
        f"{'+'.join(recovery.interruptions)} not recovered within "
        f"{state.policy.recovery_timeout_s:g} s"
    )


def no_input(state: SessionState) -> str:
    waited = state.policy.no_input_s + state.policy.no_input_grace_s
    return f"no input from the caller for {waited:g} s"


def max_duration(state: SessionState) -> str:
    return f"call reached its maximum duration of {state.policy.max_duration_s:g} s"


def by_operator(note: str) -> str:
    return f"resolved by an operator: {note}" if note else "resolved by an operator"


def reaped(why: str, state: SessionState) -> str:
    known = [f"last known: {state.status()}"]
    if state.outstanding:
        known.append(f"{unknown_outcomes(state)} left for reconciliation")
    return f"{why}; {'; '.join(known)}"
