"""SIP over TLS through a pool (issue 33): the front door's Kamailio terminates TLS and tells the
workers which calls came over it (X-Voicegate-Transport, docs/pool.md "TLS and SRTP").

A real softphone, baresip, calls the pool over TLS with ``media.srtp = "mandatory"``: it hears the
demo's greeting, presses 9, and the demo's BYE reaches it through Kamailio over baresip's own
connection (baresip has no certificate of its own here, so a new connection to it would fail its
handshake); a capture of the call's media holds none of the greeting's audio. A plain-RTP SIPp
offer over UDP is refused 488 with the Warning, and so is an SDES offer over UDP whose caller
claims ``X-Voicegate-Transport: tls`` (the front door replaces the caller's header).

Every wait polls a condition; every failure prints baresip's output and the pool's log (the
supervisor's, Kamailio's and the workers' lines).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import LOOPBACK, Server, ServerFactory, Sipp, free_port, wait_for
from tests.integration.test_pool import pool_env, ready_workers
from tests.integration.test_tls_srtp import (
    Baresip,
    Certs,
    _call_and_press_9,
    _ended_by_key_9,
    _tls_env,
    certs,
    greeting_likeness,
    stopped_phones,
)
from tests.secret_audit import AUDIT

pytestmark = pytest.mark.skipif(
    shutil.which("baresip") is None or shutil.which("openssl") is None,
    reason="needs baresip (apt-get install baresip-core, scripts/bootstrap) and openssl",
)
__all__ = ["certs", "stopped_phones"]  # fixtures, used by name

WORKERS = 2


def _why(pool: Server, phone: Baresip | None = None) -> str:
    lines = pool.log().splitlines()
    kamailio = [line for line in lines if "kamailio" in line.lower()][-30:]
    out = f"\n--- baresip:\n{phone.output()[-3000:]}" if phone is not None else ""
    return (
        out
        + "\n--- Kamailio's lines:\n"
        + "\n".join(kamailio)
        + "\n--- pool log tail:\n"
        + "\n".join(lines[-60:])
    )


def _tls_pool(
    server_factory: ServerFactory,
    certs: Certs,
    tls_port: int,
    srtp: str = "mandatory",
    **extra: str,
) -> Server:
    env = pool_env(WORKERS, **_tls_env(certs, tls_port, srtp), **extra)
    pool = server_factory("tls-pool", **env)
    wait_for(lambda: ready_workers(pool) == WORKERS, 30, "every worker ready" + _why(pool))
    # The workers share the pool's RTP range (pool_env's), not the harness's own pick.
    pool.rtp_min = int(env["VOICEGATE_MEDIA_RTP_PORT_MIN"])
    pool.rtp_max = int(env["VOICEGATE_MEDIA_RTP_PORT_MAX"])
    return pool


def test_a_tls_call_through_the_front_door_with_mandatory_srtp(
    server_factory: ServerFactory, certs: Certs, tmp_path: Path, stopped_phones: list[Baresip]
) -> None:
    tls_port = free_port()
    pool = _tls_pool(server_factory, certs, tls_port)
    config = (pool.data_dir / "run" / "kamailio.cfg").read_text()
    assert f"listen=tls:{LOOPBACK}:{tls_port}" in config, config
    # No certificate of its own: the demo's BYE reaches baresip only over its own connection.
    phone = Baresip(tmp_path / "phone", certs.ca, "srtp-mand", own_certificate=False)
    stopped_phones.append(phone)
    sent = _call_and_press_9(
        pool, phone, f"sip:100@{LOOPBACK}:{tls_port};transport=tls", tmp_path / "srtp.pcap"
    )
    out = phone.output()
    assert "SRTP is Enabled" in out and "srtp-mand" in out, _why(pool, phone)
    keys = set(re.findall(r"inline:([A-Za-z0-9+/=]{20,})", out))
    assert len(keys) >= 2, "no SDES keys in baresip's trace" + _why(pool, phone)
    for key in keys:
        AUDIT.register(key, "SRTP master key", "tests/integration/test_pool_tls.py")
    assert not any(key in pool.log() for key in keys), "an SRTP key is in the pool's log"
    # The demo's hang-up (its BYE through Kamailio) ended the call at baresip's end.
    assert "terminated" in out and "BYE" in out, _why(pool, phone)
    session = _ended_by_key_9(pool)
    assert session["owner"].split("/")[0].startswith("worker-0."), session["owner"]
    secure = greeting_likeness(sent)
    assert secure < 0.2, f"the greeting is in the SRTP call's packets ({secure:.2f})"
    # The worker took the call as one over TLS (Kamailio's header), not as its own UDP hop.
    assert session["meta"]["transport"] == "tls", session["meta"]

def test_a_plain_rtp_offer_over_udp_to_a_mandatory_pool_is_refused_488(
    server_factory: ServerFactory, certs: Certs, tmp_path: Path
) -> None:
    pool = _tls_pool(server_factory, certs, free_port())
    sipp = Sipp("uac-srtp-refused.xml", pool.sip_target, tmp_path / "sipp")
    assert sipp.run() == 0, sipp.errors() + _why(pool)
    assert pool.metric("voicegate_calls_refused_total", reason="srtp_required", status="488")


def test_a_caller_claiming_tls_over_udp_gets_no_sdes_accepted(
    server_factory: ServerFactory, certs: Certs, tmp_path: Path
) -> None:
    pool = _tls_pool(server_factory, certs, free_port())
    sipp = Sipp("uac-sdes-claimed-tls.xml", pool.sip_target, tmp_path / "sipp")
    assert sipp.run() == 0, sipp.errors() + _why(pool)
    assert pool.metric("voicegate_calls_refused_total", reason="srtp_required", status="488")


def test_the_callers_in_dialog_requests_pass_the_front_door_over_tls(
    server_factory: ServerFactory, certs: Certs, tmp_path: Path, stopped_phones: list[Baresip]
) -> None:
    """baresip puts the call on hold (a re-INVITE, still SRTP) and hangs up (its BYE): both
    follow the Record-Route to Kamailio's TLS listener and on to the worker."""
    tls_port = free_port()
    pool = _tls_pool(server_factory, certs, tls_port)
    phone = Baresip(tmp_path / "phone", certs.ca, "srtp-mand", own_certificate=False)
    stopped_phones.append(phone)
    phone.dial(f"sip:100@{LOOPBACK}:{tls_port};transport=tls")
    wait_for(lambda: "Call established" in phone.output(), 20, "the call" + _why(pool, phone))
    phone.command("/hold")

    def hold_answered() -> str | None:
        # baresip's trace (-s): the worker's 200 to a second INVITE (the hold), keyed again.
        answers = re.findall(r"SIP/2.0 200 OK\r?\n(?:.+\r?\n)*?CSeq: *(\d+) INVITE", phone.output())
        return phone.output() if len(set(answers)) >= 2 else None

    out = wait_for(hold_answered, 15, "the hold re-INVITE's 200" + _why(pool, phone))
    hold = out[out.rindex("SIP/2.0 200 OK") :]
    assert "RTP/SAVP" in hold and "a=crypto:" in hold, hold[:2000]
    phone.command("/hangup")

    def ended() -> dict[str, Any] | None:
        sessions = pool.sessions()
        return sessions[0] if sessions and sessions[0]["ended"] else None

    session = wait_for(ended, 15, "the session's end" + _why(pool, phone))
    types = [e["type"] for e in session["events"]]
    assert "caller_hangup" in types, types
    assert pool.live_calls() == [], pool.live_calls()


