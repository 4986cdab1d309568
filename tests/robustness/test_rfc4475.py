"""RFC 4475 ("SIP Torture Test Messages"): every message, as bytes, to one worker over UDP and TCP
(and through the pool's Kamailio: tests/robustness/test_front_door.py). Nothing crashes, nothing
hangs, no malformed INVITE becomes a call, and the worker still answers an OPTIONS and a real call
afterwards.

The table below maps each message to what RFC 4475 says an element should do (section and
summary) and to the statuses this server may answer (``None``: it said nothing, which is what
PJSIP does with a request it cannot parse or that no module handles). Where the server differs
from the RFC's "should", the note says how and why it is harmless; where PJSIP would have turned
an invalid INVITE into a call, telephony/offer_check.py refuses it first with the RFC's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.harness import ServerFactory, Sipp, wait_for
from tests.robustness.protos import CORPUS
from tests.robustness.torture import Outcome, Replayer, Transport, options, replay_admitted

RFC4475 = CORPUS.parent / "rfc4475"
DROPPED = None  # no answer at all


@dataclass(frozen=True, slots=True)
class Expect:
    rfc: str  # section and what an element should do
    allowed: frozenset[int | None]  # what this server may answer, over UDP
    tcp: frozenset[int | None] | None = None  # over TCP, where framing changes the answer
    note: str = ""


def _e(
    rfc: str, *allowed: int | None, tcp: tuple[int | None, ...] | None = None, note: str = ""
) -> Expect:
    return Expect(rfc, frozenset(allowed), None if tcp is None else frozenset(tcp), note)


# PJSIP answers no request that no module handles (REGISTER at a UA that is no registrar, an
# unknown method) and none it cannot parse: it drops them, and nothing is created.
UNHANDLED = (DROPPED, 405, 501)
UNPARSEABLE = (400, DROPPED)

EXPECTED: dict[str, Expect] = {
    # 3.1.1: valid messages, to be accepted and processed.
    "wsinv.dat": _e("3.1.1.1 well-formed", 481, note="its To tag names no dialog: 481"),
    "intmeth.dat": _e("3.1.1.2 valid, unknown method: 501/405", *UNHANDLED),
    "esc01.dat": _e("3.1.1.3 valid INVITE", 200),
    "escnull.dat": _e("3.1.1.4 valid REGISTER", *UNHANDLED),
    "esc02.dat": _e("3.1.1.5 valid, unknown method", *UNHANDLED),
    "lwsdisp.dat": _e("3.1.1.6 valid OPTIONS", 200),
    "longreq.dat": _e("3.1.1.7 valid INVITE, long values", 200),
    "dblreq.dat": _e(
        "3.1.1.8 process the REGISTER, ignore the trailing octets",
        *UNHANDLED,
        tcp=(*UNHANDLED, 400),
        note="on a stream the trailing INVITE is a second message; its 'm =video' is a 400",
    ),
    "semiuri.dat": _e("3.1.1.9 valid OPTIONS", 200),
    "transports.dat": _e("3.1.1.10 valid OPTIONS", 200),
    "mpart01.dat": _e("3.1.1.11 valid MESSAGE", 200),
    "unreason.dat": _e("3.1.1.12 valid response: no transaction, dropped", DROPPED),
    "noreason.dat": _e("3.1.1.13 valid response: no transaction, dropped", DROPPED),
    # 3.1.2: invalid messages, to be refused with 400 (responses dropped).
    "badinv01.dat": _e("3.1.2.1 400", *UNPARSEABLE),
    "clerr.dat": _e(
        "3.1.2.2 400 over UDP; a stream waits for the rest",
        400,
        tcp=(DROPPED,),
        note="PJSIP took the short datagram: offer_check refuses it (content_length_mismatch)",
    ),
    "ncl.dat": _e("3.1.2.3 400", *UNPARSEABLE),
    "scalar02.dat": _e("3.1.2.4 400", *UNPARSEABLE),
    "scalarlg.dat": _e("3.1.2.5 response: dropped", DROPPED),
    "quotbal.dat": _e("3.1.2.6 400 (or infer the quote)", *UNPARSEABLE, 200),
    "ltgtruri.dat": _e("3.1.2.7 400", *UNPARSEABLE),
    "lwsruri.dat": _e("3.1.2.8 400", *UNPARSEABLE),
    "lwsstart.dat": _e(
        "3.1.2.9 400", 400, note="PJSIP answered it: offer_check refuses it (bad_request_line)"
    ),
    "trws.dat": _e("3.1.2.10 400, or be liberal", 400, 200),
    "escruri.dat": _e("3.1.2.11 400, or ignore the escaped headers", 400, 200),
    "baddate.dat": _e("3.1.2.12 400, or ignore the Date", 400, 200),
    "regbadct.dat": _e("3.1.2.13 400", *UNPARSEABLE, *UNHANDLED),
    "badaspec.dat": _e("3.1.2.14 400, or be liberal", 400, 200),
    "baddn.dat": _e("3.1.2.15 400, or be liberal", 400, 200),
    "badvers.dat": _e("3.1.2.16 505", 505, DROPPED, note="PJSIP drops an unknown version"),
    "mismatch01.dat": _e(
        "3.1.2.17 400", 400, 200, note="PJSIP answers the OPTIONS of its Request-Line; no call"
    ),
    "mismatch02.dat": _e("3.1.2.18 400", *UNPARSEABLE, 501),
    "bigcode.dat": _e("3.1.2.19 response: dropped", DROPPED),
    # 3.2 and 3.3: transaction and application-layer semantics.
    "badbranch.dat": _e("3.2.1 valid, RFC 2543 matching", 200),
    "insuf.dat": _e("3.3.1 400", *UNPARSEABLE, note="no Call-ID, From or To to answer with"),
    "unkscm.dat": _e("3.3.2 416", 416, DROPPED, note="PJSIP drops an unknown URI scheme"),
    "novelsc.dat": _e("3.3.3 416", 416, DROPPED, note="PJSIP drops an unknown URI scheme"),
    "unksm2.dat": _e("3.3.4 not refused for its schemes (REGISTER)", *UNHANDLED),
    "bext01.dat": _e("3.3.5 420", 420, 200, note="pjsua's OPTIONS answer ignores Require"),
    "invut.dat": _e("3.3.6 415", 415),
    "regaut01.dat": _e("3.3.7 401 at a registrar (REGISTER)", *UNHANDLED, 401),
    "multi01.dat": _e(
        "3.3.8 400", 400, note="PJSIP answered it: offer_check refuses it (duplicate_header)"
    ),
    "mcl01.dat": _e("3.3.9 400", 400, 200, note="PJSIP answers the OPTIONS; no call"),
    "bcast.dat": _e("3.3.10 response: dropped", DROPPED),
    "zeromf.dat": _e("3.3.11 an endpoint processes it", 200),
    "cparam01.dat": _e("3.3.12 valid REGISTER", *UNHANDLED),
    "cparam02.dat": _e("3.3.13 valid REGISTER", *UNHANDLED),
    "regescrt.dat": _e("3.3.14 REGISTER", *UNHANDLED),
    "sdp01.dat": _e(
        "3.3.15 406 (or 400)", 406, 400, note="offer_check refuses it (sdp_not_acceptable)"
    ),
    "inv2543.dat": _e(
        "3.4.1 accept for backward compatibility (optional)",
        200,
        400,
        tcp=(DROPPED,),
        note="PJSIP refuses an RFC 2543 INVITE 400; no Content-Length, so a stream waits",
    ),
}


def messages() -> list[Path]:
    return sorted(RFC4475.glob("*.dat"))


def test_the_table_names_every_message_of_the_corpus() -> None:
    assert {p.name for p in messages()} == set(EXPECTED)


def replay_all(
    host: str, port: int, transport: Transport, alive: object, **kw: object
) -> dict[str, Outcome]:
    replayer = Replayer(host, port, transport, **kw)  # type: ignore[arg-type]
    outcomes = {}
    try:
        for path in messages():
            outcomes[path.name] = replay_admitted(replayer, path.read_bytes())
            assert callable(alive) and alive(), f"{path.name} over {transport} killed the server"
    finally:
        replayer.close()
    return outcomes


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_one_worker_takes_every_message(
    server_factory: ServerFactory, tmp_path: Path, transport: Transport
) -> None:
    server = server_factory(VOICEGATE_SIP_MAX_SETUP_RATE="60")

    def alive() -> bool:
        return server.process is not None and server.process.poll() is None

    outcomes = replay_all("127.0.0.1", server.sip_port, transport, alive)
    wrong = {}
    for name, outcome in outcomes.items():
        expect = EXPECTED[name]
        allowed = expect.tcp if transport == "tcp" and expect.tcp is not None else expect.allowed
        if outcome.status not in allowed:
            wrong[name] = (outcome.finals, sorted(allowed, key=str), expect.rfc)
        # Every answered INVITE reached the call path and was hung up: no slot is held.
        assert outcome.hung_up == outcome.answered, f"{name}: {outcome}"
    assert not wrong, f"answers outside RFC 4475's expectations: {wrong}"
    answered = sum(o.answered for o in outcomes.values())
    assert answered >= 4, "the valid INVITEs were answered"
    # The invalid INVITEs PJSIP would have answered were refused and counted.
    for reason in ("duplicate_header", "bad_request_line"):
        assert server.metric("voicegate_calls_refused_total", reason=reason, status="400") == 1
    assert (
        server.metric("voicegate_calls_refused_total", reason="sdp_not_acceptable", status="406")
        == 1
    )
    # Alive and answering: an OPTIONS, then a real call.
    assert options("127.0.0.1", server.sip_port, transport) == 200
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "after")
    assert sipp.run() == 0, sipp.errors()
    wait_for(lambda: all(s["ended"] for s in server.sessions()) or None, 20, "every session ended")
    assert server.live_calls() == []
