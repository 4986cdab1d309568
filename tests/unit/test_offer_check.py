"""Offers PJSIP would abort on are recognised before anything is answered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from telephony.offer_check import MAX_ADDRESS, BadOffer, check_offer

HEAD = (
    "INVITE sip:service@127.0.0.1 SIP/2.0\r\nCall-ID: x\r\nContent-Type: application/sdp\r\n\r\n"
)


def _sdp(connection: str = "127.0.0.1", origin: str = "127.0.0.1", extra: str = "") -> str:
    return (
        f"v=0\r\no=- 1 1 IN IP4 {origin}\r\ns=-\r\nc=IN IP4 {connection}\r\nt=0 0\r\n"
        f"m=audio 9876 RTP/AVP 0\r\n{extra}"
    )


def test_an_ordinary_offer_and_no_offer_pass() -> None:
    assert check_offer(HEAD + _sdp()) is None
    assert check_offer(HEAD) is None
    assert check_offer(HEAD + _sdp(origin="a" * (MAX_ADDRESS - 1))) is None


def test_an_address_pjsip_asserts_on_is_refused_488() -> None:
    long = "%.*s" * 100  # PROTOS sdp-connection-ip: a few hundred characters
    refused = BadOffer(488, "sdp_address_too_long")
    assert check_offer(HEAD + _sdp(connection=long)) == refused
    assert check_offer(HEAD + _sdp(origin="9" * MAX_ADDRESS)) == refused
    assert check_offer(HEAD + _sdp(extra=f"a=rtcp:9877 IN IP4 {'h' * 300}\r\n")) == refused
    # Media-level connection lines too, and bare LF line ends.
    media_level = _sdp() + f"c=IN IP4 {'1' * 260}\r\n"
    assert check_offer((HEAD + media_level).replace("\r\n", "\n")) == refused


def test_malformed_invites_pjsip_would_answer_are_refused_as_rfc_4475_says() -> None:
    sdp = _sdp()
    # lwsstart (3.1.2.9): more than one SP between Request-Line elements.
    spaced = HEAD.replace("INVITE sip:", "INVITE  sip:", 1) + sdp
    assert check_offer(spaced) == BadOffer(400, "bad_request_line")
    # multi01 (3.3.8): a single-valued header twice, in long or compact form.
    doubled = HEAD.replace("Call-ID: x\r\n", "Call-ID: x\r\ni: y\r\n") + sdp
    assert check_offer(doubled) == BadOffer(400, "duplicate_header")
    # clerr (3.1.2.2): a datagram shorter than its Content-Length.
    short = HEAD.replace("\r\n\r\n", f"\r\nContent-Length: {len(sdp) + 100}\r\n\r\n") + sdp
    assert check_offer(short) == BadOffer(400, "content_length_mismatch")
    exact = HEAD.replace("\r\n\r\n", f"\r\nContent-Length: {len(sdp)}\r\n\r\n") + sdp
    assert check_offer(exact) is None
    # sdp01 (3.3.15): an Accept that excludes the SDP answer.
    picky = HEAD.replace("\r\n\r\n", "\r\nAccept: text/nobodyKnowsThis\r\n\r\n") + sdp
    assert check_offer(picky) == BadOffer(406, "sdp_not_acceptable")
    usual = HEAD.replace("\r\n\r\n", "\r\nAccept: application/sdp, application/dtmf\r\n\r\n")
    assert check_offer(usual + sdp) is None
    # A folded header line is a continuation, not a second header.
    folded = HEAD.replace("Call-ID: x\r\n", "Call-ID: x\r\n y\r\n") + sdp
    assert check_offer(folded) is None


def test_a_connection_address_must_be_numeric_and_of_the_media_family() -> None:
    # A host name would be resolved with a blocking gethostbyname on the SIP thread.
    by_name = BadOffer(488, "sdp_address_not_numeric")
    assert check_offer(HEAD + _sdp(connection="media.example.com")) == by_name
    assert check_offer(HEAD + _sdp(connection="1.2.3")) == by_name
    assert check_offer(HEAD + _sdp(extra="a=rtcp:9877 IN IP4 rtcp.example.com\r\n")) == by_name
    # Multicast with a TTL, the hold address and a plain rtcp port are fine; o= is never used.
    assert check_offer(HEAD + _sdp(connection="224.2.1.1/127")) is None
    assert check_offer(HEAD + _sdp(connection="0.0.0.0")) is None
    assert check_offer(HEAD + _sdp(extra="a=rtcp:9877\r\n")) is None
    assert check_offer(HEAD + _sdp(origin="host.example.com")) is None
    # The other family cannot be reached from our media transport (PJSIP answered 500).
    family = BadOffer(488, "sdp_address_family")
    ipv6 = _sdp().replace("c=IN IP4 127.0.0.1", "c=IN IP6 ::1")
    assert check_offer(HEAD + ipv6) == family
    assert check_offer(HEAD + _sdp(connection="::1")) == family
    assert check_offer(HEAD + ipv6, media_ipv6=True) is None
    assert check_offer(HEAD + _sdp(), media_ipv6=True) == family


@given(st.text(alphabet=st.characters(codec="latin-1"), max_size=300))
def test_any_connection_line_is_taken_or_refused_488_never_raises(address: str) -> None:
    bad = check_offer(HEAD + _sdp(connection=address.replace("\r", "").replace("\n", "")))
    assert bad is None or bad.status == 488
