"""REFER on the SIP thread, both ways: the blind transfers we send, and the policy on the ones the
caller's side sends us (telephony.endpoint delegates here; telephony.transfer builds the values).

Runs on the SIP thread only, like everything that touches pjsua2.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pjsua2 as pj

from telephony import events as ev
from telephony.calls import ReferredCall, SipAccount, SipCall
from telephony.sip_message import mask_uri
from telephony.transfer import refer_to, referred_uri

log = logging.getLogger("voicegate.sip")


class Refers:
    """``post`` hands events to asyncio; ``follow`` is the inbound policy, asked with the call's
    tenant and the target (None: refuse all)."""

    def __init__(
        self, post: Callable[[ev.SipEvent], None], follow: Callable[[str, str], bool] | None
    ) -> None:
        self._post = post
        self._follow = follow
        # Calls pjsua placed to follow an allowed inbound REFER, until DISCONNECTED.
        self._referred: list[ReferredCall] = []

    def send(
        self, call: SipCall | None, call_id: str, target: str, headers: tuple[tuple[str, str], ...]
    ) -> None:
        """Send the REFER of a blind transfer (RFC 5589 section 6). pjsua adds Referred-By with
        our own URI (RFC 3892), so none is added here; the dialog stays up until the session
        decides (our BYE goes after the final 2xx NOTIFY)."""
        if call is None or not call.answered or call.local_hangup:
            self._post(ev.TransferStatus(call_id, 481, "call is not up", final=True))
            return
        try:
            call.xfer(refer_to(target, headers), pj.CallOpParam(True))
        except (pj.Error, ValueError) as exc:
            reason = exc.reason if isinstance(exc, pj.Error) else str(exc)
            log.warning("transfer not sent", extra={"call_id": call_id, "error": reason})
            self._post(ev.TransferStatus(call_id, 503, f"REFER not sent: {reason}", final=True))
            return
        log.info("transfer.refer_sent", extra={"call_id": call_id, "target": mask_uri(target)})

    def send_replaces(self, call: SipCall | None, consult: SipCall | None, call_id: str) -> None:
        """Send the REFER of an attended transfer (RFC 5589 section 7): its Refer-To names the
        consult dialog's remote party with ``Replaces`` (RFC 3891) escaped in, and
        ``Require: replaces``, built by pjsua (``xferReplaces``). Progress comes as for a blind
        REFER; a REFER that cannot be sent is reported as a final 503."""
        if call is None or not call.answered or call.local_hangup:
            self._post(ev.TransferStatus(call_id, 481, "call is not up", final=True))
            return
        if consult is None or not consult.answered or consult.local_hangup:
            self._post(ev.TransferStatus(call_id, 481, "the consult leg is not up", final=True))
            return
        try:
            call.xferReplaces(consult, pj.CallOpParam(True))
        except pj.Error as exc:
            log.warning("transfer not sent", extra={"call_id": call_id, "error": exc.reason})
            self._post(ev.TransferStatus(call_id, 503, f"REFER not sent: {exc.reason}", final=True))
            return
        log.info("transfer.refer_replaces_sent", extra={"call_id": call_id})

    def on_request(self, call: SipCall, prm: Any, account: SipAccount | None) -> None:
        """An inbound REFER (RFC 3515): refused with 403 unless policy allows its target; an
        allowed one is followed by pjsua (202, the INVITE, NOTIFYs of its progress)."""
        target = referred_uri(str(prm.dstUri))
        allowed = call.answered and self._follow is not None and self._follow(call.tenant, target)
        if not allowed or account is None:
            prm.statusCode = 403
            self._post(ev.InboundRefer(call.call_id, 403, mask_uri(target)))
            log.warning(
                "transfer.inbound_refused",
                extra={"call_id": call.call_id, "target": mask_uri(target)},
            )
            return
        referred = ReferredCall(call.owner, account, call.call_id)
        self._referred.append(referred)
        prm.newCall = referred
        self._post(ev.InboundRefer(call.call_id, 202, mask_uri(target)))
        log.info(
            "transfer.inbound_followed", extra={"call_id": call.call_id, "target": mask_uri(target)}
        )

    def on_referred_state(self, call: ReferredCall) -> None:
        if call.getInfo().state == pj.PJSIP_INV_STATE_DISCONNECTED:
            # Dropped now, before PJSIP reuses its index (telephony.endpoint.on_call_state).
            self._referred = [c for c in self._referred if c is not call]

    def clear(self) -> None:
        self._referred.clear()
