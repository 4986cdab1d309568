"""Away and back: a caller transferred out who may come back with the session's resume handle.

Seed 000, step 2: a short-lived resume handle bound to the tenant lets a session be recovered on
a new transport; seed 004: "reclaim, don't resend". So a transfer that succeeds (the caller is
with the call centre and our leg is hung up) does not end the session while its handle may
still bring the caller back: the session is ``away`` until the handle's lifetime runs out
(``Policy.resume_ttl_s``). Then the reaper ends it ``completed`` with reason ``transferred``
(:func:`on_away_expired`), exactly as the transfer used to at once: one terminal state either
way, and never two.

While away nobody is on the line: no turn, response, tool call or timer; the gate stays frozen.
A caller who comes back (:func:`on_call_rejoined`, a new INVITE with the handle, on any worker
sharing the store) starts a new signaling generation: the session is offered again, and the gate
reconciles first (seed 000's table), so the agent sees the outcome of what happened before,
never runs it again.

A session from before rejoin existed has ``resume_ttl_s`` 0 in its policy and ends at the
transfer as it always did (old logs fold unchanged).
"""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session import ending
from session import events as ev
from session.errors import IllegalTransition
from session.gate import reconcile, set_gate
from session.state import AgentLink, Gate, Media, SessionState, Signaling, Terminal
from session.vocabulary import EndingStage, RecoveryOutcome

Result = tuple[SessionState, fx.Effects]

# What the session says it ended with, and the handoff's "why": unchanged from before rejoin.
TRANSFERRED = "transferred"


def may_go_away(state: SessionState) -> bool:
    """A transfer that succeeded leaves the session away (not ended) when a handle may bring
    the caller back, and nothing is outstanding (a tool call of unknown outcome needs a person
    now: it ends ``needs_human`` at the transfer, as before)."""
    return state.policy.resume_ttl_s > 0 and not state.outstanding


def go_away(state: SessionState, now: float, out: fx.Effects) -> SessionState:
    """The caller is with the target: hang up our leg (session.ending.leave_line, no prompt: the
    caller is talking to someone else), keep the session open, frozen, until the handle expires.
    The transfer's phase has ended already (session.transfer)."""
    state = ending.leave_line(
        state,
        now,
        out,
        recovery_outcome=RecoveryOutcome.CANCELED,
        gate=Gate.FROZEN,
        signaling=Signaling.AWAY,
        say=None,
        # RFC 5589 section 6: our BYE goes only now, after the final 2xx NOTIFY.
        hang_up=TRANSFERRED,
        stop_turn=False,
    )
    return replace(state, away_until=now + state.policy.resume_ttl_s)


def on_call_rejoined(state: SessionState, event: ev.CallRejoined, now: float) -> Result:
    """A new dialog brings the caller back: offered again (the runtime answers it), and the
    gate reconciles before any new work (seed 000: session recovery is not "resume listening")."""
    expected = state.signaling_generation + 1
    if event.generation != expected:
        raise IllegalTransition(
            state, event, f"signaling generation {event.generation} is not the next ({expected})"
        )
    if state.away_until is not None and now >= state.away_until:
        raise IllegalTransition(state, event, "the session's resume handle has expired")
    out: fx.Effects = []
    state = replace(
        state,
        signaling=Signaling.OFFERED,
        signaling_generation=expected,
        media=Media.NONE,
        media_since=None,
        agent_link=AgentLink.CONNECTED,
        away_until=None,
        answered_at=None,
    )
    if state.gate is Gate.OPEN:
        state = set_gate(state, Gate.FROZEN, now, out)
    return reconcile(state, now, out), out


def on_away_expired(state: SessionState, event: ev.AwayExpired, now: float) -> Result:
    """Nobody came back within the handle's lifetime: the transfer was the end of it."""
    if state.away_until is not None and now < state.away_until:
        raise IllegalTransition(state, event, "the session's resume handle is still valid")
    out: fx.Effects = []
    if state.outstanding:
        terminal, stage = Terminal.NEEDS_HUMAN, EndingStage.TRANSFER
        reason = f"transferred with {ending.unknown_outcomes(state)}"
    else:
        terminal, stage, reason = Terminal.COMPLETED, None, TRANSFERRED
    return ending.terminate(state, terminal, reason, stage, now, out, caller_present=False), out


def on_resume_reused(state: SessionState, event: ev.ResumeReused, now: float) -> Result:
    """A rotated handle came back: possibly stolen. Writes freeze and the outstanding intents
    are asked about again; only reconciliation opens the gate (seed 000)."""
    out: fx.Effects = []
    if state.gate is Gate.CLOSED:
        return state, out
    state = set_gate(state, Gate.FROZEN, now, out)
    if state.signaling in (Signaling.AWAY, Signaling.DROPPED):
        return state, out  # reconciled when the caller returns (on_call_rejoined, callback)
    if state.recovery is not None or state.transfer is not None:
        return state, out  # reconciled when the recovery ends, or the caller is back from it
    return reconcile(state, now, out), out
