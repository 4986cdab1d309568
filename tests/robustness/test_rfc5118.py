"""RFC 5118 ("SIP Torture Test Messages for IPv6"): every message, as bytes, to one worker over UDP
and TCP. The worker listens on IPv4 loopback; the messages name IPv6 addresses in their URIs,
headers and SDP, which it must parse without crashing, refusing only what the RFC calls invalid.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import ServerFactory, Sipp, wait_for
from tests.robustness.protos import CORPUS
from tests.robustness.torture import Replayer, Transport, options, replay_admitted

RFC5118 = CORPUS.parent / "rfc5118"
# file -> (RFC 5118 section and expectation, statuses this server may answer; None: dropped).
# The REGISTERs are valid, but a UA that is no registrar answers none (PJSIP drops a request no
# module handles, and a BYE of no dialog). The media transport is IPv4 only: PJSIP refuses an
# IPv6 offer with 500 (488 would be the better status, RFC 3261 section 21.4.26: a follow-up).
IPV6_OFFER = frozenset({200, 488, 500})
STRAY_BYE = frozenset({481, None})
EXPECTED: dict[str, tuple[str, frozenset[int | None]]] = {
    "ipv6-good.dat": ("4.1 valid REGISTER", frozenset({None, 405, 501})),
    "ipv6-bad.dat": ("4.2 400 (no brackets)", frozenset({400, None})),
    "port-ambiguous.dat": (
        "4.3 address without port: accept or 400",
        frozenset({400, None, 405, 501}),
    ),
    "port-unambiguous.dat": ("4.4 valid REGISTER", frozenset({None, 405, 501})),
    "via-received-param-with-delim.dat": ("4.5 valid BYE (no dialog: 481)", STRAY_BYE),
    "via-received-param-no-delim.dat": ("4.5 valid OPTIONS", frozenset({200})),
    "ipv6-in-sdp.dat": ("4.6 valid INVITE", IPV6_OFFER),
    "mult-ip-in-header.dat": ("4.7 valid BYE (no dialog: 481)", STRAY_BYE),
    "mult-ip-in-sdp.dat": (
        "4.8 valid INVITE; its body and Content-Length disagree",
        IPV6_OFFER | {400},
    ),
    "ipv4-mapped-ipv6.dat": ("4.9 valid INVITE", IPV6_OFFER),
    "ipv6-bug-abnf-3-colons.dat": ("4.10 tolerate, or 400", frozenset({200, 400, None})),
    "ipv6-correct-abnf-2-colons.dat": ("4.10 valid OPTIONS", frozenset({200})),
}


def test_the_table_names_every_message_of_the_corpus() -> None:
    assert {p.name for p in RFC5118.glob("*.dat")} == set(EXPECTED)


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_one_worker_takes_every_message(
    server_factory: ServerFactory, tmp_path: Path, transport: Transport
) -> None:
    server = server_factory(VOICEGATE_SIP_MAX_SETUP_RATE="60")
    replayer = Replayer("127.0.0.1", server.sip_port, transport)
    wrong = {}
    try:
        for path in sorted(RFC5118.glob("*.dat")):
            outcome = replay_admitted(replayer, path.read_bytes())
            assert server.process is not None and server.process.poll() is None, (
                f"{path.name} over {transport} killed the worker:\n{server.log()[-2000:]}"
            )
            rfc, allowed = EXPECTED[path.name]
            if outcome.status not in allowed:
                wrong[path.name] = (outcome.finals, rfc)
            assert outcome.hung_up == outcome.answered, f"{path.name}: {outcome}"
    finally:
        replayer.close()
    assert not wrong, f"answers outside RFC 5118's expectations: {wrong}"
    assert options("127.0.0.1", server.sip_port, transport) == 200
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "after")
    assert sipp.run() == 0, sipp.errors()
    wait_for(lambda: all(s["ended"] for s in server.sessions()) or None, 20, "every session ended")
