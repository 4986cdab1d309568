"""The few facts voicegate reads from raw SIP messages PJSIP has already parsed.

An INVITE before PJSIP hands it a call object, and the requests of our own transactions (the
CSeq of a dialog probe). PJSIP has already parsed and accepted the message when these run, so
they only need to find a field, never to validate one; a field they cannot find gives an empty
string (or None).
"""

from __future__ import annotations

import re

_REQUEST_LINE = re.compile(r"^[A-Z]+\s+(?:sips?:([^@;>\s]*)@|tel:([^;>\s]*))", re.IGNORECASE)
# RFC 3261 7.3.3: "v" is the compact form of Via.
_VIA = re.compile(
    r"^(?:via|v)\s*:\s*SIP\s*/\s*2\.0\s*/\s*([A-Za-z]+)", re.IGNORECASE | re.MULTILINE
)

_TAG = re.compile(r";\s*tag\s*=\s*([^;,\s]+)", re.IGNORECASE)
# RFC 3261 20.16: CSeq has no compact form.
_CSEQ = re.compile(r"^cseq\s*:\s*(\d+)\s+([A-Za-z]+)", re.IGNORECASE | re.MULTILINE)


def request_user(whole_msg: str) -> str:
    """The user part of the Request-URI (the number or name that was dialled)."""
    first_line = whole_msg.split("\r\n", 1)[0].split("\n", 1)[0]
    match = _REQUEST_LINE.match(first_line)
    if match is None:
        return ""
    return match.group(1) if match.group(1) is not None else match.group(2)


