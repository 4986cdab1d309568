"""telephony/srtp_offer.py and admission with it: which offers can have SRTP when
media.srtp = "mandatory", the 488 with a Warning saying why, and a tenant that requires TLS."""

from __future__ import annotations

import pytest

from telephony.admission import Admission
from telephony.srtp_offer import offers_dtls, srtp_refusal, stream_is_srtp, warning_header

HEAD = "INVITE sip:100@127.0.0.1 SIP/2.0\r\nContent-Type: application/sdp\r\n\r\n"
SDP = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
CRYPTO = "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNk\r\n"
FINGERPRINT = "a=fingerprint:sha-256 AB:CD:EF\r\n"


def offer(media: str, *attributes: str, session: str = "") -> str:
    return HEAD + SDP + session + f"m=audio 4000 {media} 8\r\n" + "".join(attributes)


@pytest.mark.parametrize(
    ("msg", "over_tls", "refused_with"),
    [
        (offer("RTP/SAVP", CRYPTO), True, None),
        (offer("RTP/SAVP", CRYPTO), False, "only over SIP over TLS"),
        (offer("RTP/AVP", CRYPTO), True, "offer RTP/SAVP"),
        (offer("RTP/AVP"), True, "plain RTP only"),
        (offer("UDP/TLS/RTP/SAVP", FINGERPRINT), True, "DTLS-SRTP is not taken"),
        (offer("RTP/SAVP", FINGERPRINT), True, "DTLS-SRTP is not taken"),
        (offer("RTP/AVP", session=FINGERPRINT), True, "DTLS-SRTP is not taken"),
        (offer("RTP/SAVP", CRYPTO, FINGERPRINT), True, None),
        (HEAD, True, "send the SDP offer in the INVITE"),
        (HEAD + SDP + "m=video 4000 RTP/SAVP 96\r\n" + CRYPTO, True, "no audio"),
    ],
)
def test_which_offers_can_have_srtp(msg: str, over_tls: bool, refused_with: str | None) -> None:
    why = srtp_refusal(msg, over_tls=over_tls)
    if refused_with is None:
        assert why is None
    else:
        assert why is not None and refused_with in why and why.startswith("SRTP required")


def test_the_warning_is_rfc_3261_code_399_with_quotes_kept_out() -> None:
    assert warning_header('SRTP "now"') == "399 voicegate \"SRTP 'now'\""


def test_a_stream_is_srtp_by_its_profile() -> None:
    # pjmedia_tp_proto values of the wheel (PJMEDIA_TP_PROTO_*).
    assert stream_is_srtp(49156) and stream_is_srtp(57348) and stream_is_srtp(49164)
    assert not stream_is_srtp(32772) and not stream_is_srtp(40964)


def test_a_plain_offer_is_488_with_the_reason_as_warning() -> None:
    adm = Admission(max_calls=4, rate=50)
    why = srtp_refusal(offer("RTP/AVP"), over_tls=False)
    d = adm.decide(live_calls=0, called_user="100", now=0.0, srtp_refusal=why)
    assert (d.status, d.reason, d.warning) == (488, "srtp_required", why)


def test_a_tenant_that_requires_tls_refuses_its_calls_over_udp_with_403() -> None:
    route = {"100": "acme", "200": "other"}.get
    adm = Admission(
        max_calls=4, rate=50, route=lambda user, _src: route(user), tls_tenants=frozenset({"acme"})
    )
    refused = adm.decide(live_calls=0, called_user="100", now=0.0, over_tls=False)
    assert (refused.status, refused.reason, refused.tenant) == (403, "tls_required", "acme")
    assert "TLS" in refused.warning
    assert adm.decide(live_calls=0, called_user="100", now=1.0, over_tls=True).status is None
    assert adm.decide(live_calls=0, called_user="200", now=2.0, over_tls=False).status is None


def test_dtls_offers_are_told_from_the_rest() -> None:
    def invite(proto: str) -> str:
        return (
            "INVITE sip:a@b SIP/2.0\r\nContent-Type: application/sdp\r\n\r\n"
            f"v=0\r\nm=audio 4000 {proto} 8\r\na=rtpmap:8 PCMA/8000\r\n"
        )

    assert offers_dtls(invite("UDP/TLS/RTP/SAVPF"))
    assert offers_dtls(invite("udp/tls/rtp/savp"))
    assert offers_dtls(invite("TCP/TLS/RTP/SAVP"))
    for proto in ("RTP/AVP", "RTP/SAVP", "RTP/SAVPF", "RTP/AVPF"):
        assert not offers_dtls(invite(proto)), proto
    assert not offers_dtls("OPTIONS sip:a@b SIP/2.0\r\n\r\nm=audio 4000 UDP/TLS/RTP/SAVPF 8")
    assert not offers_dtls("INVITE sip:a@b SIP/2.0\r\nContent-Length: 0\r\n\r\n")
