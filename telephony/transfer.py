"""Blind transfer on the wire (RFC 3515, RFC 5589 section 6): the Refer-To we send, with the
call-centre context escaped into it, and what an inbound Refer-To names.

Pure functions: the SIP thread (telephony.endpoint) sends what these build. Nothing here decides
whether a transfer may happen; the caller of :func:`refer_to` and the inbound-REFER policy do.
"""

from __future__ import annotations

import re

# RFC 3261 section 25.1: characters a header value inside a SIP URI may carry unescaped
# (unreserved and hnv-unreserved); everything else, ';' and '=' above all, is %-escaped.
_HVALUE_SAFE = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!~*'()[]/?:+$"
)

SESSION_HEADER = "X-Voicegate-Session"
# A resume handle (session/resume.py) the call centre may send the caller back with; its
# characters are all unreserved, so it travels unescaped (and is masked in PJSIP's log).
RESUME_HEADER = "X-Voicegate-Resume"
UUI_HEADER = "User-to-User"


def escape_hvalue(value: str) -> str:
    """``value`` escaped for a header parameter inside a SIP URI (RFC 3261 section 19.1.1)."""
    out = []
    for byte in value.encode("utf-8"):
        char = chr(byte)
        out.append(char if char in _HVALUE_SAFE else f"%{byte:02X}")
    return "".join(out)


def user_to_user(reference: str) -> str:
    """RFC 7433 section 4.1: the payload in hex with ``;encoding=hex``. The payload is a session
    reference only (voicegate's session id), never the caller's data."""
    return f"{reference.encode('ascii').hex().upper()};encoding=hex"


def context_headers(
    session_id: str, resume_handle: str | None = None
) -> tuple[tuple[str, str], ...]:
    """The headers a call centre receives on the INVITE the transfer causes."""
    headers = ((UUI_HEADER, user_to_user(session_id)), (SESSION_HEADER, session_id))
    return (*headers, (RESUME_HEADER, resume_handle)) if resume_handle else headers


def refer_to(target: str, headers: tuple[tuple[str, str], ...]) -> str:
    """The Refer-To value for ``target`` (a bare SIP URI, checked by config.rules.sip_uri) with
    ``headers`` as URI header parameters, which the transferee copies onto its INVITE
    (RFC 3515 section 2.1, RFC 3261 section 19.1.5). Name-addr form: the URI carries '?'."""
    if "?" in target or "<" in target or ">" in target:
        raise ValueError("a transfer target carries no headers or brackets of its own")
    params = "&".join(f"{name}={escape_hvalue(value)}" for name, value in headers)
    return f"<{target}?{params}>" if params else f"<{target}>"


_NAME_ADDR = re.compile(r"<([^>]*)>")


def referred_uri(refer_to_value: str) -> str:
    """The bare URI an inbound Refer-To names: no display name, brackets, URI parameters after
    the host part's ';' are kept, header parameters ('?...') dropped."""
    value = refer_to_value.strip()
    match = _NAME_ADDR.search(value)
    uri = match.group(1) if match else value.split(";", 1)[0]
    return uri.split("?", 1)[0].strip()
