"""The one recovery that owns an interrupted session (seed 001, "Retry within a deadline and an
ownership boundary").

An interruption (media gap, re-INVITE, agent-link loss) freezes the gate, cuts playback and
starts a recovery with a new generation, a shared deadline and a bounded, jittered retry
schedule; a second interruption joins the running one. A transfer halts the same way
(:func:`halt`) but is its own phase, not a recovery (session.transfer). Only events of the
current generation may move the session; the machine ignores and counts the rest. When the last
interruption is over the recovery finishes and the gate goes to reconciliation, never straight
to open (seed 000).
"""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session.backoff import Jitter, backoff_delay
from session.deadlines import RECOVERY_TIMERS, Timer, arm, drop
from session.gate import reconcile, set_gate
from session.playback import cut_playback
from session.state import Gate, Policy, Recovery, SessionState
from session.vocabulary import IntentStage, Interruption, RecoveryOutcome


def retry_delay(session_id: str, generation: int, attempt: int, policy: Policy) -> float:
    """Seconds before retry ``attempt`` of recovery ``generation``: seeded by the session and the
    generation, so a replay schedules exactly the retries the live run did (logs depend on it)."""
    return backoff_delay(
        f"{session_id}/{generation}",
        attempt,
        base_s=policy.retry_base_s,
        cap_s=policy.retry_cap_s,
        jitter=Jitter.FROM_HALF_BASE,
    )


def stale_generation(state: SessionState, generation: int) -> str | None:
    """Why an event of recovery ``generation`` is stale, or None if it is the current one's."""
    recovery = state.recovery
    if recovery is None:
        return "no recovery is running"
    if generation != recovery.generation:
        return f"generation {generation} is not the current {recovery.generation}"
    return None


def current_generation(state: SessionState) -> int:
    """The generation a dimension's restoring event names: the running recovery's, else the
    transfer's (a media gap or a link loss during a transfer is recorded, not recovered), else 0."""
    if state.recovery is not None:
        return state.recovery.generation
    return state.transfer.generation if state.transfer is not None else 0


def in_flight(state: SessionState) -> tuple[str, ...]:
    """Keys of the tool requests on the wire: abandoned (never resent) when the session is cut."""
    return tuple(o.key for o in state.outstanding if o.stage is IntentStage.SENT)


def halt(state: SessionState, now: float, out: fx.Effects) -> SessionState:
    """Seed 000, "On disconnect, first freeze new side effects, cancel/isolate the old
    response": cut playback, freeze the gate and abandon the tool requests on the wire (never
    resent: their intents stay for reconciliation). An interruption and a transfer begin so."""
    state = cut_playback(state, out)
    if state.gate is not Gate.CLOSED:
        state = set_gate(state, Gate.FROZEN, now, out)
    if keys := in_flight(state):
        out.append(fx.CancelToolCalls(keys))
    return state


def interrupt(
    state: SessionState,
    kind: Interruption,
    now: float,
    out: fx.Effects,
    *,
    generation: int | None = None,
) -> SessionState:
    """Any interruption: halt, and start (or join) the one recovery. A recovery it starts has
    the policy's ``recovery_timeout_s``, says "one moment, I am reconnecting" past
    ``honesty_after_s``, and the next generation (or ``generation``, one already taken: what
    broke during a transfer is recovered under the transfer's own number)."""
    state = halt(state, now, out)
    recovery = state.recovery
    if recovery is not None:
        if kind not in recovery.interruptions:
            recovery = replace(recovery, interruptions=(*recovery.interruptions, kind))
        return replace(state, recovery=recovery)
    if generation is None:
        generation = state.recovery_generation + 1
    policy = state.policy
    recovery = Recovery(generation, (kind,), now, now + policy.recovery_timeout_s)
    out.append(fx.StartRecovery(generation, kind, recovery.deadline))
    out.append(fx.NotifyAgent("interrupted", kind))
    state = replace(state, recovery=recovery, recovery_generation=generation)
    state = arm(state, Timer.RECOVERY, recovery.deadline, generation, out)
    state = arm(state, Timer.HONESTY, now + policy.honesty_after_s, generation, out)
    return schedule_retry(state, recovery, 0, now, out)


def schedule_retry(
    state: SessionState, recovery: Recovery, attempt: int, now: float, out: fx.Effects
) -> SessionState:
    """Arm attempt ``attempt`` if the budget allows: fewer than ``retry_max_attempts`` so far,
    and due before the recovery's deadline (seed 001: "bounded retries within the deadline")."""
    policy = state.policy
    due = now + retry_delay(state.session_id, recovery.generation, attempt, policy)
    if attempt < policy.retry_max_attempts and due < recovery.deadline:
        return arm(state, Timer.RETRY, due, recovery.generation, out, attempt=attempt)
    return state


# RFC 3261 section 12.2.1.2 and RFC 5057 section 5.1: a 481 (or 408, the request timing out)
# to a request inside a dialog means the dialog is gone; so does a transport failure, which
# PJSIP reports as 503 with "Transport" in the reason (and status 0: no answer at all). Any
# other answer (200, or 405/501 from a peer without OPTIONS) proves the dialog still exists.
_DIALOG_GONE = (481, 408, 0)


def dialog_gone(status: int, reason: str) -> bool:
    """Whether a probe's answer says the dialog no longer exists."""
    return status in _DIALOG_GONE or (status == 503 and "transport" in reason.lower())


def finished(recovery: Recovery, outcome: RecoveryOutcome, now: float) -> fx.RecoveryFinished:
    """The effect that reports how ``recovery`` ended, and how long it ran."""
    return fx.RecoveryFinished(
        recovery.generation, recovery.interruptions, outcome, round(now - recovery.started_at, 6)
    )


def recovered(state: SessionState, kind: Interruption, now: float, out: fx.Effects) -> SessionState:
    """One interruption is over; when none is left, hand the gate to reconciliation."""
    recovery = state.recovery
    assert recovery is not None
    left = tuple(k for k in recovery.interruptions if k != kind)
    if left:
        return replace(state, recovery=replace(recovery, interruptions=left))
    out.append(finished(recovery, RecoveryOutcome.RECOVERED, now))
    state = drop(replace(state, recovery=None), RECOVERY_TIMERS, out)
    out.append(fx.NotifyAgent("resumed", "+".join(recovery.interruptions)))
    return reconcile(state, now, out)
