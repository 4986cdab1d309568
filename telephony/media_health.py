"""Is RTP arriving? Decided from PJSIP's received-packet counter, polled: sans-IO, time passed in.

Frame callbacks cannot tell: when RTP stops, the jitter buffer keeps handing the media port
frames every 20 ms (shared/notes/pjsua2.md, "Media health"). The RTCP receive counter
(``getStreamStat(i).rtcp.rxStat.pkt``) stalls instead, and climbs again when packets return.
A hold (the caller's re-INVITE with ``a=sendonly`` or ``inactive``) silences RTP on purpose: it is
shown as ``held``, never as a failure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Health(enum.Enum):
    FLOWING = "flowing"
    INTERRUPTED = "interrupted"
    HELD = "held"


@dataclass(frozen=True, slots=True)
class HealthChange:
    old: Health
    new: Health
    since: float  # when the new state began (for a gap: when the last packet had arrived)


class MediaHealth:
    """One call's media health. Feed :meth:`observe` every poll (100 to 250 ms)."""

    def __init__(self, gap_threshold_s: float, now: float) -> None:
        self.gap_threshold_s = gap_threshold_s
        self.state = Health.FLOWING
        self._packets = -1
        self._last_change = now

    def observe(self, packets: int, now: float, *, held: bool) -> HealthChange | None:
        """The counter's value at ``now``; returns the change this observation makes, if any."""
        arrived = packets != self._packets
        if arrived:
            self._packets = packets
            self._last_change = now
        old = self.state
        if held:
            new = Health.HELD
        elif old is Health.HELD:
            # Unheld: the gap clock starts again now, not at the last packet before the hold.
            self._last_change = now
            new = Health.FLOWING
        elif arrived:
            new = Health.FLOWING
        elif now - self._last_change >= self.gap_threshold_s:
            new = Health.INTERRUPTED
        else:
            new = old
        if new is old:
            return None
        self.state = new
        return HealthChange(old, new, self._last_change if new is Health.INTERRUPTED else now)
