"""The pool's front door refuses a flooding source and malformed requests before any worker.

One source address above ``pool.source_max_rate`` new requests a second is answered 503 with
Retry-After by Kamailio (pike) until it slows down, while callers from other addresses go on; a
request that fails Kamailio's sanity checks never reaches a worker. Both are counted by reason.
The flood comes from 127.0.0.2 (all of 127/8 is loopback), the real caller from 127.0.0.1.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.integration.harness import Server, ServerFactory, Sipp, datagrams_within, wait_for
from tests.integration.test_pool import pool_env, ready_workers, workers

FLOODER = "127.0.0.2"


def _options(target: tuple[str, int], port: int, number: int) -> bytes:
    host, target_port = target
    return (
        f"OPTIONS sip:{host}:{target_port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {FLOODER}:{port};branch=z9hG4bKflood{number}x{time.monotonic_ns()}\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:flood@{FLOODER}>;tag=f{number}\r\n"
        f"To: <sip:{host}:{target_port}>\r\n"
        f"Call-ID: flood-{number}-{time.monotonic_ns()}\r\n"
        "CSeq: 1 OPTIONS\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def _answers(sock: socket.socket, wait_s: float) -> list[bytes]:
    return [data for data, _ in datagrams_within(sock, wait_s)]


def test_a_flooding_source_is_refused_503_while_others_are_served(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    pool = server_factory("pool", **pool_env(2, VOICEGATE_POOL_SOURCE_MAX_RATE="5"))
    wait_for(lambda: ready_workers(pool) == 2, 30, "both workers ready")
    target = ("127.0.0.1", pool.sip_port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((FLOODER, 0))
    try:
        port = sock.getsockname()[1]
        for number in range(60):
            sock.sendto(_options(target, port, number), target)
        answers = _answers(sock, 2.0)
    finally:
        sock.close()
    statuses = [int(a[8:11]) for a in answers if a.startswith(b"SIP/2.0 ")]
    # The first requests are within the limit and answered; the rest of the burst is not.
    assert 200 in statuses
    limited = [a for a in answers if a.startswith(b"SIP/2.0 503")]
    assert limited, statuses
    assert all(b"\r\nRetry-After: " in a for a in limited)
    assert pool.metric("voicegate_front_door_dropped_total", reason="source_rate") >= len(limited)
    # A caller from another address is served meanwhile, and no worker saw the flood.
    sipp = Sipp("uac-server-hangup.xml", pool.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    restarted = [w for w in workers(pool) if w["restarts"]]
    assert not restarted, (restarted, _exits(pool))


def _exits(pool: Server) -> list[str]:
    """Why workers went down: the supervisor's worker.exited lines and any traceback."""
    lines = pool.log().splitlines()
    return [line for line in lines if "worker.exited" in line or "Error" in line][-10:]


def test_a_request_failing_the_sanity_checks_never_reaches_a_worker(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    pool = server_factory("pool", **pool_env(2))
    wait_for(lambda: ready_workers(pool) == 2, 30, "both workers ready")
    target = ("127.0.0.1", pool.sip_port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # A CSeq whose method is not the request's (RFC 3261 8.2: the CSeq method must match).
    bad = (
        f"INVITE sip:service@127.0.0.1:{pool.sip_port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bKinsane{time.monotonic_ns()}\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:insane@127.0.0.1>;tag=x1\r\n"
        f"To: <sip:service@127.0.0.1:{pool.sip_port}>\r\n"
        f"Call-ID: insane-{time.monotonic_ns()}\r\n"
        "CSeq: 1 BYE\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()
    try:
        sock.sendto(bad, target)
        answers = _answers(sock, 1.0)
    finally:
        sock.close()
    assert not any(a.startswith(b"SIP/2.0 2") for a in answers), answers
    wait_for(
        lambda: pool.metric("voicegate_front_door_dropped_total", reason="malformed") >= 1 or None,
        10,
        "the malformed request counted",
    )
    assert pool.sessions() == []
    sipp = Sipp("uac-server-hangup.xml", pool.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
