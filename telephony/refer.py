"""REFER on the SIP thread, both ways: the blind transfers we send, and the policy on the ones the
caller's side sends us, whose followed calls are calls of ours (telephony.endpoint delegates
here; telephony.transfer builds the values).

Runs on the SIP thread only, like everything that touches pjsua2.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pjsua2 as pj

from telephony import events as ev
from telephony.calls import SipAccount, SipCall
from telephony.sip_message import mask_uri
from telephony.transfer import refer_to, referred_uri

log = logging.getLogger("voicegate.sip")


class Refers:
    """``post`` hands events to asyncio; ``follow`` is the inbound policy, asked with the call's
    tenant and the target (None: refuse all)."""

    def __init__(
        self,
        post: Callable[[ev.SipEvent], None],
        follow: Callable[[str, str], bool] | None,
        calls: dict[str, SipCall],
        max_calls: int,
    ) -> None:
        self._post = post
        self._follow = follow
        # The endpoint's calls: a followed REFER's new call joins them (its slot, its events).
        self._calls = calls
        self._max_calls = max_calls

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
        """An inbound REFER (RFC 3515): refused with 403 unless policy allows its target and the
        call is not a transfer's own leg, with 503 without a free call slot for the new call; an
        allowed one is followed by pjsua (202, the INVITE, NOTIFYs of its progress) as a new call
        of ours, reported as :class:`~telephony.events.CallReferred` so that it gets its own
        session."""
        target = referred_uri(str(prm.dstUri))
        # A transfer's own leg (a bridge's, a consult) carries the caller's call: its far end may
        # not move it elsewhere, whatever the policy (the new call would have nobody on it).
        ours = bool(call.bridge_to) or call.consult
        allowed = (
            call.answered
            and not ours
            and self._follow is not None
            and self._follow(call.tenant, target)
        )
        if not allowed or account is None:
            self._refuse(call, prm, 403, target)
            return
        if len(self._calls) >= self._max_calls:
            self._refuse(call, prm, 503, target)
            return
        # The referenced new call (RFC 3515 section 2.4.2): an outbound call like a Dial's, in
        # the endpoint's calls from before pjsua places it (its states come from inside that),
        # so it holds a slot, gets a media port once answered and reports its end. The REFER's
        # own header parameters (Referred-By, RFC 3892) go on its INVITE, copied by pjsua.
        referred = SipCall(call.owner, account, pj.PJSUA_INVALID_ID)
        referred.accepted = True
        referred.outbound = True
        referred.remote_uri = target
        referred.tenant = call.tenant
        self._calls[referred.call_id] = referred
        prm.newCall = referred
        self._post(ev.InboundRefer(call.call_id, 202, mask_uri(target)))
        self._post(ev.CallReferred(referred.call_id, call.call_id, target, call.tenant))
        log.info(
            "transfer.inbound_followed",
            extra={
                "call_id": call.call_id,
                "new_call_id": referred.call_id,
                "target": mask_uri(target),
            },
        )

    def _refuse(self, call: SipCall, prm: Any, status: int, target: str) -> None:
        prm.statusCode = status
        self._post(ev.InboundRefer(call.call_id, status, mask_uri(target)))
        log.warning(
            "transfer.inbound_refused",
            extra={"call_id": call.call_id, "status": status, "target": mask_uri(target)},
        )
