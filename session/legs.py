"""Outbound legs: the transitions of a call voicegate places (``POST /v1/calls``, later a
bridged transfer's second leg) until someone answers it or it is given up.

Sans-IO like :mod:`session.machine`, whose one table (``TRANSITIONS``) names these handlers: a
placed call starts in ``offered`` (it rings at the far end) with a ring deadline; answered, it is
an ordinary call (``call_answered``, the same session semantics as an inbound one); not answered,
it ends in one explicit outcome (:class:`~session.vocabulary.LegOutcome`):

| outcome | from | terminal state |
| --- | --- | --- |
| no_answer | our ring deadline (we CANCEL it), or 480 | timed_out, stage ringing |
| busy | 486 Busy Here, 600 Busy Everywhere (RFC 3261 21.4.24, 21.6.1) | canceled |
| declined | 603 Decline (RFC 3261 21.6.2) | canceled |
| failed | any other final answer; a call that never left (our 503) | failed, stage signaling |
"""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session import events as ev
from session.deadlines import Timer, arm
from session.ending import terminate
from session.errors import IllegalTransition
from session.state import Policy, SessionState, Signaling
from session.vocabulary import EndingStage, LegOutcome, Terminal

Result = tuple[SessionState, fx.Effects]

_BY_STATUS = {
    480: LegOutcome.NO_ANSWER,
    486: LegOutcome.BUSY,
    600: LegOutcome.BUSY,
    603: LegOutcome.DECLINED,
    487: LegOutcome.CANCELED,
}

_ENDING = {
    LegOutcome.NO_ANSWER: (Terminal.TIMED_OUT, EndingStage.RINGING),
    LegOutcome.BUSY: (Terminal.CANCELED, None),
    LegOutcome.DECLINED: (Terminal.CANCELED, None),
    LegOutcome.CANCELED: (Terminal.CANCELED, None),
    LegOutcome.FAILED: (Terminal.FAILED, EndingStage.SIGNALING),
}


def leg_outcome(status: int) -> LegOutcome:
    """The outcome a final non-2xx answer to our INVITE means."""
    return _BY_STATUS.get(status, LegOutcome.FAILED)


def on_call_placed(state: SessionState, event: ev.CallPlaced, now: float) -> Result:
    out: fx.Effects = []
    state = replace(state, signaling=Signaling.OFFERED, policy=Policy.from_dict(event.policy))
    return arm(state, Timer.RING, now + event.ring_timeout_s, 0, out), out


def on_leg_unanswered(state: SessionState, event: ev.LegUnanswered, now: float) -> Result:
    if Timer.RING not in state.deadlines:
        # Offered without our ring deadline is a call to us, not ours ringing out: a fresh one,
        # or a caller back (session.callback) with the intents of the call that dropped, which
        # an outcome here (canceled when busy) would end as if none were unknown.
        raise IllegalTransition(state, event, "only a ringing outbound leg goes unanswered")
    outcome = leg_outcome(event.status)
    terminal, stage = _ENDING[outcome]
    reason = f"{outcome.value.replace('_', ' ')} ({event.status} {event.reason})".replace(" )", ")")
    out: fx.Effects = []
    # The INVITE's transaction is over: nobody is on the line, nothing to hang up.
    return terminate(state, terminal, reason, stage, now, out, caller_present=False), out


def on_ring_timeout(state: SessionState, now: float, out: fx.Effects) -> SessionState:
    """Our ring deadline passed with the leg still ringing: give it up (the HangUp effect
    CANCELs the INVITE, RFC 3261 section 9) and end ``timed_out`` at stage ``ringing``."""
    return terminate(
        state,
        Terminal.TIMED_OUT,
        "no answer before the ring timeout",
        EndingStage.RINGING,
        now,
        out,
        caller_present=True,  # the INVITE is still pending: the hang-up is its CANCEL
    )
