"""PROTOS c07-sip's SDP connection-address group through the call path of one worker, and through
the pool's front door: no worker dies.

Every case of ``sdp-connection-ip`` is replayed over UDP, each answered one ACKed and hung up,
each ringing one CANCELled (tests/robustness/protos.py). The group used to abort the worker on
an assertion inside PJSIP when a call was answered (``pj_sockaddr_in_set_str_addr``: an address
of 254 characters or more); such offers are now refused with 488 before anything is answered
(telephony/offer_check.py), and the pool's Kamailio refuses the same offers before any worker
sees them.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections import Counter
from pathlib import Path

from telephony.offer_check import check_offer
from tests.integration.harness import ServerFactory, Sipp, wait_for
from tests.integration.test_pool import pool_env, ready_workers, workers
from tests.robustness.protos import Replayer, filled, load
from tests.robustness.torture import options

# The group that aborted the worker, every case of it; sdp-origin-ip and the rest are in
# test_protos_sample.py (one case a group) and bench/robustness.py (all of them).
GROUPS = {"sdp-connection-ip"}


def test_sdp_address_cases_never_abort_the_worker(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(VOICEGATE_SIP_MAX_SETUP_RATE="60")
    replayer = Replayer("127.0.0.1", server.sip_port, wait_s=1.0)
    finals: Counter[int | None] = Counter()
    try:
        for case in load(GROUPS):
            finals[replayer.replay(case).final] += 1
            assert server.process is not None and server.process.poll() is None, (
                f"case {case.number} ({case.group}) killed the worker:\n{server.log()[-2000:]}"
            )
    finally:
        replayer.close()
    assert sum(finals.values()) == 106
    # The offers PJSIP cannot take are refused 488 and counted; the others were answered.
    refused = server.metric(
        "voicegate_calls_refused_total", reason="sdp_address_too_long", status="488"
    )
    by_name = server.metric(
        "voicegate_calls_refused_total", reason="sdp_address_not_numeric", status="488"
    )
    assert refused >= 1 and by_name >= 1
    assert finals[488] >= refused + by_name
    assert finals[200] >= 1
    # Still answering: a real call after the run.
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    # No session from the corpus is left open once its teardown went through.
    wait_for(lambda: all(s["ended"] for s in server.sessions()) or None, 40, "every session to end")


def test_the_front_door_refuses_those_offers_before_any_worker_sees_them(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    pool = server_factory("pool", **pool_env(2))
    wait_for(lambda: ready_workers(pool) == 2, 30, "both workers ready")
    replayer = Replayer("127.0.0.1", pool.sip_port, wait_s=2.0)
    try:
        cases = [
            c
            for c in load({"sdp-connection-ip"})
            if check_offer(filled(c)) is not None
        ]
        assert cases, "the group holds offers the workers' PJSIP would abort on"
        for case in cases[:10]:
            assert replayer.replay(case).final == 488
    finally:
        replayer.close()
    assert pool.metric("voicegate_front_door_bad_offers_total") == 10
    reasons = {bad.reason for c in cases[:10] if (bad := check_offer(filled(c))) is not None}
    assert "sdp_address_not_numeric" in reasons, reasons
    # Kamailio answered them itself: no worker refused one, none restarted.
    assert (
        pool.metric("voicegate_calls_refused_total", reason="sdp_address_too_long", status="488")
        == 0
    )
    assert all(w["restarts"] == 0 for w in workers(pool))
    sipp = Sipp("uac-server-hangup.xml", pool.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()


def _bad_offer(n: int, port: int) -> bytes:
    sdp = (
        f"v=0\r\no=- {n} 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 media{n}.invalid\r\nt=0 0\r\n"
        "m=audio 9 RTP/AVP 0\r\n"
    )
    return (
        f"INVITE sip:service@127.0.0.1 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bKflood{n}\r\n"
        f"From: <sip:flood@127.0.0.1>;tag=flood{n}\r\nTo: <sip:service@127.0.0.1>\r\n"
        f"Call-ID: flood-{n}@127.0.0.1\r\nCSeq: 1 INVITE\r\n"
        f"Contact: <sip:flood@127.0.0.1:{port}>\r\nMax-Forwards: 70\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


def test_a_flood_of_bad_offers_is_refused_at_the_set_up_rate(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """Every INVITE costs PJSIP two sockets before voicegate sees it, refused or not; 300 bad
    offers back to back once exhausted the ioqueue's 64 keys and aborted the worker. They are
    refused at the set-up rate now: 488 within it, 503 past it."""
    server = server_factory(VOICEGATE_SIP_MAX_SETUP_RATE="20")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        for n in range(300):
            sock.sendto(_bad_offer(n, port), ("127.0.0.1", server.sip_port))
        finals: Counter[int] = Counter()
        seen: set[bytes] = set()
        sock.settimeout(3.0)
        with contextlib.suppress(TimeoutError):
            while len(seen) < 300:
                data = sock.recv(65535)
                status = int(data[8:11]) if data.startswith(b"SIP/2.0 ") else 0
                call_id = re.search(rb"(?im)^Call-ID:\s*(\S+)", data)
                if status >= 200 and call_id is not None and call_id.group(1) not in seen:
                    seen.add(call_id.group(1))
                    finals[status] += 1
    assert server.process is not None and server.process.poll() is None, server.log()[-2000:]
    assert finals[488] >= 1 and finals[503] >= 1, finals
    assert set(finals) <= {486, 488, 503}, finals
    assert options("127.0.0.1", server.sip_port) == 200
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
