"""A bridged transfer's media: the caller's call and the leg to the target connected both ways
in the conference bridge (pjsua2's "conference call": ``a.startTransmit(b)`` and back), so their
audio never passes through Python.

The caller's media port (ours: the agent's voice out, the caller's audio in) is disconnected from
the caller first, so nothing of the agent reaches the caller or the target while people talk. The
port stays the caller's until its call ends (telephony.port_pool takes it back then). SIP thread
only; called again after every media update of either call (a re-INVITE gives a call a new
``AudioMedia``, shared/notes/pjsua2.md "Media health"), which connects the new media.
"""

from __future__ import annotations

from telephony.calls import SipCall


def connect_bridge(caller: SipCall, leg: SipCall) -> bool:
    """Connect ``caller`` and ``leg`` both ways; True the first time (the bridge is up now)."""
    if caller.bridge is not None:
        caller.bridge.disconnect(caller.audio)
    caller.audio.startTransmit(leg.audio)
    leg.audio.startTransmit(caller.audio)
    first = not caller.bridged_with
    caller.bridged_with = leg.call_id
    leg.bridged_with = caller.call_id
    return first
