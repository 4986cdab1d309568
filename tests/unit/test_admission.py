from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from telephony.admission import SLOT_HOLD_S, Admission
from telephony.offer_check import BadOffer


def test_accepts_until_the_ceiling_then_486() -> None:
    adm = Admission(max_calls=2, rate=50)
    assert adm.decide(live_calls=0, called_user="x", now=0.0).status is None
    assert adm.decide(live_calls=1, called_user="x", now=0.1).status is None
    refusal = adm.decide(live_calls=2, called_user="x", now=0.2)
    assert (refusal.status, refusal.reason) == (486, "capacity")


def test_unknown_number_is_404_when_numbers_are_configured() -> None:
    adm = Admission(max_calls=4, rate=50, numbers=frozenset({"100"}))
    assert adm.decide(live_calls=0, called_user="100", now=0).status is None
    assert adm.decide(live_calls=0, called_user="200", now=1).status == 404


def test_draining_refuses_with_503_at_once() -> None:
    adm = Admission(max_calls=4, rate=50)
    adm.draining = True
    decision = adm.decide(live_calls=0, called_user="x", now=5.0)
    assert (decision.status, decision.reason, decision.not_before) == (503, "draining", 5.0)


def test_over_the_rate_is_503_held_past_the_socket_quarantine() -> None:
    adm = Admission(max_calls=4, rate=1, burst=1)
    assert adm.decide(live_calls=0, called_user="x", now=10.0).status is None
    decision = adm.decide(live_calls=0, called_user="x", now=10.1)
    assert (decision.status, decision.reason) == (503, "setup_rate")
    assert decision.not_before == 10.1 + SLOT_HOLD_S


def test_a_bad_offer_is_refused_with_its_status_but_never_faster_than_the_rate() -> None:
    # Its call slot cost PJSIP the same two sockets as a good call's: a flood of bad offers
    # refused at once aborted a worker on ioqueue exhaustion.
    adm = Admission(max_calls=4, rate=1, burst=1)
    bad = BadOffer(488, "sdp_address_not_numeric")
    first = adm.decide(live_calls=0, called_user="x", now=10.0, bad_offer=bad)
    assert (first.status, first.reason, first.not_before) == (488, "sdp_address_not_numeric", 10.0)
    second = adm.decide(live_calls=0, called_user="x", now=10.1, bad_offer=bad)
    assert (second.status, second.reason) == (503, "setup_rate")
    assert second.not_before == 10.1 + SLOT_HOLD_S
    # And it is refused even when the number is unknown or the worker full.
    adm = Admission(max_calls=1, rate=50, numbers=frozenset({"100"}))
    assert adm.decide(live_calls=1, called_user="200", now=0, bad_offer=bad).status == 488


@given(
    st.lists(st.floats(min_value=0, max_value=0.05), min_size=1, max_size=400),
    st.floats(min_value=1, max_value=60),
)
def test_admitted_setups_never_exceed_rate_plus_burst_in_any_window(
    gaps: list[float], rate: float
) -> None:
    adm = Admission(max_calls=4, rate=rate)
    now, admitted = 0.0, []
    for gap in gaps:
        now += gap
        if adm.decide(live_calls=0, called_user="x", now=now).status is None:
            admitted.append(now)
    for i, start in enumerate(admitted):
        in_window = [t for t in admitted[i:] if t < start + 1.0]
        assert len(in_window) <= rate + adm.burst + 1e-9
