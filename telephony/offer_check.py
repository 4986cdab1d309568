"""Offers PJSIP would abort on, refused before it sees them (issue: garbage in never crashes).

The registry's pjsua2 wheel is built with its assertions live: an SDP whose connection address is
254 characters or longer reaches ``pj_sockaddr_in_set_str_addr`` when the call is answered and
aborts the whole worker (``Assertion '!str_addr || str_addr->slen < (254)'``, PROTOS c07-sip group
``sdp-connection-ip``). An INVITE is checked in ``onIncomingCall``, before anything is answered;
what PJSIP cannot take is refused with 488 (RFC 3261 section 21.4.26: the session description is
not acceptable), counted by reason, and never becomes a session.
"""

from __future__ import annotations

from dataclasses import dataclass

# PJ_MAX_HOSTNAME: pjlib asserts that a host string it converts is shorter than this.
MAX_ADDRESS = 254


@dataclass(frozen=True, slots=True)
class BadOffer:
    status: int
    reason: str  # a metric label: short and fixed


def check_offer(whole_msg: str) -> BadOffer | None:
    """None if PJSIP can take this INVITE's offer, else how to refuse it."""
    _, sep, body = whole_msg.partition("\r\n\r\n")
    if not sep:
        _, sep, body = whole_msg.partition("\n\n")
    if not body.strip():
        return None  # no offer: PJSIP sends one in the 200 and reads the answer in the ACK
    for raw in body.splitlines():
        line = raw.strip()
        kind, eq, value = line.partition("=")
        if not eq or len(kind) != 1:
            continue
        if kind in ("c", "o"):
            # c=<nettype> <addrtype> <address>; o=<user> <id> <version> <nettype> <addrtype>
            # <address> (RFC 4566 sections 5.2 and 5.7): the address is the last field.
            fields = value.split()
            if fields and len(fields[-1]) >= MAX_ADDRESS:
                return BadOffer(488, "sdp_address_too_long")
        elif kind == "a" and value.startswith("rtcp:"):
            # a=rtcp:<port> [<nettype> <addrtype> <address>] (RFC 3605)
            fields = value.split()
            if len(fields) >= 4 and len(fields[-1]) >= MAX_ADDRESS:
                return BadOffer(488, "sdp_address_too_long")
    return None
