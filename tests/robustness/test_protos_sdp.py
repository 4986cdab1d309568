"""PROTOS c07-sip SDP groups through the call path of one worker, and through the pool's front
door: no worker dies.

Every case of the groups whose offers reach PJSIP's address parsing is replayed over UDP, each
answered one ACKed and hung up, each ringing one CANCELled (tests/robustness/protos.py). The
``sdp-connection-ip`` group used to abort the worker on an assertion inside PJSIP when a call was
answered (``pj_sockaddr_in_set_str_addr``: an address of 254 characters or more); such offers are
now refused with 488 before anything is answered (telephony/offer_check.py), and the pool's
Kamailio refuses the same offers before any worker sees them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from telephony.offer_check import check_offer
from tests.integration.harness import ServerFactory, Sipp, wait_for
from tests.integration.test_pool import pool_env, ready_workers, workers
from tests.robustness.protos import Replayer, load

GROUPS = {"sdp-connection-ip", "sdp-origin-ip"}


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
    assert sum(finals.values()) == 212
    # The offers PJSIP cannot take are refused 488 and counted; the others were answered.
    refused = server.metric(
        "voicegate_calls_refused_total", reason="sdp_address_too_long", status="488"
    )
    assert refused >= 1
    assert finals[488] >= refused
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
            if check_offer(c.invite.decode("latin-1")) is not None
        ]
        assert cases, "the group holds offers the workers' PJSIP would abort on"
        for case in cases[:10]:
            assert replayer.replay(case).final == 488
    finally:
        replayer.close()
    assert pool.metric("voicegate_front_door_bad_offers_total") == 10
    # Kamailio answered them itself: no worker refused one, none restarted.
    assert (
        pool.metric("voicegate_calls_refused_total", reason="sdp_address_too_long", status="488")
        == 0
    )
    assert all(w["restarts"] == 0 for w in workers(pool))
    sipp = Sipp("uac-server-hangup.xml", pool.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
