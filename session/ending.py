"""How a session ends: the one terminal transition and the reasons it gives.

Every session reaches exactly one terminal state and never leaves it. Ending is a transition with
effects, in the order seed 000 lists for a timeout: stop generation and tool calls, clear playout,
persist outstanding intents, tell the caller what is known (if anyone is on the line), release
media, hang up. Outstanding intents are kept in the final state for reconciliation, never assumed.
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
from session.vocabulary import EndingStage, RecoveryOutcome, Terminal

# How an ending reports a recovery it cut short; any other ending cancels it.
_RECOVERY_ENDED_BY = {
    Terminal.TIMED_OUT: RecoveryOutcome.TIMED_OUT,
    Terminal.FAILED: RecoveryOutcome.FAILED,
}


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
    """End the session with the effects seed 000 lists for a timeout, in this order.

    ``caller_present``: someone is on the line to be told (``say``) and hung up on; False when
    the dialog is already gone (the caller left, PJSIP ended it, the process died).
    """
    if state.turn is not None and state.response is None:
        out.append(fx.StopGeneration())  # with a response, cut_playback says it
    if keys := in_flight(state):
        out.append(fx.CancelToolCalls(keys))
    state = cut_playback(replace(state, turn=None), out)
    if state.outstanding:
        out.append(fx.PersistOutstanding(state.outstanding_keys()))
    if state.recovery is not None:
        outcome = _RECOVERY_ENDED_BY.get(terminal, RecoveryOutcome.CANCELED)
        out.append(finished(state.recovery, outcome, now))
    if caller_present and say is not None:
        out.append(fx.Say(say))
    state = drop_all(state, out)
    state = set_gate(state, Gate.CLOSED, now, out)
    out.append(fx.ReleaseMedia())
    if caller_present:
        out.append(fx.HangUp(reason))
    out.append(fx.Finished(terminal, reason, stage))
    return replace(
        state,
        recovery=None,
        media=Media.RELEASED if state.media is not Media.NONE else Media.NONE,
        agent_link=AgentLink.CLOSED,
        signaling=Signaling.GONE,
        ended=Ending(terminal, reason, stage, now),
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
