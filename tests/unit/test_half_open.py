"""telephony.half_open and dialog_end's schedule: calls overdue for their ACK, dialogs overdue
for their end (sans-IO)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from telephony.dialog_end import DialogKey, Lingering
from telephony.half_open import HalfOpen


def test_an_unacked_call_is_due_once_at_its_timeout() -> None:
    half = HalfOpen(8.0)
    half.answered("a", now=100.0)
    assert half.next_due() == 108.0
    assert half.due(107.9) == []
    assert half.due(108.0) == ["a"]
    assert half.due(200.0) == []
    assert len(half) == 0 and half.next_due() is None


def test_an_ack_or_an_end_clears_the_call() -> None:
    half = HalfOpen(8.0)
    half.answered("acked", now=0.0)
    half.answered("ended", now=1.0)
    half.done("acked")
    half.done("ended")
    half.done("never-seen")
    assert half.due(100.0) == []


def test_a_retransmitted_answer_does_not_move_the_deadline() -> None:
    half = HalfOpen(8.0)
    half.answered("a", now=0.0)
    half.answered("a", now=4.0)  # PJSIP reports the 2xx again as the transaction moves on
    assert half.due(8.0) == ["a"]


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        HalfOpen(0)


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 50), st.booleans()), max_size=30))
def test_each_call_is_due_exactly_when_unacked_past_its_timeout(
    steps: list[tuple[int, float, bool]],
) -> None:
    half = HalfOpen(8.0)
    first: dict[str, float] = {}
    acked: set[str] = set()
    for number, at, ack in steps:
        call = f"c{number}"
        if ack:
            half.done(call)
            acked.add(call)
        elif call not in first and call not in acked:
            half.answered(call, at)
            first[call] = at
    due = half.due(100.0)
    assert sorted(due) == sorted(c for c in first if c not in acked)
    assert half.due(1000.0) == []


def test_an_ended_dialog_is_looked_at_again_once_after_the_bye_had_its_chance() -> None:
    lingering = Lingering(after_s=4.0)
    key = DialogKey("call-1", "ours", "theirs")
    lingering.ended(key, now=10.0)
    lingering.ended(key, now=12.0)  # a second hang-up does not postpone it
    assert lingering.next_due() == 14.0
    assert lingering.due(13.9) == []
    assert lingering.due(14.0) == [key]
    assert lingering.due(100.0) == [] and len(lingering) == 0
