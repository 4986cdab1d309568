"""Calls answered 2xx whose ACK never comes: ended on our own, shorter timer.

A caller (or an attacker) that sends INVITE and never ACKs our 200 holds one of the process's four
call slots: PJSIP retransmits the 200 until Timer H (64*T1, 32 s) and only then sends its BYE
(RFC 3261 section 13.3.1.4). Four such INVITEs a minute kept a worker full. Lowering T1 or
Timer D globally is no cure: the same timers bound the in-dialog OPTIONS that probes a caller in
a tunnel (session/recovery.py), which must keep waiting.

So the SIP thread keeps its own ACK timer (``sip.ack_timeout_s``). When it expires the call is
hung up with status 408: PJSIP then sends the BYE at once instead of holding it until an ACK
(sip_inv.c holds it only for causes other than 408 and transport errors). A peer that answers
nothing, not even the BYE, still holds the slot until telephony.dialog_end ends the dialog.
"""

from __future__ import annotations


class HalfOpen:
    """Which answered calls still wait for their ACK, and since when (sans-IO, time passed in)."""

    def __init__(self, ack_timeout_s: float) -> None:
        if ack_timeout_s <= 0:
            raise ValueError("ack_timeout_s must be > 0")
        self.ack_timeout_s = ack_timeout_s
        self._due: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._due)

    def answered(self, call_id: str, now: float) -> None:
        """Our 2xx went out at ``now`` (the first one counts): the ACK is due by the timeout."""
        self._due.setdefault(call_id, now + self.ack_timeout_s)

    def done(self, call_id: str) -> None:
        """The ACK came, or the call ended: nothing is due for it any more."""
        self._due.pop(call_id, None)

    def next_due(self) -> float | None:
        return min(self._due.values(), default=None)

    def due(self, now: float) -> list[str]:
        """The calls whose ACK is overdue at ``now``; each is returned once."""
        overdue = [call_id for call_id, due in self._due.items() if due <= now]
        for call_id in overdue:
            del self._due[call_id]
        return overdue
