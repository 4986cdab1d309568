"""Dropped and called back: a caller whose media was lost for good may call back and continue.

Seed 004, "reclaim, don't resend": a call whose media recovery gives up (the caller's phone lost
signal; not a BYE: a caller who hangs up has left) does not end the session at once when
``Policy.callback_window_s`` is set. The session is ``dropped``: our leg is hung up exactly as
before (the same prompt, the same BYE), the gate stays frozen, and nothing runs. A caller who
calls back from the same number to the same tenant within the window and chooses to continue
(voicegate/call/callbacks.py: the offer, the key press, the resume code) starts a new signaling
generation (:func:`on_called_back`); the gate reconciles first (seed 000's table), so the agent
hears the outcome of what happened meanwhile, never runs it again.

Nobody calls back, or the caller chooses a new session: :func:`on_callback_ended` ends the session
with the very terminal state, reason and stage the recovery's deadline gave it at the drop
(``timed_out`` at stage ``recovery``): one terminal state either way, never two.

A session from before callbacks has ``callback_window_s`` 0 in its policy and ends at the
deadline as it always did (old logs fold unchanged).
"""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session import ending
from session import events as ev
from session.errors import IllegalTransition
from session.gate import reconcile, set_gate
from session.state import AgentLink, Gate, Media, SessionState, Signaling, Terminal
from session.vocabulary import EndingStage, Interruption, RecoveryOutcome

Result = tuple[SessionState, fx.Effects]

# Why a dropped session ends (CallbackEnded.cause): the window passed, or the caller who called
# back chose a new session, let the offer time out, or used up the resume code's attempts.
CAUSES = ("window", "declined", "no_answer", "code_refused")


def may_drop(state: SessionState) -> bool:
    """The recovery's deadline passed on media lost for good, with the caller's dialog up (not
    in a transfer or re-INVITE), and callbacks are on: the session waits for a callback."""
    recovery = state.recovery
    return (
        state.policy.callback_window_s > 0
        and recovery is not None
        and Interruption.MEDIA in recovery.interruptions
        and state.signaling is Signaling.UP
    )


def drop(state: SessionState, reason: str, say: str, now: float, out: fx.Effects) -> SessionState:
    """Hang up as the deadline's ending would (stop generation and tool calls, clear playout,
    tell the line, release media, BYE), but keep the session open for the window, frozen, with
    the ending it will get (``reason``) if nobody calls back."""
    state = ending.leave_line(
        state,
        now,
        out,
        recovery_outcome=RecoveryOutcome.TIMED_OUT,
        gate=Gate.FROZEN,
        signaling=Signaling.DROPPED,
        say=say,
        hang_up=reason,
    )
    return replace(
        state,
        dropped_until=now + state.policy.callback_window_s,
        dropped_reason=reason,
    )


def may_park(state: SessionState) -> bool:
    """The process serving the call died with the caller on the line and a write under way
    (its resume code read out), and callbacks are on: the session may wait for a callback
    (``OwnerLost(park=True)``) rather than end. Without a code a callback could not prove it is
    the same caller, and nothing is left to hear."""
    return (
        state.policy.callback_window_s > 0
        and state.signaling in (Signaling.UP, Signaling.REINVITE_PENDING)
        and bool(state.resume_code)
    )


def park(state: SessionState, reason: str, stage: EndingStage, now: float) -> SessionState:
    """Keep a session whose process died open for the callback window, dropped; nobody calls
    back, and it ends with ``reason`` at ``stage`` (:func:`on_callback_ended`)."""
    return replace(
        state,
        signaling=Signaling.DROPPED,
        dropped_until=now + state.policy.callback_window_s,
        dropped_reason=reason,
        dropped_stage=stage.value,
    )


def on_called_back(state: SessionState, event: ev.CalledBack, now: float) -> Result:
    """The caller called back and chose to continue: offered again (the runtime's call is this
    session's now), and the gate reconciles before any new work (seed 000)."""
    expected = state.signaling_generation + 1
    if event.generation != expected:
        raise IllegalTransition(
            state, event, f"signaling generation {event.generation} is not the next ({expected})"
        )
    if state.dropped_until is not None and now >= state.dropped_until:
        raise IllegalTransition(state, event, "the session's callback window has passed")
    if needs_code(state) and not event.with_code:
        raise IllegalTransition(state, event, "continuing this session needs its resume code")
    out: fx.Effects = []
    state = replace(
        state,
        signaling=Signaling.OFFERED,
        signaling_generation=expected,
        media=Media.NONE,
        media_since=None,
        agent_link=AgentLink.CONNECTED,
        dropped_until=None,
        dropped_reason="",
        dropped_stage="",
        answered_at=None,
    )
    if state.gate is Gate.OPEN:
        state = set_gate(state, Gate.FROZEN, now, out)
    return reconcile(state, now, out), out


def on_callback_ended(state: SessionState, event: ev.CallbackEnded, now: float) -> Result:
    """End the dropped session as its recovery's deadline would have at the drop."""
    if event.cause not in CAUSES:
        raise IllegalTransition(state, event, f"no callback ending {event.cause!r}")
    if event.cause == "window" and state.dropped_until is not None and now < state.dropped_until:
        raise IllegalTransition(state, event, "the session's callback window is still open")
    out: fx.Effects = []
    reason = state.dropped_reason or "media not recovered"
    if state.dropped_stage == EndingStage.PROCESS.value:
        terminal, stage = Terminal.FAILED, EndingStage.PROCESS  # its process died (park)
    else:
        terminal, stage = Terminal.TIMED_OUT, EndingStage.RECOVERY
    return ending.terminate(state, terminal, reason, stage, now, out, caller_present=False), out


def on_resume_code_issued(state: SessionState, event: ev.ResumeCodeIssued, now: float) -> Result:
    """Kept so that a callback asks for the code; a second one replaces the first (the caller
    was read the newer one last)."""
    if not event.digest:
        raise IllegalTransition(state, event, "a resume code needs its digest")
    return replace(state, resume_code=event.digest), []


def needs_code(state: SessionState) -> bool:
    """Continuing after a callback needs the resume code: a write was started (the code is
    issued then), so a stranger calling from a spoofed number cannot take it over."""
    return bool(state.resume_code)
