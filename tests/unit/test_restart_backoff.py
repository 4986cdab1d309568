"""How long the supervisor waits before restarting a worker that died."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from voicegate.pool.supervisor import MIN_REPEAT_BACKOFF_S, STABLE_AFTER_S, next_backoff


def deaths(count: int, up_s: float, base_s: float = 0.5, cap_s: float = 30.0) -> list[float]:
    waits: list[float] = []
    previous = None
    for _ in range(count):
        previous = next_backoff(previous, up_s=up_s, base_s=base_s, cap_s=cap_s)
        waits.append(previous)
    return waits


def test_quick_deaths_double_the_wait_up_to_the_cap() -> None:
    assert deaths(9, up_s=2.0) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_a_stable_run_starts_again_from_the_base() -> None:
    assert next_backoff(16.0, up_s=STABLE_AFTER_S, base_s=0.5, cap_s=30.0) == 0.5


def test_a_zero_base_restarts_at_once_but_never_loops_back_to_back() -> None:
    assert deaths(4, up_s=1.0, base_s=0.0, cap_s=0.0) == [0.0] + [MIN_REPEAT_BACKOFF_S] * 3
    assert deaths(4, up_s=1.0, base_s=0.0, cap_s=1.0) == [0.0, 0.1, 0.2, 0.4]


@given(
    base=st.floats(0, 60),
    extra=st.floats(0, 3600),
    ups=st.lists(st.floats(0, 2 * STABLE_AFTER_S), min_size=1, max_size=30),
)
def test_waits_stay_within_base_and_cap(base: float, extra: float, ups: list[float]) -> None:
    cap = base + extra
    previous = None
    for up_s in ups:
        wait = next_backoff(previous, up_s=up_s, base_s=base, cap_s=cap)
        assert base <= wait
        assert wait <= max(cap, MIN_REPEAT_BACKOFF_S)
        if previous is not None and up_s < STABLE_AFTER_S:
            assert wait >= min(previous, max(cap, MIN_REPEAT_BACKOFF_S))  # never shrinks
        previous = wait
