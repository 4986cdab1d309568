"""INVITEs refused before anything is answered: offers PJSIP would abort on, and malformed requests
its parser lets through (issue: garbage in never crashes, and never becomes a session).

The registry's pjsua2 wheel is built with its assertions live: an SDP whose connection address is
254 characters or longer reaches ``pj_sockaddr_in_set_str_addr`` when the call is answered and
aborts the whole worker (``Assertion '!str_addr || str_addr->slen < (254)'``, PROTOS c07-sip group
``sdp-connection-ip``). An INVITE is checked in ``onIncomingCall``, before anything is answered;
what PJSIP cannot take is refused with 488 (RFC 3261 section 21.4.26: the session description is
not acceptable), counted by reason, and never becomes a session.

PJSIP's parser is also liberal where RFC 4475 says a request must be refused, and would answer
(and open a session for) an INVITE with a doubled Call-ID or a Request-Line with extra spaces.
Those are refused here with the status the RFC names, before PJSIP answers them.

A connection address must also be a numeric address of the media transport's family. PJSIP turns
a ``c=`` (or ``a=rtcp``) host name into an address with a blocking ``gethostbyname`` on the SIP
thread when the call is answered (``pj_sockaddr_in_set_str_addr``): a caller naming a host under a
slow name server would stall every call of the worker for the resolver's timeout. An address of the
other family (``IN IP6`` on an IPv4 media transport) cannot be reached, and PJSIP would answer 500
after creating the call. Both are refused 488 (RFC 3264 section 6: an offer that cannot be answered
is rejected; RFC 3261 section 21.4.26).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# PJ_MAX_HOSTNAME: pjlib asserts that a host string it converts is shorter than this.
MAX_ADDRESS = 254


@dataclass(frozen=True, slots=True)
class BadOffer:
    status: int
    reason: str  # a metric label: short and fixed


# RFC 3261 section 7.3.1: only headers defined as comma-separated lists may appear more than
# once; these are single-valued (compact forms mapped, section 7.3.3).
SINGLE_VALUED = {
    "call-id": "call-id",
    "i": "call-id",
    "cseq": "cseq",
    "from": "from",
    "f": "from",
    "to": "to",
    "t": "to",
    "max-forwards": "max-forwards",
    "content-length": "content-length",
    "l": "content-length",
    "content-type": "content-type",
    "c": "content-type",
}
# RFC 3261 section 25.1: Request-Line = Method SP Request-URI SP SIP-Version CRLF, one SP each.
# The version is case-insensitive (RFC 3261 section 7.1).
_REQUEST_LINE = re.compile(r"[!-~]+ [!-~]+ SIP/2\.0", re.IGNORECASE)
_SDP_ACCEPTED = {"application/sdp", "application/*", "*/*"}
_SP = " \t"


def check_offer(whole_msg: str, *, media_ipv6: bool = False) -> BadOffer | None:
    """None if PJSIP can take this INVITE, else how to refuse it (status and a metric reason).

    ``whole_msg`` is the request as received (pjsua2's ``rdata.wholeMsg``), bare LF line ends
    tolerated; ``media_ipv6`` names the family of our media transport."""
    head, sep, body = whole_msg.partition("\r\n\r\n")
    if not sep:
        head, sep, body = whole_msg.partition("\n\n")
    bad = _check_request(head.splitlines(), body)
    if bad is not None:
        return bad
    if not body.strip():
        return None  # no offer: PJSIP sends one in the 200 and reads the answer in the ACK
    for raw in body.splitlines():
        line = raw.strip(_SP)
        kind, eq, value = line.partition("=")
        if not eq or kind not in ("c", "o", "a") or (kind == "a" and not value.startswith("rtcp:")):
            continue
        # Fields are split at SP and HTAB only (RFC 4566 section 5): Python's own split would
        # also break at NBSP or NEL, which PJSIP's parser reads as part of a token.
        fields = [f for f in re.split(f"[{_SP}]+", value) if f]
        # PJ_MAX_HOSTNAME counts bytes: "åäö" is 6 of them in UTF-8.
        if any(len(f.encode("utf-8", "surrogateescape")) >= MAX_ADDRESS for f in fields):
            return BadOffer(488, "sdp_address_too_long")
        bad = None
        if kind == "c":
            # c=<nettype> <addrtype> <connection-address> (RFC 4566 section 5.7); o= names an
            # address too, but PJSIP never connects to it.
            bad = _check_address(fields, media_ipv6)
        elif kind == "a" and len(fields) >= 4:
            # a=rtcp:<port> <nettype> <addrtype> <address> (RFC 3605 section 2.1)
            bad = _check_address(fields[1:], media_ipv6)
        if bad is not None:
            return bad
    return None


def _check_address(fields: list[str], media_ipv6: bool) -> BadOffer | None:
    """A connection address PJSIP can use without resolving it or failing on it."""
    if len(fields) != 3:
        return None  # PJSIP's SDP parser refuses the line itself
    nettype, addrtype, address = fields[0].upper(), fields[1].upper(), fields[2].split("/", 1)[0]
    if nettype != "IN" or addrtype != ("IP6" if media_ipv6 else "IP4"):
        return BadOffer(488, "sdp_address_family")
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return BadOffer(488, "sdp_address_not_numeric")
    if parsed.version != (6 if media_ipv6 else 4):
        return BadOffer(488, "sdp_address_family")
    return None


def _check_request(lines: list[str], body: str) -> BadOffer | None:
    """The RFC 4475 refusals PJSIP's parser does not make for an INVITE."""
    if not lines or _REQUEST_LINE.fullmatch(lines[0]) is None:
        return BadOffer(400, "bad_request_line")  # RFC 4475 section 3.1.2.9 (lwsstart)
    seen: dict[str, str] = {}
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            continue  # a folded continuation of the previous header
        name, colon, value = line.partition(":")
        if not colon:
            continue
        canonical = SINGLE_VALUED.get(name.strip().lower())
        if canonical is None:
            continue
        if canonical in seen:
            return BadOffer(400, "duplicate_header")  # RFC 4475 section 3.3.8 (multi01)
        seen[canonical] = value.strip()
    length = seen.get("content-length", "")
    if length.isdigit() and int(length) > len(body.encode("utf-8", "surrogateescape")):
        # RFC 3261 section 18.3: a datagram that ends before its body is an error; for a request
        # the element SHOULD answer 400 (RFC 4475 section 3.1.2.2, clerr). Over a stream PJSIP
        # waits for the rest and never hands the request up.
        return BadOffer(400, "content_length_mismatch")
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon and name.strip().lower() == "accept":
            kinds = {v.split(";")[0].strip().lower() for v in value.split(",")}
            if kinds and not kinds & _SDP_ACCEPTED:
                # RFC 3261 section 21.4.7: the answer would be SDP, which the caller's Accept
                # excludes (RFC 4475 section 3.3.15, sdp01).
                return BadOffer(406, "sdp_not_acceptable")
    return None
