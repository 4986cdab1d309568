"""Whether an INVITE's offer can give a call SRTP, for ``media.srtp = "mandatory"``: sans-IO.

PJSIP's own mandatory mode refuses a plain offer with a bare ``488 Not Acceptable Here``, before
pjsua2 hears of the call (pjsua_call.c: "Error initializing media channel"), so the caller is
not told why, and the refusal passes by admission's set-up rate and counters. So PJSIP is run
in its optional mode (telephony.library.set_srtp) and the rule is kept here, in
``onIncomingCall``: an offer that cannot be answered with SRTP is refused 488 with a Warning
saying so (RFC 3261 section 20.43). What PJSIP then negotiates is checked again when the media
starts (:func:`stream_is_srtp`), so that a re-INVITE cannot take a call back to plain RTP.

What can give SRTP (RFC 3711) here: SDES (RFC 4568), ``a=crypto`` lines on ``RTP/SAVP``, which
hold the keys themselves, so only over TLS (section 8.3: "MUST NOT be sent in the clear").
DTLS-SRTP (RFC 5763/5764: ``UDP/TLS/RTP/SAVP(F)``, ``a=fingerprint``) is refused: the wheel's
PJSIP cannot take baresip's DTLS offer (telephony.library.set_srtp).
"""

from __future__ import annotations

import re

WARNING_AGENT = "voicegate"
# The profile bit of pjmedia_tp_proto (pjmedia/transport.h): PJMEDIA_TP_PROFILE_SRTP.
_PROFILE_SRTP = 0x4000

_MEDIA = re.compile(r"^m=(\w+)\s+\S+\s+(\S+)", re.IGNORECASE)


def srtp_refusal(whole_msg: str, *, over_tls: bool) -> str | None:
    """Why the INVITE ``whole_msg`` cannot have SRTP audio (a short sentence for a Warning
    header), or None if it can. ``over_tls``: the INVITE arrived on our TLS transport."""
    _head, sep, body = whole_msg.partition("\r\n\r\n")
    if not sep:
        _head, sep, body = whole_msg.partition("\n\n")
    if "m=" not in body:
        # RFC 3261 section 13.2.1: the offer may come in our 200 and the answer in the ACK; an
        # answer without keys could not be refused any more, only hung up.
        return "SRTP required: send the SDP offer in the INVITE"
    session_fingerprint = False
    audio: list[tuple[str, list[str]]] = []  # (proto, its attribute lines)
    current: list[str] | None = None
    for raw in body.splitlines():
        line = raw.strip()
        match = _MEDIA.match(line)
        if match:
            current = [] if match.group(1).lower() == "audio" else None
            if current is not None:
                audio.append((match.group(2).upper(), current))
            continue
        if line.lower().startswith("a=fingerprint:") and not audio:
            session_fingerprint = True
        elif current is not None and line.lower().startswith("a="):
            current.append(line.lower())
    if not audio:
        return "SRTP required: the offer has no audio"
    proto, attributes = audio[0]
    if any(a.startswith("a=crypto:") for a in attributes) and not proto.startswith("UDP/TLS/"):
        pass  # SDES, below (a DTLS offer may list keys too; it is refused as DTLS)
    elif (
        proto.startswith("UDP/TLS/")
        or session_fingerprint
        or any(a.startswith("a=fingerprint:") for a in attributes)
    ):
        return "SRTP required: DTLS-SRTP is not taken here; offer SDES (a=crypto) over TLS"
    if any(a.startswith("a=crypto:") for a in attributes):
        if not over_tls:
            return "SRTP required: SDES keys (a=crypto) are taken only over SIP over TLS"
        if "SAVP" not in proto:
            # Opportunistic SRTP (RFC 8643) offers RTP/AVP with keys and accepts plain RTP back:
            # what the stream ends up as could not be held to SRTP.
            return "SRTP required: offer RTP/SAVP (keys on RTP/AVP are opportunistic only)"
        return None
    return "SRTP required: the offer has plain RTP only (no a=crypto or DTLS fingerprint)"


def offers_dtls(whole_msg: str) -> bool:
    """Whether an INVITE offers media over DTLS (``UDP/TLS/...`` or ``TCP/TLS/...``).

    The wheel's PJSIP, with SRTP on, takes such an offer into its SRTP transport, fails it
    (``PJMEDIA_SRTP_ESDPINTRANSPORT``) after the call is created and then crashes the process
    (measured: a segfault in libHandleEvents, or an assertion, whatever the answer). With SRTP
    off the same offer is a clean 488. So such an INVITE is given to an account without SRTP
    before pjsua sees it (telephony.calls.SipLibrary.onSelectAccount).
    """
    if not whole_msg.startswith("INVITE "):
        return False
    _head, _sep, body = whole_msg.partition("\r\n\r\n")
    for raw in body.splitlines():
        match = _MEDIA.match(raw.strip())
        if match and match.group(2).upper().startswith(("UDP/TLS/", "TCP/TLS/")):
            return True
    return False


def warning_header(text: str) -> str:
    """A Warning header value (RFC 3261 section 20.43: 399 is miscellaneous) for ``text``."""
    return f'399 {WARNING_AGENT} "{text.replace(chr(34), chr(39))}"'


def stream_is_srtp(proto: int) -> bool:
    """Whether a started stream (pjsua2 ``StreamInfo.proto``) is SRTP (RTP/SAVP, RTP/SAVPF,
    UDP/TLS/RTP/SAVP(F))."""
    return bool(proto & _PROFILE_SRTP)
