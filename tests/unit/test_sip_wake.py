from __future__ import annotations

import socket

import pytest

from telephony.sip_wake import KEEPALIVE, SipWaker, wake_address


@pytest.mark.parametrize(
    ("bound", "expected"),
    [
        ("0.0.0.0", "127.0.0.1"),
        ("::", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("192.0.2.7", "192.0.2.7"),
        ("::1", "::1"),
    ],
)
def test_a_wildcard_bind_is_woken_on_loopback(bound: str, expected: str) -> None:
    assert wake_address(bound, 5060) == (expected, 5060)


def test_the_waker_sends_a_crlf_keepalive_to_the_transport() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as transport:
        transport.bind(("127.0.0.1", 0))
        transport.settimeout(5)
        waker = SipWaker("127.0.0.1", transport.getsockname()[1])
        try:
            waker.wake()
            data, _ = transport.recvfrom(100)
        finally:
            waker.close()
    assert data == KEEPALIVE == b"\r\n\r\n"
    assert waker.failures == 0


def test_a_failing_send_is_counted_and_logged_once_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waker = SipWaker("127.0.0.1", 9)
    waker.close()
    waker.wake()  # on a closed socket: EBADF
    waker.wake()
    assert waker.failures == 2
    assert caplog.text.count("cannot wake the SIP thread") == 1