def test_the_front_door_takes_tls_1_2_and_newer_only(
    server_factory: ServerFactory, certs: Certs
) -> None:
    tls_port = free_port()
    pool = _tls_pool(server_factory, certs, tls_port)
    for version, accepted in (("-tls1_1", False), ("-tls1_2", True), ("-tls1_3", True)):
        done = subprocess.run(
            ["openssl", "s_client", version, "-connect", f"{LOOPBACK}:{tls_port}",
             "-CAfile", str(certs.ca), "-verify_return_error",
             # The client would refuse TLS 1.1 itself at its default security level.
             "-cipher", "DEFAULT:@SECLEVEL=0"],
            input=b"", capture_output=True, timeout=20,
        )  # fmt: skip
        out = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
        shook_hands = "Cipher is (NONE)" not in out and "Verify return code: 0 (ok)" in out
        assert shook_hands is accepted, version + "\n" + out + _why(pool)


def test_a_tenant_that_requires_tls_takes_its_calls_through_the_front_doors_tls_only(
    server_factory: ServerFactory, certs: Certs, tmp_path: Path, stopped_phones: list[Baresip]
) -> None:
    config = tmp_path / "tenants.toml"
    config.write_text('[tenants.secure]\nnumbers = ["100"]\nrequire_tls = true\n')
    tls_port = free_port()
    pool = _tls_pool(server_factory, certs, tls_port, "off", VOICEGATE_CONFIG=str(config))
    # Over UDP: refused 403 by the worker, Kamailio relaying its answer.
    udp = Baresip(tmp_path / "udp-phone", certs.ca, None)
    stopped_phones.append(udp)
    udp.dial(f"sip:100@{pool.sip_target}")
    wait_for(
        lambda: pool.metric("voicegate_calls_refused_total", reason="tls_required", status="403"),
        20,
        "the UDP call's 403" + _why(pool, udp),
    )
    udp.stop()
    # Over TLS: the tenant's call, which the demo ends on 9.
    tls = Baresip(tmp_path / "tls-phone", certs.ca, None, own_certificate=False)
    stopped_phones.append(tls)
    _call_and_press_9(
        pool, tls, f"sip:100@{LOOPBACK}:{tls_port};transport=tls", tmp_path / "tls.pcap"
    )
    session = _ended_by_key_9(pool)
    assert session["tenant"] == "secure", session
