from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from telephony.media_health import Health, HealthChange, MediaHealth


def test_a_stalled_counter_is_a_gap_after_the_threshold_and_recovers_on_packets() -> None:
    health = MediaHealth(1.0, now=0.0)
    assert health.observe(10, 0.0, held=False) is None
    assert health.observe(20, 0.2, held=False) is None
    assert health.observe(20, 1.0, held=False) is None  # 0.8 s without packets: not yet
    change = health.observe(20, 1.2, held=False)
    assert change == HealthChange(Health.FLOWING, Health.INTERRUPTED, since=0.2)
    assert health.observe(20, 3.0, held=False) is None
    assert health.observe(21, 3.2, held=False) == HealthChange(
        Health.INTERRUPTED, Health.FLOWING, since=3.2
    )


def test_a_hold_is_not_a_failure_and_unhold_restarts_the_gap_clock() -> None:
    health = MediaHealth(1.0, now=0.0)
    health.observe(5, 0.0, held=False)
    assert health.observe(5, 0.5, held=True) == HealthChange(Health.FLOWING, Health.HELD, 0.5)
    assert health.observe(5, 30.0, held=True) is None  # a long hold, no gap
    assert health.observe(5, 30.2, held=False) == HealthChange(Health.HELD, Health.FLOWING, 30.2)
    assert health.observe(5, 31.0, held=False) is None
    assert health.observe(5, 31.3, held=False).new is Health.INTERRUPTED  # type: ignore[union-attr]


@given(st.lists(st.tuples(st.floats(0.05, 0.5), st.booleans()), max_size=80))
def test_interrupted_only_after_threshold_without_packets(steps: list[tuple[float, bool]]) -> None:
    health = MediaHealth(1.0, now=0.0)
    now, packets, last_packet = 0.0, 0, 0.0
    health.observe(packets, now, held=False)
    for gap, arrives in steps:
        now += gap
        if arrives:
            packets += 1
            last_packet = now
        health.observe(packets, now, held=False)
        if health.state is Health.INTERRUPTED:
            assert now - last_packet >= 1.0
        else:
            # Observed every step, a gap reaches INTERRUPTED the moment it passes the threshold.
            assert now - last_packet < 1.0
