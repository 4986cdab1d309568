"""The worker pool behind Kamailio, with real SIPp callers: capacity, failover, crash, drain."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import (
    LOOPBACK,
    Server,
    ServerFactory,
    Sipp,
    free_port,
    free_port_block,
    rtp_range,
    wait_for,
)

if shutil.which("kamailio") is None:  # pragma: no cover - CI installs it
    raise pytest.UsageError("pool tests need Kamailio: apt-get install kamailio")

WORKERS = 3


def pool_env(workers: int = WORKERS, **extra: str) -> dict[str, str]:
    low, high = rtp_range(size=40 * workers)
    return {
        "VOICEGATE_POOL_WORKERS": str(workers),
        "VOICEGATE_POOL_WORKER_SIP_PORT": str(free_port_block(workers)),
        "VOICEGATE_POOL_WORKER_HTTP_PORT": str(free_port_block(workers, udp_and_tcp=False)),
        "VOICEGATE_POOL_HEALTH_INTERVAL_S": "0.5",
        "VOICEGATE_POOL_HEALTH_TIMEOUT_S": "1",
        "VOICEGATE_POOL_PROBE_INTERVAL_S": "1",
        "VOICEGATE_MEDIA_RTP_PORT_MIN": str(low),
        "VOICEGATE_MEDIA_RTP_PORT_MAX": str(high),
        **extra,
    }


@pytest.fixture
def pool(server_factory: ServerFactory) -> Iterator[Server]:
    server = server_factory("pool", **pool_env())
    wait_for(lambda: ready_workers(server) == WORKERS, 30, "every worker ready")
    yield server


def workers(server: Server) -> list[dict[str, Any]]:
    status, body = server.http("/v1/pool")
    assert status == 200, body
    return body["workers"]  # type: ignore[no-any-return]


def ready_workers(server: Server) -> int:
    return sum(1 for w in workers(server) if w["state"] == "ready")


def answered(server: Server) -> list[dict[str, Any]]:
    return [c for c in server.live_calls() if c["state"] == "answered"]


def test_twelve_calls_fill_three_workers_and_a_thirteenth_is_refused(
    pool: Server, tmp_path: Path
) -> None:
    callers = Sipp(
        "uac-speech-dtmf.xml", pool.sip_target, tmp_path / "twelve", calls=12, rate=10, limit=12
    ).start()
    wait_for(lambda: len(answered(pool)) == 12, 20, "12 answered calls")
    per_worker = Counter(c["worker"] for c in pool.live_calls())
    assert sorted(per_worker.values()) == [4, 4, 4], per_worker
    busy = Sipp("uac-busy.xml", pool.sip_target, tmp_path / "busy")
    assert busy.run() == 0, busy.errors()
    # Every worker refused it as full, and Kamailio tried each in turn.
    assert pool.metric("voicegate_calls_refused_total", reason="capacity", status="486") == 3
    assert pool.metric("voicegate_dispatcher_failovers_total") >= 2
    assert len(pool.live_calls()) == 12
    assert callers.wait() == 0, callers.errors()
    wait_for(
        lambda: pool.metric("voicegate_calls_total", outcome="completed") == 12,
        10,
        "12 completed calls in the pool's metrics",
    )
    # One /metrics sums the workers: 12 calls offered across three processes.
    assert pool.metric("voicegate_calls_offered_total") == 12
    assert pool.metric("voicegate_pool_workers", state="ready") == WORKERS
    sessions = pool.sessions()
    assert len(sessions) == 12
    assert {s["ended"]["terminal_state"] for s in sessions} == {"completed"}
    owners = Counter(s["owner"].split("/")[0] for s in sessions)
    assert sorted(owners) == ["worker-0.0", "worker-0.1", "worker-0.2"]


def test_a_worker_killed_during_calls_is_restarted_and_its_sessions_end(
    pool: Server, tmp_path: Path
) -> None:
    callers = Sipp(
        "uac-speech-dtmf.xml", pool.sip_target, tmp_path / "six", calls=6, rate=10, limit=6
    ).start()
    wait_for(lambda: len(answered(pool)) == 6, 20, "6 answered calls")
    victim = workers(pool)[0]
    victims = [c["call_id"] for c in pool.live_calls() if c["worker"] == victim["name"]]
    assert len(victims) == 2
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        now = workers(pool)[0]
        fresh = now["restarts"] == 1 and now["state"] == "ready" and now["pid"] != victim["pid"]
        return now if fresh else None

    now = wait_for(restarted, 30, "the killed worker to be restarted and ready")
    assert now["last_exit"] == -signal.SIGKILL
    assert now["owner"] != victim["owner"]
    # The new incarnation finalised what the dead one owned, at start-up.
    for call_id in victims:
        status, session = pool.http(f"/v1/sessions/{call_id}")
        assert status == 200, session
        assert (session["ended"]["terminal_state"], session["ended"]["stage"]) == (
            "failed",
            "process",
        )
    assert pool.metric("voicegate_sessions_reaped_total", why="predecessor") == 2
    assert (
        pool.metric("voicegate_pool_worker_restarts_total", worker=victim["name"], reason="exited")
        == 1
    )
    # The other four calls were untouched; the two on the dead worker could not end cleanly.
    assert callers.wait() != 0
    wait_for(
        lambda: pool.metric("voicegate_calls_total", outcome="completed") == 4,
        10,
        "the 4 other calls completed",
    )
    # New calls keep flowing, over all three workers again.
    after = Sipp(
        "uac-speech-dtmf.xml", pool.sip_target, tmp_path / "after", calls=6, rate=10, limit=6
    ).start()
    wait_for(lambda: len(answered(pool)) == 6, 20, "6 more answered calls")
    assert sorted(Counter(c["worker"] for c in pool.live_calls()).values()) == [2, 2, 2]
    assert after.wait() == 0, after.errors()
    ended = Counter(s["ended"]["terminal_state"] for s in pool.sessions())
    assert ended == {"completed": 10, "failed": 2}


def _pids_running(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has exited: it only waits to be reaped)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            running.append(pid)
    return running


def _kamailio_pids(pool: Server) -> list[int]:
    config = str(pool.data_dir / "run" / "kamailio.cfg")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):
                continue
            if config.encode() in argv:
                found.append(int(entry.name))
    return found


def test_a_supervisor_killed_outright_takes_its_workers_and_front_door_with_it(
    pool: Server,
) -> None:
    """SIGKILL runs no clean-up: the kernel's parent-death signal must stop the children, or they
    hold the SIP ports against the supervisor's restart."""
    children = [w["pid"] for w in workers(pool)] + _kamailio_pids(pool)
    assert len(children) > WORKERS, children  # Kamailio's main process and its own children
    assert pool.process is not None
    pool.process.kill()
    pool.process.wait(timeout=10)
    try:
        wait_for(lambda: _pids_running(children) == [] or None, 30, "every pool child to exit")
    finally:
        for pid in _pids_running(children):  # orphans of a failure must not hold ports
            os.kill(pid, signal.SIGKILL)


