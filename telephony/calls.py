"""pjsua2's subclasses: the account, the endpoint and one call, each handing its callbacks on.

PJSIP calls these back on the SIP thread (telephony.endpoint). They keep a call's own state (the
media port it borrowed, whether it was answered, a re-INVITE under way) and tell their owner what
happened; the owner decides what follows.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Protocol

import pjsua2 as pj

from telephony import events as ev
from telephony.dialog_end import DialogKey
from telephony.sip_message import cseq
from telephony.srtp_offer import offers_dtls

if TYPE_CHECKING:
    from telephony.media_health import MediaHealth
    from telephony.port_pool import MediaPort
    from telephony.strict_source import StrictSource


class CallOwner(Protocol):
    """What the calls report to: the SIP thread (telephony.endpoint.SipEndpoint)."""

    def post(self, event: ev.SipEvent) -> None: ...
    def on_incoming(self, account: SipAccount, prm: Any) -> None: ...
    def on_call_state(self, call: SipCall) -> None: ...
    def on_media_state(self, call: SipCall) -> None: ...
    def on_answer_sent(self, call: SipCall, response: str) -> None: ...
    def on_transfer_request(self, call: SipCall, prm: Any) -> None: ...


class SipAccount(pj.Account):  # type: ignore[misc]
    def __init__(self, owner: CallOwner) -> None:
        super().__init__()
        self._owner = owner

    def onIncomingCall(self, prm: Any) -> None:
        self._owner.on_incoming(self, prm)


class SipLibrary(pj.Endpoint):  # type: ignore[misc]
    """The process's one ``pj.Endpoint`` (a singleton: notes, "Threading")."""

    def __init__(self, owner: CallOwner) -> None:
        super().__init__()
        self._owner = owner
        # With media.srtp on: the account without SRTP that DTLS offers are given to.
        self.plain_account_id: int | None = None

    def onSelectAccount(self, prm: Any) -> None:
        # An out-of-dialog request, before pjsua makes anything of it: a DTLS offer must not
        # reach the SRTP account, where the wheel's PJSIP crashes on it (telephony.srtp_offer).
        if self.plain_account_id is not None and offers_dtls(prm.rdata.wholeMsg):
            prm.accountIndex = self.plain_account_id

    def onRejectedIncomingCall(self, prm: Any) -> None:
        # PJSIP's own refusals, made before any call object exists. Above all 486 when every call
        # slot is taken: uaConfig.maxCalls is sip.max_calls (clamped to the wheel's
        # PJSUA_MAX_CALLS), so PJSIP enforces our ceiling statelessly, before opening any socket.
        reason = "capacity" if prm.statusCode == 486 else f"pjsip_{prm.statusCode}"
        self._owner.post(ev.CallRefused(prm.statusCode, reason, prm.remoteInfo))


