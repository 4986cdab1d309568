"""The torture corpora through the pool's front door: RFC 4475 and RFC 5118 over UDP and over
TCP, PJSIP's SIP fuzz seeds over UDP (over TCP they go to one worker), each message byte for byte
to Kamailio, which answers what it refuses itself (its sanity checks: 400; a method no worker
takes: 405; Max-Forwards: 483; an offer a worker's PJSIP could not take: 488) and relays the rest
to a worker. Each answered INVITE is ACKed and hung up along the route Kamailio recorded
(tests/robustness/torture.py).

Pass: no worker dies or restarts, no invalid INVITE becomes a call, every call made is hung up,
and after each corpus the front door still answers an OPTIONS and puts a real SIPp call through;
at the end nothing is left on the line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.harness import Server, ServerFactory, Sipp, wait_for
from tests.integration.test_pool import pool_env, ready_workers, workers
from tests.robustness import test_rfc4475, test_rfc5118
from tests.robustness.test_fuzz_seeds import SEEDS, sip_messages
from tests.robustness.torture import Outcome, Replayer, Transport, options, replay_admitted


def _rfc4475() -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in test_rfc4475.messages()]


def _rfc5118() -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted(test_rfc5118.RFC5118.glob("*.dat"))]


def _may_become_a_call(corpus: str, name: str) -> bool:
    """Whether the corpus's own table lets this message be answered 2xx as an INVITE."""
    if corpus == "rfc4475":
        return 200 in test_rfc4475.EXPECTED[name].allowed
    if corpus == "rfc5118":
        return 200 in test_rfc5118.EXPECTED[name][1]
    return True  # a fuzz seed may be a valid INVITE: nothing is expected of it


def replay_through(
    pool: Server, transport: Transport, messages: list[tuple[str, bytes]]
) -> dict[str, Outcome]:
    replayer = Replayer(
        "127.0.0.1",
        pool.sip_port,
        transport,
        route_via=("127.0.0.1", pool.sip_port),
        sentinel=False,  # Kamailio relays; the worker's answer may come after Kamailio's own
        # Only what Kamailio drops waits this long: it answers every INVITE it relays with 100
        # Trying at once, and the replayer then waits for the final answer.
        quiet_s=0.3,
    )
    outcomes = {}
    try:
        for name, message in messages:
            outcomes[name] = replay_admitted(replayer, message)
            assert pool.process is not None and pool.process.poll() is None, (
                f"{name} over {transport} killed the pool:\n{pool.log()[-2000:]}"
            )
    finally:
        replayer.close()
    return outcomes


def _restarts(pool: Server, corpus: str) -> str:
    """Which worker restarted, why, and its last words: its log lines and anything not JSON (a
    dying process's stack dump, an assertion's message)."""
    events = pool.log_events()
    restarting = [e for e in events if e.get("event") == "worker.restarting"]
    names = {e["worker"] for e in restarting}
    last_words = [
        line
        for line in pool.log().splitlines()
        if not line.startswith("{") or any(f'"proc":"{name}"' in line for name in names)
    ]
    head = [f"after {corpus}: {workers(pool)}", *map(str, restarting), "last words:"]
    return "\n".join([*head, *last_words[-60:]])


CORPORA: dict[str, Callable[[Transport], list[tuple[str, bytes]]]] = {
    "rfc4475": lambda _t: _rfc4475(),
    "rfc5118": lambda _t: _rfc5118(),
    "fuzz-sip": sip_messages,
}
# The fuzz seeds go through the front door over UDP; over TCP they go to one worker
# (test_fuzz_seeds.py), which keeps the suite's time in bounds.
OVER = {"udp": tuple(CORPORA), "tcp": ("rfc4475", "rfc5118")}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_every_corpus_through_the_front_door(
    server_factory: ServerFactory, tmp_path: Path, transport: Transport
) -> None:
    if not SEEDS.is_dir():
        pytest.skip(f"no fuzz seeds at {SEEDS}")
    pool = server_factory("pool", **pool_env(2, VOICEGATE_SIP_MAX_SETUP_RATE="60"))
    wait_for(lambda: ready_workers(pool) == 2, 30, "both workers ready")
    answered = 0
    callable_outcomes = {}  # what became of each message that may be a call, for the message
    for corpus in OVER[transport]:
        outcomes = replay_through(pool, transport, CORPORA[corpus](transport))
        for name, outcome in outcomes.items():
            if outcome.answered:
                assert _may_become_a_call(corpus, name), f"{corpus}/{name} became a call"
            assert outcome.hung_up == outcome.answered, f"{corpus}/{name}: {outcome}"
            answered += outcome.answered
            if corpus != "fuzz-sip" and _may_become_a_call(corpus, name):
                callable_outcomes[f"{corpus}/{name}"] = outcome.finals
        assert all(w["restarts"] == 0 for w in workers(pool)), _restarts(pool, corpus)
        assert options("127.0.0.1", pool.sip_port, transport, sentinel=False) == 200, corpus
        call = Sipp("uac-server-hangup.xml", pool.sip_target, tmp_path / corpus)
        assert call.run() == 0, f"after {corpus} over {transport}: {call.errors()}"
    # Not vacuous: valid INVITEs went through Kamailio to a worker and were answered.
    # Over TCP exactly three are (rfc4475 baddate, esc01, escruri): each must be answered.
    assert answered >= 3, (callable_outcomes, pool.log()[-3000:])
    wait_for(lambda: pool.live_calls() == [] or None, 20, "no call left in the pool")
    assert pool.metric("voicegate_calls_half_open_total") == 0