def test_a_worker_that_stops_answering_is_replaced(pool: Server) -> None:
    frozen = workers(pool)[1]
    # SIGSTOP: the process lives but answers nothing, as a worker wedged in a loop would.
    os.kill(frozen["pid"], signal.SIGSTOP)

    def replaced() -> dict[str, Any] | None:
        now = workers(pool)[1]
        return now if now["pid"] != frozen["pid"] and now["state"] == "ready" else None

    now = wait_for(replaced, 30, "the frozen worker to be replaced")
    assert now["last_exit"] == -signal.SIGKILL
    assert (
        pool.metric(
            "voicegate_pool_worker_restarts_total", worker=frozen["name"], reason="unresponsive"
        )
        == 1
    )
    # pool.health_failures (3) checks failed before the kill.
    assert pool.metric("voicegate_pool_health_check_failures_total", worker=frozen["name"]) >= 3
    assert ready_workers(pool) == WORKERS


def test_an_operator_hangs_up_a_call_through_the_supervisor(pool: Server, tmp_path: Path) -> None:
    caller = Sipp("uac-wait-for-bye.xml", pool.sip_target, tmp_path / "held").start()
    (call,) = wait_for(lambda: answered(pool), 10, "an answered call")
    status, body = pool.http(f"/v1/calls/{call['call_id']}")
    assert status == 200 and body["worker"] == call["worker"], body
    # An attended transfer's go-ahead and cancel go to the call's worker too (none to act on).
    for action in ("complete", "cancel"):
        assert pool.post(f"/v1/calls/{call['call_id']}/transfer/{action}") == 409, action
    # Something to say to the person: the body checked by the supervisor, the 409 the worker's.
    say = f"/v1/calls/{call['call_id']}/transfer/say"
    status, body = pool.post_json(say, {"text": "Hello", "prompt": "menu"})
    assert (status, body["field"]) == (400, "text"), body
    status, body = pool.post_json(say, {"text": "Hello"})
    assert (status, body["worker"]) == (409, call["worker"]), body
    assert pool.post(f"/v1/calls/{call['call_id']}/hangup") == 202
    assert caller.wait() == 0, caller.errors()  # the BYE came, routed back through Kamailio
    (session,) = pool.sessions()
    assert session["ended"]["terminal_state"] == "canceled"
    assert session["ended"]["reason"] == "hung up by operator"
    assert pool.post(f"/v1/calls/{call['call_id']}/hangup") == 404
    assert pool.post("/v1/calls/no-such-call/hangup") == 404


