"""Incoming calls being refused: answered with an error now, or held until a set-up slot is due.

telephony.admission decides; this carries the decision out on the SIP thread and keeps each
refused call's pjsua2 wrapper alive until PJSIP reports it gone (a collected wrapper called back
from C crashes the process: notes, "Lifetimes and the GIL").
"""

from __future__ import annotations

import logging

import pjsua2 as pj

from telephony.calls import SipCall

log = logging.getLogger("voicegate.sip")


class Refusals:
    def __init__(self) -> None:
        self.calls: dict[str, SipCall] = {}
        self._held: list[tuple[float, SipCall, int, str]] = []

    def __bool__(self) -> bool:
        return bool(self.calls)

    def refuse(
        self, call: SipCall, status: int, *, not_before: float, now: float, warning: str = ""
    ) -> None:
        """Answer ``call`` with ``status`` now, or at ``not_before`` if that is later; a 503 sent
        now carries ``Retry-After``, and a refusal with a ``warning`` (a Warning header value,
        telephony.srtp_offer.warning_header) carries that."""
        self.calls[call.call_id] = call
        if not_before > now or warning or status == 503:
            # A refusal sent from inside onIncomingCall loses its headers (pjsua answers for
            # the call once the callback returns, with the status code alone: measured, no
            # Warning on the wire, and a draining server's 503 without its Retry-After); one
            # sent on the SIP loop's next turn keeps them.
            self._held.append((max(not_before, now), call, status, warning))
        else:
            _send(call, status, retry_after=status == 503)

    def next_due(self) -> float | None:
        """When the next held refusal is due, if one is held."""
        return min(item[0] for item in self._held) if self._held else None

    def release_due(self, now: float) -> None:
        if not self._held:
            return
        due = [item for item in self._held if item[0] <= now]
        if due:
            self._held = [item for item in self._held if item[0] > now]
            for _, call, status, warning in due:
                if call.call_id in self.calls:
                    _send(call, status, retry_after=status == 503, warning=warning)

    def forget(self, call: SipCall) -> None:
        """PJSIP reported ``call`` gone: drop its wrapper (telephony.endpoint says why now)."""
        self.calls.pop(call.call_id, None)
        if self._held:
            self._held = [item for item in self._held if item[1] is not call]

    def clear(self) -> None:
        self._held.clear()
        self.calls.clear()


def _send(call: SipCall, status: int, *, retry_after: bool, warning: str = "") -> None:
    prm = pj.CallOpParam()
    prm.statusCode = status
    for name, value in (("Retry-After", "1" if retry_after else ""), ("Warning", warning)):
        if value:
            header = pj.SipHeader()
            header.hName = name
            header.hValue = value
            prm.txOption.headers.append(header)
    call.local_hangup = True
    try:
        call.hangup(prm)
    except pj.Error as exc:
        log.debug("refusal failed: %s", exc.reason)
