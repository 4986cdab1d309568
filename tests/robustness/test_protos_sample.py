"""A sample of every PROTOS c07-sip group through the call path: to one worker, and through the
pool's front door. The whole corpus (4,527 cases) is ``bench/robustness.py``; the suite takes the
first case of each of the 54 groups to one worker and the last through the pool (the group's most
extreme mutation: the longest overflow string, the widest integer), each answered case ACKed and
hung up in its dialog, each ringing or silent one CANCELled with its own teardown
(tests/robustness/protos.py).

Every few cases the server must still answer an OPTIONS, and now and then a real SIPp call; at the
end no session may be left open.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Server, ServerFactory, Sipp, wait_for
from tests.integration.test_pool import pool_env, ready_workers, workers
from tests.robustness.protos import Case, Replayer, load
from tests.robustness.torture import options

OPTIONS_EVERY = 10
CALL_EVERY = 40


def sample(which: str) -> Iterator[Case]:
    """The ``"first"`` or the ``"last"`` case of every group."""
    groups: dict[str, list[Case]] = {}
    for case in load():
        groups.setdefault(case.group, []).append(case)
    for cases in groups.values():
        yield cases[0] if which == "first" else cases[-1]


def run_sample(
    server: Server, alive: object, tmp_path: Path, cases: list[Case], *, front_door: bool = False
) -> Counter[int | None]:
    replayer = Replayer("127.0.0.1", server.sip_port, wait_s=2.0 if front_door else 1.0)
    finals: Counter[int | None] = Counter()
    try:
        for n, case in enumerate(cases, 1):
            outcome = replayer.replay(case)
            finals[outcome.final] += 1
            assert callable(alive) and alive(), (
                f"case {case.number} ({case.group}) killed the server:\n{server.log()[-2000:]}"
            )
            if n % OPTIONS_EVERY == 0:
                assert options("127.0.0.1", server.sip_port, sentinel=not front_door) == 200, (
                    f"no answer to an OPTIONS after case {case.number} ({case.group})"
                )
            if n % CALL_EVERY == 0:
                call = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / f"call-{n}")
                assert call.run() == 0, f"after case {case.number}: {call.errors()}"
    finally:
        replayer.close()
    return finals


# A case takes up to a second (a silent one waits for an answer, then for its CANCEL's).
@pytest.mark.timeout(300)
def test_every_group_through_one_worker(server_factory: ServerFactory, tmp_path: Path) -> None:
    server = server_factory(VOICEGATE_SIP_MAX_SETUP_RATE="60")
    cases = list(sample("first"))
    assert {c.group for c in cases} == {c.group for c in load()}
    assert len(cases) == 54

    def alive() -> bool:
        return server.process is not None and server.process.poll() is None

    finals = run_sample(server, alive, tmp_path, cases)
    # Not vacuous: cases reached the call path and were answered, others were refused.
    assert finals[200] >= 10, finals
    assert sum(n for status, n in finals.items() if status is not None and status >= 400) >= 10
    wait_for(
        lambda: all(s["ended"] for s in server.sessions()) or None, 40, "every session to end"
    )
    assert server.live_calls() == []


@pytest.mark.timeout(300)
def test_every_group_through_the_front_door(server_factory: ServerFactory, tmp_path: Path) -> None:
    pool = server_factory("pool", **pool_env(2))
    wait_for(lambda: ready_workers(pool) == 2, 30, "both workers ready")

    def alive() -> bool:
        return pool.process is not None and pool.process.poll() is None

    finals = run_sample(pool, alive, tmp_path, list(sample("last")), front_door=True)
    assert finals[200] >= 5, finals
    assert all(w["restarts"] == 0 for w in workers(pool)), workers(pool)
    # Every answered case was hung up through Kamailio's route: nothing is left on the line.
    wait_for(lambda: pool.live_calls() == [] or None, 20, "no call left in the pool")
    sessions = pool.sessions()
    assert sessions and all(s["ended"] for s in sessions)
    # Not one was left for the workers' ACK timer: each ACK found its worker through the route.
    assert pool.metric("voicegate_calls_half_open_total") == 0
