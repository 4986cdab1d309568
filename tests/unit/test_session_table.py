"""The transition table of ``session.machine``: every event type has one rule, and every pair of
(signaling state, event type) outside the rule's states is refused or ignored as the rule says.

In the spirit of h2's ``test_state_machines.py``: each state is driven with each input, so a rule
that drifts from its table entry fails here, whatever the handler does.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from session import effects as fx
from session import events as ev
from session.machine import _AWAY, _DROPPED, TRANSITIONS, Ignore, IllegalTransition, Refuse, step
from session.state import SessionState, Signaling

SID = "table"


def _fold(*timed: tuple[ev.Event, float]) -> SessionState:
    state = SessionState(SID)
    for event, at in timed:
        state, _ = step(state, event, at)
    return state


OFFER = (ev.CallOffered("+15550001234", "service", {}), 0.0)
ANSWER = (ev.CallAnswered(), 1.0)

# One live (not ended) session in each signaling state.
IN_STATE: dict[Signaling, Callable[[], SessionState]] = {
    Signaling.NONE: lambda: SessionState(SID),
    Signaling.OFFERED: lambda: _fold(OFFER),
    Signaling.UP: lambda: _fold(OFFER, ANSWER),
    Signaling.REINVITE_PENDING: lambda: _fold(OFFER, ANSWER, (ev.ReinviteStarted(), 2.0)),
    Signaling.TRANSFERRING: lambda: _fold(OFFER, ANSWER, (ev.TransferStarted("sip:d@x"), 2.0)),
    Signaling.BRIDGED: lambda: _fold(
        OFFER, ANSWER, (ev.TransferStarted("sip:d@x", "bridge"), 2.0), (ev.BridgeUp(1), 3.0)
    ),
    Signaling.GONE: lambda: _fold(OFFER, ANSWER, (ev.OwnerLost("died"), 2.0)),
    # A blind transfer that succeeded while a resume handle may bring the caller back.
    Signaling.AWAY: lambda: _fold(
        (ev.CallOffered("+15550001234", "service", {"resume_ttl_s": 600.0}), 0.0),
        ANSWER,
        (ev.TransferStarted("sip:d@x"), 2.0),
        (ev.TransferFinished(1, ok=True, status=200), 3.0),
    ),
    # Media lost for good while the caller may call back (session.callback).
    Signaling.DROPPED: lambda: _fold(
        (ev.CallOffered("+15550001234", "service", {"callback_window_s": 120.0}), 0.0),
        ANSWER,
        (ev.MediaLost(), 2.0),
        (ev.DeadlineFired("recovery", 1), 22.0),
    ),
}


def test_every_signaling_state_has_a_live_example() -> None:
    for signaling, make in IN_STATE.items():
        state = make()
        assert state.signaling is signaling and state.ended is None


def test_every_event_type_has_exactly_one_rule() -> None:
    assert set(TRANSITIONS) == set(ev.EVENT_TYPES.values())
    assert all(rule.event is event for event, rule in TRANSITIONS.items())


def test_only_the_offer_and_the_forced_endings_apply_before_the_offer() -> None:
    before_offer = {e.type for e, rule in TRANSITIONS.items() if Signaling.NONE in rule.legal_in}
    assert before_offer == {
        "call_offered", "call_placed", "operator_resolution", "session_reaped"
    }


PAIRS = [
    (signaling, event_type)
    for event_type, rule in TRANSITIONS.items()
    for signaling in Signaling
    if signaling not in rule.legal_in
]


@pytest.mark.parametrize(
    ("signaling", "event_type"), PAIRS, ids=[f"{s.value}-{e.type}" for s, e in PAIRS]
)
def test_an_event_outside_its_states_is_refused_or_ignored_as_its_rule_says(
    signaling: Signaling, event_type: type[ev.Event]
) -> None:
    state = IN_STATE[signaling]()
    event = event_type()
    rule = TRANSITIONS[event_type]
    if signaling is Signaling.NONE:
        expected: Refuse | Ignore = Refuse("the call has not been offered")
    elif signaling is Signaling.AWAY and isinstance(rule.elsewhere, Refuse):
        expected = Refuse(_AWAY)
    elif signaling is Signaling.DROPPED and isinstance(rule.elsewhere, Refuse):
        expected = Refuse(_DROPPED)
    else:
        expected = rule.elsewhere
    if isinstance(expected, Ignore):
        after, effects = step(state, event, 5.0)
        assert after is state
        assert effects == [fx.StaleEventIgnored(event.type, expected.why)]
        return
    with pytest.raises(IllegalTransition) as caught:
        step(state, event, 5.0)
    assert str(caught.value) == (
        f"{event.type} is illegal in state [{state.status()}]: {expected.why}"
    )