def test_sigterm_drains_the_pool_without_cutting_calls(
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    pool = server_factory("pool", **pool_env(VOICEGATE_SIP_DRAIN_DEADLINE_S="60"))
    wait_for(lambda: ready_workers(pool) == WORKERS, 30, "every worker ready")
    callers = Sipp(
        "uac-speech-dtmf.xml", pool.sip_target, tmp_path / "live", calls=3, rate=10, limit=3
    ).start()
    wait_for(lambda: len(answered(pool)) == 3, 20, "3 answered calls")
    pool.signal(signal.SIGTERM)
    wait_for(lambda: pool.http("/readyz")[0] == 503, 5, "the pool to say not ready")
    # The front door stops sending calls in: Kamailio itself answers 503.
    refused = Sipp("uac-refused.xml", pool.sip_target, tmp_path / "refused")
    assert refused.run() == 0, refused.errors()
    assert callers.wait() == 0, callers.errors()
    assert pool.wait_exit(30) == 0
    assert {s["terminal_state"] for s in pool.stored_sessions()} == {"completed"}
    assert len(pool.stored_sessions()) == 3


def test_a_pool_without_kamailio_says_how_to_install_it(tmp_path: Path) -> None:
    server = Server(tmp_path, env_overrides=pool_env(VOICEGATE_POOL_KAMAILIO="/nonexistent/kam"))
    result = subprocess.run(
        [sys.executable, "-m", "voicegate", "serve"],
        env=server.env,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 3
    assert "apt install kamailio" in result.stderr.decode()


def test_the_pool_places_outbound_calls_on_workers_with_a_free_slot(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    env = pool_env(
        2,
        VOICEGATE_POOL_CALLS_PER_WORKER="1",
        VOICEGATE_OUTBOUND_ALLOWED_TARGETS="sip:callee@127.0.0.1:*",
    )
    pool = server_factory("pool", **env)
    wait_for(lambda: ready_workers(pool) == 2, 30, "every worker ready")
    callees, placed = [], []
    for n in range(2):
        port = free_port()
        callees.append(Sipp("uas-no-answer.xml", "", tmp_path / f"callee{n}", port=port).start())
        status, body = pool.post_json("/v1/calls", {"target": f"sip:callee@{LOOPBACK}:{port}"})
        assert status == 202, body
        placed.append(body)
    # Each worker has one slot: the two legs went to different workers, and a third is refused.
    assert {p["worker"] for p in placed} == {w["name"] for w in workers(pool)}
    status, body = pool.post_json("/v1/calls", {"target": f"sip:callee@{LOOPBACK}:5"})
    assert status == 503, body
    assert body["error"] == "no worker has a free call slot"
    assert [w["answer"] for w in body["workers"]] == ["no free call slot"] * 2
    for leg in placed:
        assert pool.post(f"/v1/calls/{leg['call_id']}/hangup") == 202, (
            pool.http(f"/v1/calls/{leg['call_id']}"),
            pool.http("/v1/calls"),
        )  # CANCEL, via its worker
    for callee in callees:
        assert callee.wait() == 0, callee.errors()
    wait_for(lambda: len(pool.ended()) == 2 and all(pool.ended()), 15, "both legs to end")
    assert {e["terminal_state"] for e in pool.ended()} == {"canceled"}


def _proc_status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def _shared_dirty_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Shared_Dirty:"):
            return int(line.split()[1])
    raise AssertionError(f"no Shared_Dirty in /proc/{pid}/smaps_rollup")


def _fork_servers(pool: Server) -> list[int]:
    """The pool's fork server processes (voicegate/pool/forkserver.py), by their title."""
    assert pool.process is not None
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
                ppid = int(_proc_status(int(entry.name))["PPid"])
            except (FileNotFoundError, ProcessLookupError):
                continue
            if b"(fork server)" in argv and ppid == pool.process.pid:
                found.append(int(entry.name))
    return found


def test_workers_are_forked_from_the_fork_server_and_share_its_imports(pool: Server) -> None:
    """Forked, each worker is still the supervisor's child (adopted: the supervisor is a child
    subreaper), shows in ps as `voicegate worker --index N`, and shares the imported heap."""
    assert pool.process is not None
    assert len(_fork_servers(pool)) == 1, pool.log()[-3000:]
    for worker in workers(pool):
        pid = worker["pid"]
        assert int(_proc_status(pid)["PPid"]) == pool.process.pid, worker
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert f"-m voicegate worker --index {worker['index']}" in argv, argv
        # The import heap (about 50 MB) stays shared with the fork server and the other
        # workers; a worker started as its own interpreter shares almost nothing dirty.
        assert _shared_dirty_kib(pid) > 20 * 1024, (worker, _shared_dirty_kib(pid))


def _open_files_limit(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError(f"no open-files limit in /proc/{pid}/limits")


def test_a_killed_fork_server_is_replaced_and_takes_no_worker_with_it(
    pool: Server, tmp_path: Path
) -> None:
    before = workers(pool)
    [server] = _fork_servers(pool)
    os.kill(server, signal.SIGKILL)
    callers = Sipp(
        "uac-speech-dtmf.xml", pool.sip_target, tmp_path / "calls", calls=3, rate=10, limit=3
    ).start()
    wait_for(lambda: len(answered(pool)) == 3, 20, "3 answered calls, the fork server dead")
    assert [w["pid"] for w in workers(pool)] == [w["pid"] for w in before]
    assert callers.wait() == 0, callers.errors()
    # The next worker to start gets a new fork server.
    victim = before[2]
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        now = workers(pool)[2]
        return now if now["state"] == "ready" and now["pid"] != victim["pid"] else None

    now = wait_for(restarted, 30, "the killed worker to be restarted and ready")
    assert now["last_exit"] == -signal.SIGKILL
    assert len(_fork_servers(pool)) == 1 and _fork_servers(pool) != [server]
    assert _shared_dirty_kib(now["pid"]) > 20 * 1024


def test_workers_start_in_a_bounded_wave_with_the_open_files_they_need(
    server_factory: ServerFactory,
) -> None:
    """pool.start_concurrency = 1: each worker starts only once the one before it is ready, so
    that a large pool on a small machine does not start all its workers at once. And a pool
    started under the common soft limit of 1024 open files lifts it to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > 1024, "the test needs a hard limit above 1024 to see it lifted"
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        pool = server_factory("pool", **pool_env(VOICEGATE_POOL_START_CONCURRENCY="1"))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    wait_for(lambda: ready_workers(pool) == WORKERS, 30, "every worker ready")
    for worker in workers(pool):
        assert _open_files_limit(worker["pid"]) == (str(hard), str(hard)), worker
    order = [
        (e["event"], e["worker"])
        for e in pool.log_events()
        if e.get("event") in ("worker.started", "worker.ready")
    ]
    names = [w["name"] for w in workers(pool)]
    assert order == [
        (event, name) for name in names for event in ("worker.started", "worker.ready")
    ], order


def test_a_pool_without_the_fork_server_starts_each_worker_as_an_interpreter(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    pool = server_factory("pool", **pool_env(VOICEGATE_POOL_FORK_SERVER="false"))
    wait_for(lambda: ready_workers(pool) == WORKERS, 30, "every worker ready")
    assert _fork_servers(pool) == []
    callers = Sipp(
        "uac-speech-dtmf.xml", pool.sip_target, tmp_path / "calls", calls=3, rate=10, limit=3
    ).start()
    assert callers.wait() == 0, callers.errors()
    assert not any(e.get("event") == "pool.fork_server_started" for e in pool.log_events())
