"""Half-open calls: INVITEs answered and never ACKed do not hold the worker's call slots.

A caller that sends INVITE and then goes silent (lost ACK, a crashed phone, or a cheap attack)
used to hold one of a worker's four slots for 32 s or more: four such INVITEs a minute kept a
worker full. Now the SIP thread ends such a call at ``sip.ack_timeout_s`` (telephony/half_open.py):
a BYE at once, and its slot freed though the peer answers nothing, not even the BYE. The silent
callers here are raw UDP sockets.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.integration.harness import LOOPBACK, ServerFactory, Sipp, wait_for

SDP = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio {port} RTP/AVP 8 0 101\r\na=rtpmap:101 telephone-event/8000\r\n"
)


class SilentCaller:
    """Sends one INVITE from its own socket, reads what comes back, and never answers."""

    def __init__(self, target: tuple[str, int], number: int) -> None:
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((LOOPBACK, 0))
        self.port = self.sock.getsockname()[1]
        self.call_id = f"half-open-{number}-{time.monotonic_ns()}"
        self.received: list[bytes] = []

    def invite(self) -> None:
        host, port = self.target
        body = SDP.format(port=self.port + 2)
        message = (
            f"INVITE sip:service@{host}:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {LOOPBACK}:{self.port};branch=z9hG4bK{self.call_id}\r\n"
            "Max-Forwards: 70\r\n"
            f"From: <sip:+15551230{self.port % 1000:03d}@{LOOPBACK}>;tag=silent{self.port}\r\n"
            f"To: <sip:service@{host}:{port}>\r\n"
            f"Call-ID: {self.call_id}\r\n"
            "CSeq: 1 INVITE\r\n"
            f"Contact: <sip:caller@{LOOPBACK}:{self.port}>\r\n"
            "Content-Type: application/sdp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        )
        self.sock.sendto(message.encode(), self.target)

    def read(self, wait_s: float = 0.05) -> None:
        self.sock.settimeout(wait_s)
        try:
            while True:
                data, _ = self.sock.recvfrom(65535)
                self.received.append(data)
        except TimeoutError:
            return

    def got(self, start: bytes) -> bool:
        return any(m.startswith(start) for m in self.received)

    def close(self) -> None:
        self.sock.close()


def test_answered_invites_never_acked_free_their_slots(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(VOICEGATE_SIP_ACK_TIMEOUT_S="2")
    callers = [SilentCaller((LOOPBACK, server.sip_port), n) for n in range(4)]
    try:
        for caller in callers:
            caller.invite()

        def answered() -> bool:
            for caller in callers:
                caller.read()
            return all(c.got(b"SIP/2.0 200") for c in callers)

        wait_for(answered, 15, "all four INVITEs answered 200")
        # All four slots are taken by calls that will never be ACKed.
        assert len(server.live_calls()) == 4

        def all_ended() -> bool:
            for caller in callers:
                caller.read()
            return len(server.sessions()) == 4 and all(s["ended"] for s in server.sessions())

        wait_for(all_ended, 20, "the half-open calls to end")
        for session in server.sessions():
            ended = session["ended"]
            assert ended["terminal_state"] == "failed", ended
            assert ended["stage"] == "signaling", ended
            assert "no ACK" in ended["reason"], ended
        # RFC 3261 13.3.1.4: the session is ended with a BYE, though nobody answers it.
        def byes() -> bool:
            for caller in callers:
                caller.read()
            return all(c.got(b"BYE ") for c in callers)

        wait_for(byes, 10, "a BYE to each silent caller")
        assert server.metric("voicegate_calls_half_open_total") == 4
        wait_for(lambda: server.live_calls() == [] or None, 10, "no live call left")
        # Nobody answered the BYEs: each dialog is ended locally, which frees its slot.
        wait_for(
            lambda: server.metric("voicegate_dialogs_ended_locally_total") == 4 or None,
            15,
            "the four dialogs ended locally",
        )
    finally:
        for caller in callers:
            caller.close()
    # The slots are free again: a real call is answered (PJSIP would refuse it 486 otherwise).
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    assert server.metric("voicegate_calls_refused_total", reason="capacity", status="486") == 0
