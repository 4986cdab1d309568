"""The context a call centre sends on an INVITE it transfers to us: ``User-to-User`` and ``X-``
headers, read from the raw INVITE before a session exists.

A call transferred in (from a call centre, or from another voicegate) carries its reference in
these headers: RFC 7433's ``User-to-User`` and free ``X-`` headers such as ``X-Voicegate-Session``.
The new session records them in its metadata, so an operator or the agent sees where the caller
came from. They come from a stranger, so they are bounded and validated here: a header that breaks
a rule is left out and named, with the rule, in :attr:`InboundContext.dropped`; nothing of it is
kept. Resume handles are never recorded (ARCHITECTURE.md, "Resume handles": a handle is a secret).

PJSIP has parsed and accepted the message when this runs; these rules are ours, not the grammar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from telephony.sip_message import mask_text
from telephony.transfer import UUI_HEADER

MAX_HEADERS = 16
"""At most this many context headers are kept; the rest are dropped as ``too many headers``."""
MAX_VALUE_CHARS = 256
"""A longer value (several occurrences joined) is dropped, never cut: half a reference is wrong."""
MAX_NAME_CHARS = 64

RESUME_HEADER = "X-Voicegate-Resume"
# Our own front door's header (the caller's source address, voicegate/pool/kamailio_config.py):
# on every INVITE through a pool, and no context of the caller's.
SOURCE_HEADER = "X-Voicegate-Source"
# And whether it came over TLS (telephony.sip_message.arrived_over_tls).
TRANSPORT_HEADER = "X-Voicegate-Transport"
# A resume handle's prefix (session/resume.py), as it would appear in decoded User-to-User data.
_HANDLE_PREFIX = b"vgr1."

# RFC 3261 section 25.1: a header name is a token. We keep X- names made of letters, digits and
# '-' only (what call-centre platforms send), so a name is safe as a JSON key and in a log line.
_X_NAME = re.compile(r"^X-[A-Za-z0-9][A-Za-z0-9-]*$", re.IGNORECASE)
# Printable ASCII and spaces only: no control characters, no bytes a log or a page would mangle.
_VALUE = re.compile(r"^[\x20-\x7e]*$")
# RFC 7433 section 4.1: uui-data, then parameters; ours and most centres' use hex.
_UUI = re.compile(r"^[0-9A-Fa-f]+(?:\s*;\s*[A-Za-z0-9-]+\s*=\s*[A-Za-z0-9.-]+)*$")
_UUI_HEX_DECLARED = re.compile(r";\s*encoding\s*=\s*hex\b", re.IGNORECASE)
# A value that is nothing but a phone number (+, digits and separators): masked like a caller
# (STYLE.md habit 10), as its last digits.
_PHONE = re.compile(r"^\+?[\d\s().-]{7,}$")
# A header field line: a token name, a colon, the value (RFC 3261 section 7.3.1).
_HEADER_LINE = re.compile(r"^([!-9;-~]+)\s*:(.*)$")


# A handle as it may appear (session/resume.py's shape), inside a header value or decoded UUI.
_HANDLE_TEXT = re.compile(rb"vgr1\.[0-9a-f]{16}\.[A-Za-z0-9_-]{43}")


@dataclass(frozen=True, slots=True)
class PresentedHandle:
    """A resume handle an INVITE carried, for the rejoin to verify (voicegate/call/rejoin.py).
    ``via``: ``header`` (X-Voicegate-Resume) or ``uui`` (hex User-to-User). ``text`` is a
    secret: never logged, and left out of the repr."""

    text: str
    via: str

    def __repr__(self) -> str:
        return f"PresentedHandle(via={self.via!r})"


def presented_handle(whole_msg: str) -> PresentedHandle | None:
    """The resume handle an INVITE presents, if any: ``X-Voicegate-Resume`` first (its value as
    sent, whatever its shape: a malformed one is refused as invalid, not ignored), else the
    first handle inside hex User-to-User data (a centre may hand it back there)."""
    uui: PresentedHandle | None = None
    for name, value in _header_lines(whole_msg):
        key = name.lower()
        if key == RESUME_HEADER.lower():
            return PresentedHandle(value.strip()[:MAX_VALUE_CHARS], "header")
        if key == UUI_HEADER.lower() and uui is None:
            found = _handle_in_uui(value)
            if found is not None:
                uui = PresentedHandle(found, "uui")
    return uui


def _handle_in_uui(uui: str) -> str | None:
    for part in uui.split(","):
        data = part.split(";", 1)[0].strip()
        try:
            decoded = bytes.fromhex(data if len(data) % 2 == 0 else "0" + data)
        except ValueError:
            continue
        match = _HANDLE_TEXT.search(decoded)
        if match is not None:
            return match.group(0).decode("ascii")
        if _HANDLE_PREFIX in decoded.lower():
            return "vgr1.malformed"  # a handle's prefix without a handle's shape: invalid
    return None


@dataclass(frozen=True, slots=True)
class InboundContext:
    """``headers``: the kept headers by canonical name (the first spelling seen), values as sent
    with several occurrences joined by ", " (RFC 3261 section 7.3.1). ``dropped``: header name ->
    the rule it broke."""

    headers: dict[str, str] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)

    def as_meta(self) -> dict[str, object]:
        """What the session's metadata records (empty when the INVITE carried no context)."""
        meta: dict[str, object] = {}
        if self.headers:
            meta["context"] = dict(self.headers)
        if self.dropped:
            meta["context_dropped"] = dict(self.dropped)
        return meta