_SOURCE_HEADER = re.compile(r"^x-voicegate-source\s*:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


def source_address(src_address: str, whole_msg: str, *, trust_header: bool) -> str:
    """The IP address an INVITE came from: pjsua2's ``rdata.srcAddress`` ("ip:port",
    "[v6]:port"), or, behind our own front door (``trust_header``), the address Kamailio put in
    X-Voicegate-Source. Empty if neither gives one."""
    if trust_header:
        match = _SOURCE_HEADER.search(whole_msg)
        return match.group(1) if match else ""
    host, _, _port = src_address.rpartition(":")
    return host.strip("[]")


_TRANSPORT_HEADER = re.compile(
    r"^x-voicegate-transport\s*:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE
)


def arrived_over_tls(local_contact: str, whole_msg: str, *, trust_header: bool) -> bool:
    """Whether an INVITE came over SIP over TLS. Alone, from the transport it really came on:
    ``local_contact``, the Contact PJSIP made from it (a Via saying TLS is the sender's word
    only). Behind our own front door (``trust_header``), which terminates TLS and relays over
    loopback UDP: from the X-Voicegate-Transport it sets, having removed any the caller sent."""
    if trust_header:
        match = _TRANSPORT_HEADER.search(whole_msg)
        return match is not None and match.group(1).lower() == "tls"
    return "transport=tls" in local_contact.lower() or local_contact.startswith("sips:")


def via_transport(whole_msg: str) -> str:
    """The transport of the top Via header, lower-cased (``udp``, ``tcp``, ...)."""
    match = _VIA.search(whole_msg)
    return match.group(1).lower() if match else ""


def mask_uri(uri: str, keep: int = 3) -> str:
    """A caller as it may appear in logs and the session log: every digit of the display name and
    of the number (a SIP URI's user part, a ``tel:`` number) masked but the last ``keep``.

    STYLE.md habit 10: phone numbers in logs are masked except the last digits. A display name is
    often the number itself (``"+15551234567" <sip:+15551234567@host>``), and a ``tel:`` URI has no
    ``@``: both are masked too. Hosts and ports are left as they are.
    """
    display, bracket, address = uri.rpartition("<")
    if not bracket:
        display, address = "", uri
    address = re.sub(
        r"((?:sips?):)([^@;>]*)@",
        lambda m: m.group(1) + _mask_digits(m.group(2), keep) + "@",
        address,
        count=1,
    )
    address = re.sub(
        r"(tel:)([^;>]*)", lambda m: m.group(1) + _mask_digits(m.group(2), keep), address, count=1
    )
    return _mask_digits(display, keep) + bracket + address


_ANY_USER = re.compile(r"((?:sips?|tel):)([^@;>\s]*)")
_DISPLAY = re.compile(r'"([^"]*)"\s*<')
# An unquoted display name (RFC 3261 section 25.1: *(token LWS)) before the URI of a From, To or
# Contact header line (long or compact form), as a parser error may quote the whole message.
_TOKEN_DISPLAY = re.compile(r"(?im)^((?:from|to|contact|[ftm])[ \t]*:[ \t]*)([^<\r\n\"]+)(<)")


_RESUME_HANDLE = re.compile(r"vgr1\.[0-9a-f]{16}\.[A-Za-z0-9_-]{43}")
# The same, hex-encoded as User-to-User data would carry it ("vgr1." is 76 67 72 31 2e in hex).
_RESUME_HANDLE_HEX = re.compile(r"(?i)766772312e(?:[0-9a-f]{2})+")


# SRTP master keys and salts (base64): in an SDES offer or answer ("a=crypto:1
# AES_CM_128_HMAC_SHA1_80 inline:KEY|2^20|1:4", RFC 4568 section 6.1) and in pjmedia's
# transport_srtp.c lines at level 5 ("TX: AES_CM_128_HMAC_SHA1_80 key=KEY"). Whoever holds one
# decrypts the call's media. What follows the key (|lifetime|MKI) is not secret.
_SRTP_INLINE = re.compile(r"(?i)(inline:)[A-Za-z0-9+/=]+")
_SRTP_KEY = re.compile(r"(?i)(\bkey=)[A-Za-z0-9+/]{16,}={0,2}")


def mask_text(text: str, keep: int = 3) -> str:
    """``text`` with every SIP/tel URI's user part and every quoted display name masked as
    :func:`mask_uri` does, and every resume handle and SRTP key replaced: for text that may
    quote whole SIP messages (PJSIP's own log lines; a REFER carries X-Voicegate-Resume, an SDES
    offer its media keys)."""
    text = _SRTP_INLINE.sub(r"\1<redacted>", text)
    text = _SRTP_KEY.sub(r"\1<redacted>", text)
    text = _RESUME_HANDLE.sub("vgr1.<redacted>", text)
    text = _RESUME_HANDLE_HEX.sub("<redacted>", text)
    text = _ANY_USER.sub(lambda m: m.group(1) + _mask_digits(m.group(2), keep), text)
    text = _TOKEN_DISPLAY.sub(
        lambda m: m.group(1) + _mask_digits(m.group(2), keep) + m.group(3), text
    )
    return _DISPLAY.sub(lambda m: '"' + _mask_digits(m.group(1), keep) + '" <', text)


def mask_number(number: str, keep: int = 3) -> str:
    """A bare number (a Request-URI's user part, ``+15550100``) masked as :func:`mask_uri` masks
    one inside a URI: every digit but the last ``keep``."""
    return _mask_digits(number, keep)


def _mask_digits(text: str, keep: int) -> str:
    digits = [i for i, ch in enumerate(text) if ch.isdigit()]
    hidden = set(digits[:-keep] if keep else digits)
    return "".join("*" if i in hidden else ch for i, ch in enumerate(text))


def header_tag(whole_msg: str, name: str) -> str | None:
    """The ``tag`` parameter of the ``From`` or ``To`` header (compact forms ``f``/``t`` too)."""
    compact = {"from": "f", "to": "t"}[name.lower()]
    head = whole_msg.split("\r\n\r\n", 1)[0]
    for line in head.splitlines()[1:]:
        field, sep, value = line.partition(":")
        if not sep or field.strip().lower() not in (name.lower(), compact):
            continue
        # In name-addr form a ";tag" inside <...> belongs to the URI, not to the header.
        params = value.rpartition(">")[2] if "<" in value else value
        match = _TAG.search(params)
        return match.group(1) if match else None
    return None


def cseq(whole_msg: str) -> tuple[int, str] | None:
    """The CSeq number and method of a request or response, or None if it has none."""
    match = _CSEQ.search(whole_msg)
    return (int(match.group(1)), match.group(2).upper()) if match else None