class SipCall(pj.Call):  # type: ignore[misc]
    def __init__(self, owner: CallOwner, account: SipAccount, index: int) -> None:
        super().__init__(account, index)
        self.owner = owner
        self.call_id = uuid.uuid4().hex
        self.accepted = False
        self.outbound = False  # placed by us (telephony.events.Dial), not offered to us
        self.bridge_to = ""  # a bridge leg: the call whose audio it is connected with
        self.bridged_with = ""  # either side of a bridge that is up: the other call
        self.consult = False  # an attended transfer's consult leg: no media port of ours
        self.answered = False
        self.local_hangup = False
        self.bridge: MediaPort | None = None
        self.audio: Any = None
        self.media_index = -1
        self.held = False
        self.reinvite_pending = False
        self.health: MediaHealth | None = None
        self.strict: StrictSource | None = None
        self.remote_uri = ""
        self.ack_timed_out = False
        self.remote_tag = ""  # the INVITE's From tag
        self.tenant = ""  # the tenant admission gave the call
        self.dialog: DialogKey | None = None  # once our 2xx named our tag
        # Dialog probes (telephony.events.ProbeDialog) in flight: the OPTIONS request's CSeq
        # number -> (generation, attempt). Set while sendRequest runs, which reports the new
        # transaction (state CALLING) before it returns.
        self._probes: dict[int, tuple[int, int]] = {}
        self._sending_probe: tuple[int, int] | None = None

    def probe(self, generation: int, attempt: int) -> None:
        """Send OPTIONS within this call's dialog (RFC 3261 section 11); its final response is
        posted as DialogProbed. Raises pj.Error if PJSIP cannot send it."""
        prm = pj.CallSendRequestParam()
        prm.method = "OPTIONS"
        # RFC 3261 11.1: an Accept header field SHOULD be included; SDP, as pjsua offers.
        accept = pj.SipHeader()
        accept.hName = "Accept"
        accept.hValue = "application/sdp"
        prm.txOption.headers.append(accept)
        self._sending_probe = (generation, attempt)
        try:
            self.sendRequest(prm)
        finally:
            self._sending_probe = None

    def onCallState(self, prm: Any) -> None:
        self.owner.on_call_state(self)

    def onCallMediaState(self, prm: Any) -> None:
        self.owner.on_media_state(self)

    def onCallRxReinvite(self, prm: Any) -> None:
        if self.accepted and self.answered:
            self.reinvite_pending = True
            self.owner.post(ev.ReinviteStarted(self.call_id))

    def onCallTsxState(self, prm: Any) -> None:
        tsx = prm.e.body.tsxState.tsx
        if tsx.role == pj.PJSIP_ROLE_UAC and tsx.method == "OPTIONS":
            # A transport failure has no peer answer: PJSIP fills in 503 and the OS's text.
            # Reported as status 0, so that it cannot be taken for a peer's own 503.
            failed = prm.e.body.tsxState.type == pj.PJSIP_EVENT_TRANSPORT_ERROR
            self._on_probe_tsx(tsx, transport_failed=failed)
            return
        if (
            not self.answered
            and tsx.method == "INVITE"
            and tsx.role == pj.PJSIP_ROLE_UAS
            and 200 <= tsx.statusCode < 300
        ):
            # Our 2xx to the INVITE went out (lastTx is that response): the ACK is now due
            # (telephony.half_open), and the dialog has both its tags (telephony.dialog_end).
            self.owner.on_answer_sent(self, tsx.lastTx.wholeMsg)
            return
        # A re-INVITE we answered with an error leaves the old media in place (RFC 6141);
        # onCallMediaState then never comes, so the failure is reported from here.
        if not self.reinvite_pending:
            return
        if tsx.method == "INVITE" and tsx.role == pj.PJSIP_ROLE_UAS and tsx.statusCode >= 300:
            self.reinvite_pending = False
            self.owner.post(ev.ReinviteFinished(self.call_id, ok=False))

    def _on_probe_tsx(self, tsx: Any, *, transport_failed: bool) -> None:
        # lastTx of a client transaction is its request, on every state change.
        found = cseq(tsx.lastTx.wholeMsg)
        if found is None:
            return
        number = found[0]
        if self._sending_probe is not None and number not in self._probes:
            self._probes[number] = self._sending_probe
            self._sending_probe = None
        if tsx.statusCode < 200:
            return  # sent, or a provisional answer: wait for the final one
        # Reported again when the transaction terminates after COMPLETED: the pop answers once.
        probe = self._probes.pop(number, None)
        if probe is not None:
            generation, attempt = probe
            status, reason = tsx.statusCode, tsx.statusText
            if transport_failed:
                status, reason = 0, f"transport error: {reason}"
            self.owner.post(ev.DialogProbed(self.call_id, generation, attempt, status, reason))

    def onCallTransferRequest(self, prm: Any) -> None:
        # An inbound REFER: pjsua would follow any (toll fraud); the owner applies the policy.
        self.owner.on_transfer_request(self, prm)

    def onCallTransferStatus(self, prm: Any) -> None:
        # A REFER we sent: 100 once accepted, then each NOTIFY's sipfrag status; finalNotify when
        # the implicit subscription ends (RFC 3515 section 2.4.5).
        if self.accepted:
            self.owner.post(
                ev.TransferStatus(
                    self.call_id, int(prm.statusCode), str(prm.reason), bool(prm.finalNotify)
                )
            )

    def onDtmfDigit(self, prm: Any) -> None:
        if self.accepted:
            method = "rfc2833" if prm.method == pj.PJSUA_DTMF_METHOD_RFC2833 else "sip-info"
            self.owner.post(ev.DtmfReceived(self.call_id, prm.digit, method))
