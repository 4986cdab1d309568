"""One seeded, jittered exponential backoff for every bounded retry schedule.

The delay of attempt ``n`` lies between a floor and ``ceiling = min(cap, base * 2**n)``; where in
that range is drawn from a generator seeded by ``seed`` and ``n``, so the same inputs always give
the same delay: a replayed session schedules the same retries it did live (seed 001, "bounded
backoff with jitter"), and tests need no clock or randomness of their own. Jitter spreads the
retries of many sessions that failed together (a media server restart) over time.
"""

from __future__ import annotations

import enum
import random


class Jitter(enum.StrEnum):
    """Where in ``[floor, ceiling]`` a delay may fall."""

    # From half the base up to the ceiling: wide spread, never back to back. The session's
    # recovery retries (``session.recovery.retry_delay``).
    FROM_HALF_BASE = "from_half_base"
    # "Equal jitter": the upper half of the ceiling, so waits still grow with the attempt.
    # Tool status queries (voicegate/tools/client.py ``ToolClient.resolve``).
    EQUAL = "equal"


def backoff_delay(seed: str, attempt: int, *, base_s: float, cap_s: float, jitter: Jitter) -> float:
    """Seconds to wait before retry ``attempt`` (0 for the first), never more than ``cap_s``.

    Deterministic in all its arguments; ``seed`` names the schedule (a session and recovery
    generation, a tool call's idempotency key), and each attempt draws from its own generator, so
    a delay does not depend on how many were drawn before it.
    """
    ceiling = min(cap_s, base_s * (2**attempt))
    rng = random.Random(f"{seed}/{attempt}")
    floor = ceiling / 2 if jitter is Jitter.EQUAL else min(base_s / 2, ceiling)
    return float(floor + rng.random() * (ceiling - floor))
