"""Seed 000's reconciliation table, row by row, on the session machine (fake clock)."""

from __future__ import annotations

import pytest

from session import effects as fx
from session import events as ev
from session.machine import GateClosed, step
from session.state import Gate, SessionState


class Session:
    """A session's state and the effects of its last step: the tests' view of ``step``."""

    def __init__(self, session_id: str) -> None:
        self.state = SessionState(session_id)

    def handle(self, event: ev.Event, now: float) -> list[fx.Effect]:
        self.state, effects = step(self.state, event, now)
        return effects


def _frozen_with_intent(outcomes_first: tuple[str, ...] = ()) -> Session:
    """An answered call with one write intent sent, then a media gap that was recovered, so the
    gate is reconciling with that intent outstanding."""
    m = Session("s")
    m.handle(ev.CallOffered(), 0.0)
    m.handle(ev.CallAnswered(), 1.0)
    m.handle(ev.TurnStarted("t1"), 2.0)
    m.handle(ev.TurnCommitted("t1"), 2.1)
    m.handle(ev.ToolIntent("k1", "charge", "write", "d1", "t1"), 2.2)
    m.handle(ev.ToolRequestSent("k1"), 2.3)
    m.handle(ev.MediaLost(), 3.0)
    generation = m.state.recovery_generation
    effects = m.handle(ev.MediaRestored(generation), 4.0)
    assert m.state.gate is Gate.RECONCILING
    assert fx.Reconcile(("k1",)) in effects
    return m


def test_no_outstanding_intents_opens_the_gate() -> None:
    m = Session("s")
    m.handle(ev.CallOffered(), 0.0)
    m.handle(ev.CallAnswered(), 1.0)
    m.handle(ev.MediaLost(), 2.0)
    effects = m.handle(ev.MediaRestored(m.state.recovery_generation), 3.0)
    assert m.state.gate is Gate.OPEN
    assert not any(isinstance(e, fx.Reconcile) for e in effects)
    # ...and the old response is not playable: the generation moved on.
    assert m.state.playback_generation == 1


@pytest.mark.parametrize("outcome", ["committed", "failed"])
def test_a_receipt_is_recorded_told_and_the_call_continues(outcome: str) -> None:
    m = _frozen_with_intent()
    effects = m.handle(ev.ToolReceipt("k1", outcome), 5.0)
    assert fx.NotifyAgent("tool_receipt", f"k1 {outcome}") in effects
    assert m.state.gate is Gate.OPEN
    assert m.state.outstanding == ()
    assert m.state.ended is None
    m.handle(ev.TurnStarted("t2"), 6.0)  # new work is admitted again


def test_confirmed_not_started_is_recorded_and_only_a_new_intent_may_follow() -> None:
    m = _frozen_with_intent()
    m.handle(ev.ToolReceipt("k1", "not_started"), 5.0)
    assert m.state.gate is Gate.OPEN and m.state.outstanding == ()
    # Never a replay of the old request: k1 is gone from the session; a new authorised intent
    # (new turn, new key) is what may follow.
    m.handle(ev.TurnStarted("t2"), 6.0)
    m.handle(ev.TurnCommitted("t2"), 6.1)
    effects = m.handle(ev.ToolIntent("k2", "charge", "write", "d2", "t2"), 6.2)
    assert effects == [fx.SendToolRequest("k2")]


def test_unknown_keeps_the_gate_closed_and_goes_to_needs_human() -> None:
    m = _frozen_with_intent()
    effects = m.handle(ev.ToolReceipt("k1", "unknown"), 5.0)
    assert m.state.ended is not None
    assert (m.state.ended.terminal_state, m.state.ended.stage) == ("needs_human", "reconciliation")
    assert m.state.gate is Gate.CLOSED
    assert fx.PersistOutstanding(("k1",)) in effects
    assert fx.Say("outcome_unknown") in effects
    assert m.state.outstanding_keys() == ("k1",)  # kept, never assumed


def test_while_reconciling_no_new_write_turn_or_response_is_admitted() -> None:
    m = _frozen_with_intent()
    before = m.state
    for event in (
        ev.TurnStarted("t9"),
        ev.ResponseStarted("r9", "t1"),
        ev.ToolIntent("k9", "charge", "write", "d9", "t1"),
    ):
        with pytest.raises(GateClosed):
            m.handle(event, 5.0)
    assert m.state is before
