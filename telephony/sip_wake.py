"""Waking the SIP thread out of ``libHandleEvents`` when asyncio hands it a command.

pjsua2 offers no way to add a file descriptor of ours to PJSIP's ioqueue, so a thread that owns
the library can only block in ``libHandleEvents(timeout)``. Polling every 10 ms for commands cost
a worker 1.4% of a core while it had no call (measured here; a pool has many idle workers).
Instead the thread blocks until something is due, and :class:`SipWaker` sends a CRLF keep-alive
(RFC 5626, section 4.4.1) to the endpoint's own UDP transport: PJSIP wakes, reads it, discards it
without a reply or a log line, and ``libHandleEvents`` returns.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket

log = logging.getLogger("voicegate.sip")

KEEPALIVE = b"\r\n\r\n"


def wake_address(bound: str, port: int) -> tuple[str, int]:
    """Where to send the keep-alive: the bound address, or loopback for a wildcard bind."""
    ip = ipaddress.ip_address(bound)
    if ip.is_unspecified:
        return ("::1" if ip.version == 6 else "127.0.0.1", port)
    return (bound, port)


class SipWaker:
    """A non-blocking UDP socket that pokes one SIP transport; safe to call from any thread."""

    def __init__(self, bound: str, port: int) -> None:
        self.address = wake_address(bound, port)
        family = socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self.failures = 0

    def wake(self) -> None:
        # A full socket buffer means wake-ups are already queued; any other error leaves the
        # command to the thread's next timed return (at most _IDLE_WAIT_MS), so it is counted,
        # not raised into the caller's call handling.
        try:
            self._sock.sendto(KEEPALIVE, self.address)
        except BlockingIOError:
            pass
        except OSError as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning(
                    "cannot wake the SIP thread at %s:%d (%s); SIP commands may wait up to 1 s",
                    *self.address,
                    exc,
                )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
