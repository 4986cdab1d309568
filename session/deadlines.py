"""The session's deadlines: their names, and arming and dropping them.

A deadline lives twice: in ``SessionState.deadlines`` (so a replay knows it) and as a runtime
timer (a ``ScheduleTimer`` effect), which feeds ``DeadlineFired(name, generation)`` back when it
is due. The generation ties a recovery's deadlines to that recovery (seed 001): a timer of an
older generation finds no matching deadline and is stale.
"""

from __future__ import annotations

import enum
from dataclasses import replace

from session import effects as fx
from session.state import Deadline, SessionState, Signaling


class Timer(enum.StrEnum):
    """Deadline names, as the state, the timers and the log spell them."""

    HONESTY = "honesty"  # seed 004: past about two seconds of trouble, say so
    RECOVERY = "recovery"  # seed 001: the recovery's shared deadline
    RETRY = "recovery_retry"  # the next scheduled recovery attempt (fed as recovery_retry_due)
    MAX_DURATION = "max_duration"
    NO_INPUT = "no_input"  # seed 004's ladder: ask once ...
    NO_INPUT_FINAL = "no_input_final"  # ... then end honestly
    TRANSFER = "transfer_notify"  # the transfer's guard: its outcome by then, or the caller back
    RING = "ring"  # an outbound leg rings this long at most (session.legs)


# The recovery's own deadlines, dropped together when it ends.
RECOVERY_TIMERS = (Timer.RECOVERY, Timer.HONESTY, Timer.RETRY)

# What still bounds a bridged call: people talk through us, so nothing may ask them "still
# there?" or hang up on their silence (our media port is off the caller); only the call's cost.
KEPT_WHEN_BRIDGED = (Timer.MAX_DURATION,)


def arm(
    state: SessionState,
    name: Timer,
    due: float,
    generation: int,
    out: fx.Effects,
    *,
    attempt: int = 0,
) -> SessionState:
    """Record deadline ``name`` at ``due`` and ask the runtime for its timer."""
    out.append(fx.ScheduleTimer(name, due, generation, attempt=attempt))
    return replace(state, deadlines={**state.deadlines, name: Deadline(due, generation)})


def arm_no_input(state: SessionState, now: float, out: fx.Effects) -> SessionState:
    """(Re)start the no-input deadline: the caller did something, count from now."""
    if state.policy.no_input_s <= 0 or state.signaling is Signaling.BRIDGED:
        # Bridged, the caller's silence is the people's business, not ours (a turn still
        # open when the transfer began may commit later).
        return state
    if Timer.NO_INPUT_FINAL in state.deadlines:
        out.append(fx.CancelTimer(Timer.NO_INPUT_FINAL))
    state = forget(state, (Timer.NO_INPUT_FINAL,))
    return arm(state, Timer.NO_INPUT, now + state.policy.no_input_s, 0, out)


def forget(state: SessionState, names: tuple[str, ...]) -> SessionState:
    """Remove deadlines from the state only: one that fired has no timer left to cancel."""
    if not any(n in state.deadlines for n in names):
        return state
    return replace(state, deadlines={k: v for k, v in state.deadlines.items() if k not in names})


def drop(state: SessionState, names: tuple[str, ...], out: fx.Effects) -> SessionState:
    """Remove deadlines and cancel their timers (in the order of ``names``)."""
    for name in names:
        if name in state.deadlines:
            out.append(fx.CancelTimer(name))
    return forget(state, names)


def drop_all(state: SessionState, out: fx.Effects) -> SessionState:
    """Cancel every timer still armed, in name order (the session is ending or lost)."""
    for name in sorted(state.deadlines):
        out.append(fx.CancelTimer(name))
    return replace(state, deadlines={})
