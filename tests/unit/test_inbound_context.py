from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from telephony.inbound_context import (
    MAX_HEADERS,
    MAX_VALUE_CHARS,
    PresentedHandle,
    presented_handle,
    read_context,
)


def _invite(*headers: str) -> str:
    head = [
        "INVITE sip:service@voicegate.example SIP/2.0",
        "Via: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bK1",
        "From: <sip:centre@cc.example>;tag=1",
        "To: <sip:service@voicegate.example>",
        *headers,
        "Content-Type: application/sdp",
    ]
    return "\r\n".join(head) + "\r\n\r\nv=0\r\nX-Not-A-Header: in the body\r\n"


def test_a_call_centres_uui_and_x_headers_are_kept_and_nothing_else() -> None:
    ctx = read_context(
        _invite(
            "User-to-User: 3031323334;encoding=hex;purpose=isdn-uui",
            "X-Genesys-Interaction: 00AB-12",
            "x-queue: billing",
            "X-Queue: priority",
            "Subject: not context",
        )
    )
    assert ctx.headers == {
        "User-to-User": "3031323334;encoding=hex;purpose=isdn-uui",
        "X-Genesys-Interaction": "00AB-12",
        "x-queue": "billing, priority",  # RFC 3261 7.3.1: occurrences joined, first spelling
    }
    assert ctx.dropped == {}
    assert ctx.as_meta() == {"context": ctx.headers}


def test_no_context_records_nothing() -> None:
    assert read_context(_invite()).as_meta() == {}


def test_folded_lines_are_unfolded() -> None:
    ctx = read_context(_invite("X-Note: first", "  second"))
    assert ctx.headers == {"X-Note": "first second"}


def test_headers_that_break_a_rule_are_named_and_not_kept() -> None:
    ctx = read_context(
        _invite(
            "User-to-User: not hex at all",
            "X-Long: " + "a" * (MAX_VALUE_CHARS + 1),
            "X-Bad_Name: v",
            "X-Voicegate-Resume: secret-handle-value",
            "X-Ctl: a\x7fb",
        )
    )
    assert ctx.headers == {}
    assert ctx.dropped == {
        "User-to-User": "not hex User-to-User data with ;encoding=hex (RFC 7433 section 4.1)",
        "X-Long": f"longer than {MAX_VALUE_CHARS} characters",
        "X-Bad_Name": "not a header name we keep",
        "X-Voicegate-Resume": "a resume handle is never recorded",
        "X-Ctl": "not printable ASCII",
    }
    assert "secret-handle-value" not in repr(ctx.as_meta())


def test_uui_without_encoding_hex_is_refused() -> None:
    assert read_context(_invite("User-to-User: 3031")).headers == {}


def test_phone_numbers_in_x_headers_are_masked_like_callers() -> None:
    ctx = read_context(
        _invite("X-Caller: +1 (555) 123-4567", "X-Ani-Uri: <sip:+15551234567@carrier>")
    )
    assert ctx.headers == {
        "X-Caller": "+* (***) ***-*567",
        "X-Ani-Uri": "<sip:+********567@carrier>",
    }


def test_at_most_max_headers_are_kept() -> None:
    ctx = read_context(_invite(*(f"X-H{i}: {i}" for i in range(MAX_HEADERS + 3))))
    assert len(ctx.headers) == MAX_HEADERS
    assert list(ctx.dropped.values()) == ["too many headers"] * 3


@given(st.lists(st.tuples(st.text(max_size=80), st.text(max_size=400)), max_size=30))
def test_any_header_lines_give_bounded_printable_context(pairs: list[tuple[str, str]]) -> None:
    lines = [f"X-{name}: {value}" for name, value in pairs if "\n" not in name + value]
    ctx = read_context(_invite(*(line.replace("\r", "") for line in lines)))
    assert len(ctx.headers) <= MAX_HEADERS
    for name, value in ctx.headers.items():
        assert name.startswith(("X-", "x-")) and len(name) <= 64
        assert len(value) <= MAX_VALUE_CHARS and value.isprintable() and value.isascii()
    assert set(ctx.headers).isdisjoint(ctx.dropped)


def test_a_resume_handle_in_user_to_user_is_never_recorded() -> None:
    # A centre that hands the caller back with the handle hex-encoded in UUI instead of
    # X-Voicegate-Resume: the handle is a secret, the header is dropped whole.
    handle = "vgr1.0123456789abcdef." + "A" * 43
    ctx = read_context(_invite(f"User-to-User: {handle.encode().hex()};encoding=hex"))
    assert ctx.headers == {}
    assert ctx.dropped == {"User-to-User": "a resume handle is never recorded"}
    assert handle.encode().hex() not in str(ctx.as_meta())


def test_the_front_doors_source_header_is_not_the_callers_context() -> None:
    # Kamailio adds X-Voicegate-Source to every INVITE it relays: it is not a transfer context.
    ctx = read_context(_invite("X-Voicegate-Source: 203.0.113.7"))
    assert ctx.as_meta() == {}
    # Nor the transport it adds for a call over TLS.
    assert read_context(_invite("X-Voicegate-Transport: tls")).as_meta() == {}


def test_the_handle_an_invite_presents_is_read_from_the_header_first_then_uui() -> None:
    handle = "vgr1.0123456789abcdef." + "A" * 43
    other = "vgr1.fedcba9876543210." + "B" * 43
    uui = f"User-to-User: {other.encode().hex()};encoding=hex"
    presented = presented_handle(_invite(uui, f"X-Voicegate-Resume: {handle}"))
    assert presented == PresentedHandle(handle, "header")
    assert presented_handle(_invite(uui)) == PresentedHandle(other, "uui")
    # Around other UUI data, in one of several occurrences.
    wrapped = f"User-to-User: 00ff, {('ref=' + other + ';').encode().hex()};encoding=hex"
    assert presented_handle(_invite(wrapped)) == PresentedHandle(other, "uui")
    assert presented_handle(_invite("User-to-User: 43432D31323334;encoding=hex")) is None
    assert presented_handle(_invite()) is None
    # The handle never shows in a repr (a log of the event, a traceback).
    assert handle not in repr(presented) and "header" in repr(presented)


def test_a_malformed_handle_is_presented_as_is_to_be_refused_as_invalid() -> None:
    assert presented_handle(_invite("X-Voicegate-Resume: not-a-handle")) == PresentedHandle(
        "not-a-handle", "header"
    )
    broken = "User-to-User: " + b"vgr1.short".hex() + ";encoding=hex"
    found = presented_handle(_invite(broken))
    assert found is not None and found.via == "uui" and found.text.startswith("vgr1.")
