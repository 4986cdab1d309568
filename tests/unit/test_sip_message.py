from __future__ import annotations

import pytest

from telephony.sip_message import (
    cseq,
    header_tag,
    mask_number,
    mask_text,
    mask_uri,
    request_user,
    via_transport,
)
from voicegate.call.legs import new_leg_offer

INVITE = (
    "INVITE sip:+4930123456@voicegate.example:5060;transport=tcp SIP/2.0\r\n"
    "v: SIP/2.0/TCP 10.0.0.1:5070;branch=z9hG4bK1\r\n"
    "Via: SIP/2.0/UDP 10.0.0.2;branch=z9hG4bK2\r\n\r\n"
)


def test_request_user_and_top_via_transport() -> None:
    assert request_user(INVITE) == "+4930123456"
    assert via_transport(INVITE) == "tcp"


def test_missing_fields_give_empty_strings() -> None:
    assert request_user("garbage") == ""
    assert via_transport("INVITE sip:x@y SIP/2.0\r\n\r\n") == ""
    assert request_user("INVITE sip:host.example SIP/2.0\r\n") == ""


def test_mask_keeps_only_the_last_three_digits() -> None:
    assert (
        mask_uri('"Bob" <sip:+4930123456@carrier.example>')
        == '"Bob" <sip:+*******456@carrier.example>'
    )
    assert mask_uri("sip:alice@example.org") == "sip:alice@example.org"
    assert mask_uri("<sip:12@x>") == "<sip:12@x>"


def test_mask_covers_a_numeric_display_name_and_tel_uris_but_not_hosts() -> None:
    assert (
        mask_uri('"+15551234567" <sip:+15551234567@10.0.0.1:5060>')
        == '"+********567" <sip:+********567@10.0.0.1:5060>'
    )
    assert mask_uri("tel:+15551234567") == "tel:+********567"
    assert (
        mask_uri("<tel:+1-555-123-4567;phone-context=example.com>")
        == "<tel:+*-***-***-*567;phone-context=example.com>"
    )
    assert mask_uri("sip:10.0.0.1:5060") == "sip:10.0.0.1:5060"


def test_cseq_of_a_request_and_of_a_response() -> None:
    options = (
        "OPTIONS sip:a@b SIP/2.0\r\n"
        "Via: SIP/2.0/UDP h;branch=z9hG4bK3\r\n"
        "CSeq: 26877 OPTIONS\r\n\r\n"
    )
    assert cseq(options) == (26877, "OPTIONS")
    assert cseq("SIP/2.0 481 Call/Transaction Does Not Exist\r\ncseq:7 bye\r\n\r\n") == (7, "BYE")
    assert cseq("OPTIONS sip:a@b SIP/2.0\r\n\r\n") is None
    assert cseq("") is None


@pytest.mark.parametrize(
    ("message", "name", "tag"),
    [
        ("INVITE sip:a@b SIP/2.0\r\nFrom: <sip:x@y>;tag=abc\r\n\r\n", "From", "abc"),
        ("SIP/2.0 200 OK\r\nt: <sip:x@y> ; TAG = z9 ;other\r\n\r\n", "To", "z9"),
        ("SIP/2.0 200 OK\r\nTo: sip:x@y;tag=plain\r\n\r\n", "To", "plain"),
        # A tag inside <...> is a URI parameter, not the header's tag.
        ("SIP/2.0 200 OK\r\nTo: <sip:x@y;tag=uri>\r\n\r\n", "To", None),
        ("SIP/2.0 200 OK\r\nFrom: <sip:x@y>;tag=f\r\n\r\nTo: <a>;tag=body\r\n", "To", None),
    ],
)
def test_header_tag(message: str, name: str, tag: str | None) -> None:
    assert header_tag(message, name) == tag


def test_pjsip_log_text_has_callers_masked() -> None:
    line = (
        'From: "+15551230199" <sip:+15551230199@10.0.0.1:5060>;tag=1\r\n'
        "Contact: <sip:5551230199@10.0.0.1>\r\nP-Asserted-Identity: <tel:+15551230199>"
    )
    masked = mask_text(line)
    assert "5551230" not in masked
    assert masked.count("199") == 4  # the last three digits stay, as mask_uri keeps them
    assert "10.0.0.1:5060" in masked  # hosts and ports are left alone


def test_a_resume_handle_is_redacted_from_pjsip_text_in_clear_and_hex_encoded() -> None:
    handle = "vgr1.0123456789abcdef." + "b" * 43
    uui = handle.encode().hex().upper()
    line = f"X-Voicegate-Resume: {handle}\r\nUser-to-User: {uui};encoding=hex"
    masked = mask_text(line)
    assert handle not in masked and handle.encode().hex() not in masked.lower()
    assert "User-to-User: <redacted>;encoding=hex" in masked


def test_an_outbound_legs_number_called_is_masked_like_a_caller() -> None:
    assert mask_number("+15550100") == "+*****100" and mask_number("100") == "100"
    offer = new_leg_offer("sip:+15550100@127.0.0.1:5090")
    assert offer.called_user == "+*****100"
    assert offer.remote_uri == "sip:+15550100@127.0.0.1:5090"  # what the leg dials


def test_an_unquoted_display_name_is_masked_too() -> None:
    # Kamailio's parser quotes whole malformed messages; a display name may be a bare number.
    text = "To: Receiver <sip:s@h>\nFrom: 15550100 <sip:p@h>;tag=1\r\nm: 15550100 <sip:p@h:5>"
    masked = mask_text(text)
    assert "15550100" not in masked
    assert "From: *****100 <sip:p@h>;tag=1" in masked and "To: Receiver <sip:s@h>" in masked
