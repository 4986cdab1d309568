"""telephony/strict_source.py on real sockets: the kernel filter lets the caller's source
through, drops and counts everyone else's, follows a re-INVITE, and comes off at the end."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from telephony.strict_source import StrictSource, split_address


def _udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    return sock


def _received(sock: socket.socket) -> list[bytes]:
    got = []
    try:
        while True:
            got.append(sock.recv(2048))
    except TimeoutError:
        return got


@pytest.fixture
def media() -> Iterator[tuple[socket.socket, socket.socket]]:
    rtp, rtcp = _udp(), _udp()  # a call's RTP and RTCP sockets, as PJMEDIA's
    yield rtp, rtcp
    rtp.close()
    rtcp.close()


def _name(sock: socket.socket) -> str:
    host, port = sock.getsockname()
    return f"{host}:{port}"


def test_the_caller_gets_through_and_a_stranger_is_dropped_and_counted(
    media: tuple[socket.socket, socket.socket],
) -> None:
    rtp, rtcp = media
    caller, stranger = _udp(), _udp()
    strict = StrictSource("call-1", _name(rtp), _name(rtcp))
    assert strict.supported and strict.learning
    assert strict.lock(_name(caller))
    assert not strict.learning
    for n in range(5):
        caller.sendto(b"caller %d" % n, rtp.getsockname())
        stranger.sendto(b"stranger %d" % n, rtp.getsockname())
        stranger.sendto(b"stranger rtcp %d" % n, rtcp.getsockname())
    assert _received(rtp) == [b"caller %d" % n for n in range(5)]
    assert _received(rtcp) == []
    assert strict.foreign_packets() == 10  # from the same address: not RTCP's port
    assert strict.foreign_packets() == 0  # counted once
    stranger.sendto(b"again", rtp.getsockname())
    assert _received(rtp) == []
    assert strict.foreign_packets() == 1
    caller.close()
    stranger.close()


def test_rtcp_is_the_callers_from_its_rtcp_port_or_the_next_one(
    media: tuple[socket.socket, socket.socket],
) -> None:
    rtp, rtcp = media
    caller_rtp, caller_rtcp = _udp(), _udp()
    strict = StrictSource("call-1", _name(rtp), _name(rtcp))
    assert strict.lock(_name(caller_rtp), _name(caller_rtcp))
    caller_rtcp.sendto(b"report", rtcp.getsockname())
    caller_rtp.sendto(b"not from the rtcp port", rtcp.getsockname())
    assert _received(rtcp) == [b"report"]
    caller_rtp.close()
    caller_rtcp.close()


def test_a_reinvite_learns_again_and_the_end_takes_the_filter_off(
    media: tuple[socket.socket, socket.socket],
) -> None:
    rtp, rtcp = media
    old, moved = _udp(), _udp()
    strict = StrictSource("call-1", _name(rtp), _name(rtcp))
    assert strict.lock(_name(old))
    moved.sendto(b"before", rtp.getsockname())
    assert _received(rtp) == []
    strict.relearn()  # the caller's re-INVITE moved its media
    assert strict.learning
    moved.sendto(b"after", rtp.getsockname())
    assert _received(rtp) == [b"after"]
    assert strict.lock(_name(moved))
    old.sendto(b"old", rtp.getsockname())
    assert _received(rtp) == []
    strict.release()  # the call ended: whatever reuses the socket starts unfiltered
    old.sendto(b"next call", rtp.getsockname())
    assert _received(rtp) == [b"next call"]
    old.close()
    moved.close()


def test_what_cannot_be_filtered_says_so() -> None:
    assert split_address("[::1]:4000") is None
    assert split_address("example.com:4000") is None
    assert split_address("127.0.0.1:4000") == ("127.0.0.1", 4000)
    assert not StrictSource("c", "[::1]:4000", "[::1]:4001").supported
    # A port no socket of this process holds: nothing to filter, nothing locked.
    strict = StrictSource("c", "127.0.0.1:1", "127.0.0.1:2")
    assert not strict.lock("127.0.0.1:9")
    assert strict.learning