def read_context(whole_msg: str) -> InboundContext:
    """The context headers of an INVITE (``whole_msg`` as PJSIP received it)."""
    values: dict[str, list[str]] = {}
    spelling: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for name, value in _header_lines(whole_msg):
        key = name.lower()
        if key != UUI_HEADER.lower() and not key.startswith("x-"):
            continue
        if key == RESUME_HEADER.lower():
            dropped[RESUME_HEADER] = "a resume handle is never recorded"
            continue
        if key in (SOURCE_HEADER.lower(), TRANSPORT_HEADER.lower()):
            continue
        if len(name) > MAX_NAME_CHARS or (key.startswith("x-") and not _X_NAME.match(name)):
            dropped[_printable(name)[:MAX_NAME_CHARS]] = "not a header name we keep"
            continue
        spelling.setdefault(key, name)
        values.setdefault(key, []).append(value)
    headers: dict[str, str] = {}
    for key, parts in values.items():
        name = spelling[key]
        value = ", ".join(parts)
        why = _refusal(key, value)
        if why is None and len(headers) >= MAX_HEADERS:
            why = "too many headers"
        if why is not None:
            dropped[name] = why
            continue
        headers[name] = _masked(key, value)
    return InboundContext(headers, dropped)


def _refusal(key: str, value: str) -> str | None:
    if len(value) > MAX_VALUE_CHARS:
        return f"longer than {MAX_VALUE_CHARS} characters"
    if not _VALUE.match(value):
        return "not printable ASCII"
    if key == UUI_HEADER.lower():
        if not (_UUI.match(value) and _UUI_HEX_DECLARED.search(value)):
            return "not hex User-to-User data with ;encoding=hex (RFC 7433 section 4.1)"
        if _carries_handle(value):
            return "a resume handle is never recorded"
    return None


def _carries_handle(uui: str) -> bool:
    """Whether hex User-to-User data (each occurrence) decodes to text holding a resume handle:
    a centre may hand one back in UUI instead of X-Voicegate-Resume."""
    for part in uui.split(","):
        data = part.split(";", 1)[0].strip()
        try:
            decoded = bytes.fromhex(data if len(data) % 2 == 0 else "0" + data)
        except ValueError:
            continue
        if _HANDLE_PREFIX in decoded.lower():
            return True
    return False


def _masked(key: str, value: str) -> str:
    if key == UUI_HEADER.lower():
        return value  # hex, checked above: a reference, never a number to mask
    if _PHONE.match(value):
        digits = [i for i, ch in enumerate(value) if ch.isdigit()]
        hidden = set(digits[:-3])
        return "".join("*" if i in hidden else ch for i, ch in enumerate(value))
    return mask_text(value)


def _printable(text: str) -> str:
    return "".join(ch if " " < ch <= "~" else "?" for ch in text)


def _header_lines(whole_msg: str) -> list[tuple[str, str]]:
    """The header fields of the message head, continuation lines unfolded (RFC 3261 7.3.1)."""
    head = whole_msg.replace("\r\n", "\n").split("\n\n", 1)[0]
    lines = head.split("\n")[1:]
    unfolded: list[str] = []
    for line in lines:
        if line[:1] in (" ", "\t") and unfolded:
            unfolded[-1] += " " + line.strip()
        else:
            unfolded.append(line)
    fields = []
    for line in unfolded:
        match = _HEADER_LINE.match(line)
        if match is not None:
            fields.append((match.group(1), match.group(2).strip()))
    return fields
