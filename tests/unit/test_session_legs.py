"""An outbound leg in the session machine (session.legs): placed, it rings under our deadline;
answered, it is an ordinary call; not answered, it ends in one explicit outcome."""

from __future__ import annotations

import pytest

from session import effects as fx
from session import events as ev
from session.legs import leg_outcome
from session.machine import IllegalTransition, step
from session.state import SessionState, Signaling
from session.vocabulary import LegOutcome

SID = "sess-leg"
POLICY = {"recovery_timeout_s": 10.0, "max_duration_s": 600.0}
PLACED = (ev.CallPlaced("sip:****567@cc.example", 20.0, POLICY), 100.0)


def fold(*timed: tuple[ev.Event, float]) -> tuple[SessionState, list[fx.Effect]]:
    state, effects = SessionState(SID), []
    for event, at in timed:
        state, effects = step(state, event, at)
    return state, effects


def test_a_placed_leg_rings_under_its_ring_deadline() -> None:
    state, effects = fold(PLACED)
    assert state.signaling is Signaling.OFFERED
    assert effects == [fx.ScheduleTimer("ring", 120.0, 0)]
    assert state.policy.max_duration_s == 600.0


def test_answered_it_is_an_ordinary_call_and_the_ring_deadline_is_dropped() -> None:
    state, effects = fold(PLACED, (ev.CallAnswered(), 105.0))
    assert state.signaling is Signaling.UP and "ring" not in state.deadlines
    assert fx.CancelTimer("ring") in effects
    assert fx.ScheduleTimer("max_duration", 705.0, 0) in effects
    # A ring deadline that fires anyway (its timer raced the answer) changes nothing.
    after, out = step(state, ev.DeadlineFired("ring", 0), 120.0)
    assert after == state and isinstance(out[0], fx.StaleEventIgnored)


def test_nobody_answering_before_the_deadline_ends_timed_out_with_a_cancel() -> None:
    state, effects = fold(PLACED, (ev.DeadlineFired("ring", 0), 120.0))
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage) == ("timed_out", "ringing")
    assert state.ended.reason == "no answer before the ring timeout"
    # The INVITE is still pending: the hang-up is its CANCEL (RFC 3261 section 9); nobody to tell.
    assert fx.HangUp("no answer before the ring timeout") in effects
    assert not any(isinstance(e, fx.Say) for e in effects)


@pytest.mark.parametrize(
    ("status", "reason", "terminal", "stage", "said"),
    [
        (486, "Busy Here", "canceled", None, "busy (486 Busy Here)"),
        (600, "Busy Everywhere", "canceled", None, "busy (600 Busy Everywhere)"),
        (603, "Decline", "canceled", None, "declined (603 Decline)"),
        (480, "Temporarily Unavailable", "timed_out", "ringing",
         "no answer (480 Temporarily Unavailable)"),
        (404, "Not Found", "failed", "signaling", "failed (404 Not Found)"),
        (503, "no free call slot", "failed", "signaling", "failed (503 no free call slot)"),
    ],
)  # fmt: skip
def test_each_final_answer_is_an_explicit_outcome(
    status: int, reason: str, terminal: str, stage: str | None, said: str
) -> None:
    state, effects = fold(PLACED, (ev.LegUnanswered(status, reason), 103.0))
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage, state.ended.reason) == (
        terminal,
        stage,
        said,
    )
    assert fx.CancelTimer("ring") in effects
    assert not any(isinstance(e, fx.HangUp) for e in effects)  # the transaction is over


def test_the_outcome_vocabulary() -> None:
    assert leg_outcome(486) is LegOutcome.BUSY and leg_outcome(487) is LegOutcome.CANCELED
    assert leg_outcome(500) is LegOutcome.FAILED


def test_an_answered_call_cannot_go_unanswered_and_a_placed_one_is_not_offered_again() -> None:
    up, _ = fold(PLACED, (ev.CallAnswered(), 105.0))
    with pytest.raises(IllegalTransition):
        step(up, ev.LegUnanswered(486, "Busy Here"), 106.0)
    ringing, _ = fold(PLACED)
    with pytest.raises(IllegalTransition):
        step(ringing, ev.CallOffered("+15550001234", "svc", POLICY), 101.0)
    with pytest.raises(IllegalTransition):
        step(ringing, PLACED[0], 101.0)


def test_only_a_leg_we_placed_and_that_still_rings_goes_unanswered() -> None:
    # An offered session that never rang out (a caller calling back after a drop, with the
    # dropped call's intent outstanding) ended canceled on a busy answer, with a tool call of
    # unknown outcome (the properties' acceptable terminal states). Only our ringing INVITE
    # has a final answer to give.
    offered, _ = fold((ev.CallOffered("+15550001234", "svc", POLICY), 100.0))
    policy = {**POLICY, "callback_window_s": 120.0}
    called_back, _ = fold(
        (ev.CallOffered("+15550001234", "svc", policy), 100.0),
        (ev.CallAnswered(), 101.0),
        (ev.ToolIntent("k1", "lookup", "read", "d", "t1"), 102.0),
        (ev.MediaLost(), 103.0),
        (ev.DeadlineFired("recovery", 1), 113.0),
        (ev.CalledBack(1, "******1234"), 120.0),
    )
    assert called_back.signaling is Signaling.OFFERED and called_back.outstanding_keys() == ("k1",)
    for state in (offered, called_back):
        with pytest.raises(IllegalTransition, match="only a ringing outbound leg"):
            step(state, ev.LegUnanswered(486, "Busy Here"), 121.0)


def test_an_operator_hanging_up_a_ringing_leg_cancels_it() -> None:
    state, effects = fold(PLACED, (ev.ServerHangup("canceled", "hung up by operator"), 104.0))
    assert state.ended is not None and state.ended.terminal_state == "canceled"
    assert fx.CancelTimer("ring") in effects
