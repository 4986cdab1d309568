"""Outbound INVITEs (telephony.events.Dial): the SIP thread's half of an outbound leg.

The call object is an ordinary :class:`~telephony.calls.SipCall` marked ``outbound``: once PJSIP
reports it confirmed it is answered like any call (telephony.endpoint posts CallAnswered and
MediaReady), and its end is reported by the same DISCONNECTED path, with the callee's final status
when it was never answered. It is held in the endpoint's calls from before ``makeCall``, so it
counts against the same ceiling as inbound calls (``PJSUA_MAX_CALLS``, shared/notes/pjsua2.md)
and its wrapper outlives the call (a collected ``Call`` hangs up its index: notes/transfer.md).
"""

from __future__ import annotations

from typing import Any

import pjsua2 as pj

from telephony import events as ev
from telephony.calls import CallOwner, SipAccount, SipCall


def place_call(
    owner: CallOwner,
    account: SipAccount | None,
    calls: dict[str, SipCall],
    command: ev.Dial,
    *,
    draining: bool,
    max_calls: int,
) -> str | None:
    """Send the INVITE; None once it is on its way, else why it cannot leave (nothing kept).

    RFC 3261 section 8.1.1: pjsua builds From from the account (or ``command.caller_id``) and
    Contact from the transport; ``command.headers`` are added as they are (the context headers
    of a bridged transfer).
    """
    if draining:
        return "the server is shutting down"
    if account is None or len(calls) >= max_calls:
        return "no free call slot"
    call = SipCall(owner, account, pj.PJSUA_INVALID_ID)
    call.call_id = command.call_id
    call.accepted = True
    call.outbound = True
    call.remote_uri = command.target
    call.bridge_to = command.bridge_to
    call.consult = command.consult
    call.tenant = command.tenant
    prm = pj.CallOpParam(True)
    if command.caller_id:
        # pjsua_msg_data.local_uri: this INVITE's From instead of the account's id (the dialog's
        # local URI, so the BYE and re-INVITEs of the call carry it too, RFC 3261 12.2.1.1).
        prm.txOption.localUri = command.caller_id
    for name, value in command.headers:
        prm.txOption.headers.append(_header(name, value))
    # Held from before makeCall: PJSIP may report the call's first states from inside it.
    calls[command.call_id] = call
    try:
        call.makeCall(command.target, prm)
    except pj.Error as exc:
        if calls.pop(command.call_id, None) is None:
            return None  # already reported DISCONNECTED, and so ended, from inside makeCall
        return f"the INVITE could not be sent: {exc.reason}"
    return None


def _header(name: str, value: str) -> Any:
    header = pj.SipHeader()
    header.hName = name
    header.hValue = value
    return header
