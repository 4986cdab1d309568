"""The committed caller captures are what tests/fixtures/caller_stream.py renders, and they
have no gap of their own: the only silence a scenario playing one has is the one it ends with."""

from __future__ import annotations

import itertools

import pytest

from tests.fixtures.caller_stream import (
    CAPTURES,
    PAY_THEN_DROP,
    PCAP_DIR,
    Key,
    Speech,
    caller_pcap,
    last_packet_ms,
)
from tests.integration.rtp_capture import read_rtp


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_the_committed_capture_is_the_rendered_one(name: str) -> None:
    assert (PCAP_DIR / name).read_bytes() == caller_pcap(CAPTURES[name]), (
        "run python -m tests.fixtures.caller_stream"
    )


def test_the_caller_sends_every_20_ms_until_it_drops() -> None:
    packets = read_rtp(PCAP_DIR / "caller-pay-then-drop.pcap")
    times = [round((p.at - packets[0].at) * 1000) for p in packets]
    steps = {b - a for a, b in itertools.pairwise(times)}
    assert steps <= {0, 20}  # 0: an event's end sent three times (RFC 4733 section 2.5.1.4)
    assert times[-1] == last_packet_ms(PAY_THEN_DROP)
    assert len({p.src_port for p in packets}) == 1


def test_the_keys_are_telephone_events_at_their_times() -> None:
    packets = read_rtp(PCAP_DIR / "caller-pay-then-drop.pcap")
    start = packets[0].at
    events = [p for p in packets if p.payload_type == 101]
    onsets = sorted({round((p.at - start) * 1000) for p in events})
    keys = [s.at_ms for s in PAY_THEN_DROP if isinstance(s, Key)]
    # Each key's packets begin at its time and last 160 ms.
    assert [t for t in onsets if t - 20 not in onsets] == keys


def test_a_stream_out_of_order_is_refused() -> None:
    with pytest.raises(ValueError, match="in order"):
        caller_pcap((Key(400, "1"), Key(200, "2"), Speech(600)))
    with pytest.raises(ValueError, match="speech step last"):
        caller_pcap((Speech(0), Key(200, "2")))
    with pytest.raises(ValueError, match="20 ms"):
        caller_pcap((Key(210, "1"), Speech(600)))
