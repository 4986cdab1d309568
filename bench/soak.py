"""Soak: an hour (or --minutes) of mixed calls through the pool, a worker killed now and then.

Prints figures, never passes or fails on time (STYLE.md; tests assert behaviour, benchmarks
measure). It exits 1 only for what must never happen, whatever the load: a payment charged twice,
or a session still open once the pool has stopped.

    python bench/soak.py                                   # 60 minutes, 4 workers, 8 calls
    python bench/soak.py --minutes 3 --kill-every-s 60     # a quick look
    python bench/soak.py --kill-every-s 0 --seed 7         # no kills, another mix

A pool (supervisor, ``--workers`` workers, Kamailio in front) and the reference payment provider
run as real processes. A loop keeps ``--concurrency`` SIPp callers on the line, one call each,
every one a scenario of ``sipp-scenarios/`` drawn from a weighted mix (MIX below): speech and DTMF,
a payment, a media gap that recovers or does not, re-INVITEs (handover, hold), the server or the
caller hanging up, a CANCEL while ringing, an unknown number refused 404. Every
``--kill-every-s`` a ready worker, drawn by the seed, gets SIGKILL; the supervisor restarts it.

Every ``--sample-every-s`` one line: calls started, ok and failed so far, live calls, sessions
open in the store, RSS and open file descriptors of the supervisor, the workers (sum and
largest) and Kamailio. At the end: per scenario ok and failed (a failure is the worker's kill
when its session was reaped, or it had none and was under way at a kill; anything else is
unexpected, with SIPp's last error lines), the sessions' terminal states, kills against
restarts, sessions left open after the pool stopped, the ledger's duplicate charges, and RSS
and fds first against last.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from session.store import SessionSummary  # noqa: E402
from session.store.sqlite import SqliteSessionStore  # noqa: E402
from tests.integration.harness import (  # noqa: E402
    Provider,
    Server,
    Sipp,
    free_port_block,
    rtp_range,
    wait_for,
)

MIB = 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")
# The one number the pool answers; SIPp's default called user (its [service]).
NUMBER = "service"
UNKNOWN_NUMBER = "999"


@dataclass(frozen=True)
class Scenario:
    name: str
    file: str
    weight: int
    extra: tuple[str, ...] = ()


# What a day of callers might look like, weighted; each file's header says what the server must
# do, and SIPp's exit status says whether it did.
MIX = (
    Scenario("speech+dtmf", "uac-speech-dtmf.xml", 22),
    Scenario("payment", "uac-payment.xml", 20),
    Scenario("gap recovers", "uac-media-gap-short.xml", 10),
    Scenario("gap too long", "uac-media-gap-long.xml", 3),
    Scenario("probe 481", "uac-media-gap-probe-481.xml", 3),
    Scenario("handover", "uac-reinvite-handover.xml", 10),
    Scenario("hold", "uac-hold-unhold.xml", 8),
    Scenario("server hangs up", "uac-server-hangup.xml", 8),
    Scenario("bye in gap", "uac-bye-during-gap.xml", 6),
    Scenario("cancel", "uac-cancel-before-answer.xml", 5),
    Scenario("unknown number", "uac-unknown-number.xml", 5, ("-s", UNKNOWN_NUMBER)),
)


# --- processes, from /proc ------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / MIB
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def pss_mib(pid: int) -> float:
    """Proportional set size: shared pages split among the processes that map them."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0


def kamailio_pids(root: int) -> list[int]:
    """Kamailio's processes below the supervisor (it forks one per listener and timer)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        pid = int(entry.name)
        names[pid] = name
        children[int(rest.split()[1])].append(pid)
    found, todo = [], list(children[root])
    while todo:
        pid = todo.pop()
        todo.extend(children[pid])
        if names.get(pid) == "kamailio":
            found.append(pid)
    return found


@dataclass
class Sample:
    at: float
    started: int
    ok: int
    failed: int
    live: int
    open_sessions: int
    supervisor: tuple[float, int]  # RSS MiB, fds
    workers_rss: tuple[float, float]  # sum, largest
    workers_fds: tuple[int, int]
    kamailio: tuple[float, int, int]  # PSS MiB summed, fds summed, processes
    restarts: int

    HEADER = (
        f"{'min':>5} {'calls':>6} {'ok':>6} {'fail':>5} {'live':>4} {'open':>4} "
        f"{'sup MiB/fd':>11} {'workers MiB sum/max':>20} {'fd sum/max':>11} "
        f"{'kamailio MiB/fd/n':>18} {'restarts':>8}"
    )

    def line(self) -> str:
        sup = f"{self.supervisor[0]:.0f}/{self.supervisor[1]}"
        wrss = f"{self.workers_rss[0]:.0f}/{self.workers_rss[1]:.0f}"
        wfds = f"{self.workers_fds[0]}/{self.workers_fds[1]}"
        kam = f"{self.kamailio[0]:.0f}/{self.kamailio[1]}/{self.kamailio[2]}"
        return (
            f"{self.at / 60:>5.1f} {self.started:>6} {self.ok:>6} {self.failed:>5} "
            f"{self.live:>4} {self.open_sessions:>4} {sup:>11} {wrss:>20} {wfds:>11} "
            f"{kam:>18} {self.restarts:>8}"
        )


# --- the pool and its callers ---------------------------------------------------------------------


class Pool:
    """``voicegate serve`` as a supervisor over ``workers`` workers, charging at ``provider``."""

    def __init__(self, work: Path, workers: int, provider: Provider) -> None:
        low, high = rtp_range(size=40 * workers)
        env = {
            "VOICEGATE_POOL_WORKERS": str(workers),
            "VOICEGATE_POOL_WORKER_SIP_PORT": str(free_port_block(workers)),
            "VOICEGATE_POOL_WORKER_HTTP_PORT": str(free_port_block(workers, udp_and_tcp=False)),
            "VOICEGATE_MEDIA_RTP_PORT_MIN": str(low),
            "VOICEGATE_MEDIA_RTP_PORT_MAX": str(high),
            "VOICEGATE_LOG_LEVEL": "info",
            # Every SIPp caller is one source (127.0.0.1), like a carrier trunk's address.
            "VOICEGATE_POOL_SOURCE_MAX_RATE": "0",
            # A restart on a busy 2-core machine can take longer than the default allows.
            "VOICEGATE_POOL_START_TIMEOUT_S": "120",
            # The refusal in the mix: any other called user is answered 404.
            "VOICEGATE_SIP_NUMBERS": NUMBER,
            # Calls ring for a second so that a caller can CANCEL before the answer.
            "VOICEGATE_SIP_ANSWER_AFTER_S": "1",
            # SIPp callers are silent between their steps (up to 2.5 s between uac-payment's
            # keys), which a phone never is: at 3 s the scenarios' deliberate gaps (5 s, for
            # good, 3 s before a BYE) and their silent tails are gaps, their key presses are not.
            "VOICEGATE_MEDIA_GAP_THRESHOLD_S": "3",
            **provider.tool_env(),
        }
        self.server = Server(work / "pool", env_overrides=env)
        self.workers = workers

    def start(self) -> None:
        self.server.start()
        wait_for(lambda: self.ready() == self.workers, 180, "every worker ready", 0.5)

    def snapshot(self) -> list[dict[str, Any]]:
        status, body = self.server.http("/v1/pool")
        return list(body["workers"]) if status == 200 else []

    def ready(self) -> int:
        return sum(1 for w in self.snapshot() if w["state"] == "ready")

    def live_calls(self) -> int:
        status, body = self.server.http("/v1/calls")
        return len(body["calls"]) if status == 200 else -1

    @property
    def store_path(self) -> Path:
        return self.server.data_dir / "voicegate.sqlite3"


@dataclass
class Call:
    index: int
    scenario: Scenario
    sipp: Sipp
    started: float
    ended: float = 0.0
    status: int | None = None

    @property
    def sip_call_id(self) -> str:
        # SIPp expands -cid_str's %u to its call number, 1 for a run of one call.
        return f"soak-{self.index}-1@127.0.0.1"


def start_call(index: int, scenario: Scenario, pool: Pool, work: Path, now: float) -> Call:
    sipp = Sipp(
        scenario.file,
        pool.server.sip_target,
        work / "calls" / f"{index:05d}",
        timeout_s=90,
        # A Call-ID of our own, to find the call's session in the store afterwards.
        extra=("-cid_str", f"soak-{index}-%u@%s", *scenario.extra),
    )
    return Call(index, scenario, sipp.start(), now)


@dataclass
class Kill:
    at: float
    worker: str
    pid: int


@dataclass
class Run:
    """What the soak saw while it ran."""

    started: float
    calls: list[Call] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def sample(run: Run, pool: Pool, store: SqliteSessionStore) -> Sample:
    assert pool.server.process is not None
    sup = pool.server.process.pid
    workers = pool.snapshot()
    pids = [int(w["pid"]) for w in workers if w["pid"]]
    rss = [rss_mib(p) for p in pids] or [0.0]
    fds = [open_fds(p) for p in pids] or [0]
    kam = kamailio_pids(sup)
    done = [c for c in run.calls if c.status is not None]
    return Sample(
        at=run.elapsed(),
        started=len(run.calls),
        ok=sum(1 for c in done if c.status == 0),
        failed=sum(1 for c in done if c.status != 0),
        live=pool.live_calls(),
        open_sessions=len(store.open_sessions()),
        supervisor=(rss_mib(sup), open_fds(sup)),
        workers_rss=(sum(rss), max(rss)),
        workers_fds=(sum(fds), max(fds)),
        # PSS, not RSS: Kamailio's processes share one memory pool, which RSS counts in each.
        kamailio=(sum(pss_mib(p) for p in kam), sum(open_fds(p) for p in kam), len(kam)),
        restarts=sum(int(w["restarts"]) for w in workers),
    )


def kill_a_worker(run: Run, pool: Pool, rng: random.Random) -> None:
    ready = [w for w in pool.snapshot() if w["state"] == "ready" and w["pid"]]
    if not ready:
        print(f"  {run.elapsed() / 60:5.1f} no ready worker to kill", flush=True)
        return
    victim = rng.choice(ready)
    os.kill(int(victim["pid"]), signal.SIGKILL)
    run.kills.append(Kill(run.elapsed(), victim["name"], int(victim["pid"])))
    print(f"  {run.elapsed() / 60:5.1f} SIGKILL {victim['name']} (pid {victim['pid']})", flush=True)


def reap_finished(run: Run, live: list[Call]) -> list[Call]:
    still = []
    for call in live:
        assert call.sipp.process is not None
        if call.sipp.process.poll() is None:
            still.append(call)
            continue
        call.status = call.sipp.wait(10)
        call.ended = run.elapsed()
        if call.status == 0:
            # Keep the traces of failures only: an hour is a few thousand calls.
            shutil.rmtree(call.sipp.work_dir, ignore_errors=True)
    return still


def soak(args: argparse.Namespace, pool: Pool, store: SqliteSessionStore, work: Path) -> Run:
    rng = random.Random(args.seed)
    weights = [s.weight for s in MIX]
    run = Run(started=time.monotonic())
    live: list[Call] = []
    end = args.minutes * 60
    next_sample, next_kill = 0.0, args.kill_every_s or float("inf")
    print(Sample.HEADER, flush=True)
    try:
        while run.elapsed() < end:
            live = reap_finished(run, live)
            # At most one new caller a tick: after a kill, many callers end at once, and their
            # replacements would otherwise arrive as a burst.
            if len(live) < args.concurrency:
                (scenario,) = rng.choices(MIX, weights)
                call = start_call(len(run.calls), scenario, pool, work, run.elapsed())
                run.calls.append(call)
                live.append(call)
            if run.elapsed() >= next_kill:
                kill_a_worker(run, pool, rng)
                next_kill += args.kill_every_s
            if run.elapsed() >= next_sample:
                run.samples.append(sample(run, pool, store))
                print(run.samples[-1].line(), flush=True)
                next_sample += args.sample_every_s
            time.sleep(0.25)
    except KeyboardInterrupt:
        print("  interrupted: no new calls, finishing the report", flush=True)
    # The callers on the line finish their scenarios (the longest takes about 40 s).
    deadline = time.monotonic() + 120
    while live and time.monotonic() < deadline:
        live = reap_finished(run, live)
        time.sleep(0.25)
    for call in live:
        call.sipp.kill()
        call.status, call.ended = -1, run.elapsed()
    run.samples.append(sample(run, pool, store))
    print(run.samples[-1].line(), flush=True)
    return run


# --- the report -----------------------------------------------------------------------------------


def all_sessions(store: SqliteSessionStore) -> Iterator[SessionSummary]:
    cursor = None
    while True:
        page, cursor = store.list(limit=500, cursor=cursor)
        yield from page
        if cursor is None:
            return


def reaped(store: SqliteSessionStore, session_id: str) -> bool:
    return any(e.type == "session_reaped" for e in store.events(session_id))


def classify(run: Run, store: SqliteSessionStore) -> dict[str, collections.Counter[str]]:
    """Per scenario: ok, failed at a kill, failed unexpectedly, and terminal states."""
    by_call_id = {s.meta.get("sip_call_id"): s for s in all_sessions(store)}
    tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    unexpected: list[Call] = []
    for call in run.calls:
        counts = tally[call.scenario.name]
        session = by_call_id.get(call.sip_call_id)
        counts[f"state {session.terminal_state if session else 'none'}"] += 1
        if call.status == 0:
            counts["ok"] += 1
            continue
        at_kill = any(call.started <= k.at <= call.ended for k in run.kills)
        # The kill's doing: the restarted worker reaped the session its predecessor held, or the
        # call never got a session because its INVITE went to the worker as it died.
        if (session is not None and reaped(store, session.session_id)) or (
            session is None and at_kill
        ):
            counts["failed at a kill"] += 1
        else:
            counts["failed unexpectedly"] += 1
            unexpected.append(call)
    for call in unexpected[:10]:
        errors = call.sipp.errors().strip().splitlines()
        print(f"  unexpected failure: call {call.index} {call.scenario.name}, SIPp "
              f"{call.status}: {' | '.join(errors[-3:])[:300]}")  # fmt: skip
    return tally


def duplicate_charges(rows: list[dict[str, Any]], store: SqliteSessionStore) -> tuple[int, str]:
    """Charges beyond the first, per idempotency key and per call, and a line saying so.

    The provider's UNIQUE key makes a second row for one key impossible; the key is counted
    anyway because it is the contract. A call is found from the key through voicegate's intent
    (the session that wrote it), else through the account the demo agent names after the call.
    """
    committed = [r for r in rows if r["status"] == "committed"]
    per_key = collections.Counter(r["key"] for r in rows)
    per_call: collections.Counter[str] = collections.Counter()
    unknown_keys = 0
    for row in committed:
        intent = store.intent(row["key"])
        if intent is None:
            unknown_keys += 1
        per_call[intent.session_id if intent else f"account {row['account']}"] += 1
    twice_by_key = sum(n - 1 for n in per_key.values() if n > 1)
    twice_by_call = sum(n - 1 for n in per_call.values() if n > 1)
    amounts = collections.Counter(r["amount_cents"] for r in committed)
    line = (
        f"ledger: {len(rows)} rows, {len(committed)} committed ({dict(amounts)} cents), "
        f"{sum(1 for r in rows if r['status'] == 'not_started')} not_started fences, "
        f"{unknown_keys} keys voicegate has no intent for; duplicates: {twice_by_key} by key, "
        f"{twice_by_call} by call"
    )
    return twice_by_key + twice_by_call, line


def report(run: Run, pool: Pool, provider: Provider, restarts: list[dict[str, Any]]) -> int:
    store = SqliteSessionStore(pool.store_path)
    try:
        print(f"\n{len(run.calls)} calls in {run.elapsed() / 60:.1f} min")
        tally = classify(run, store)
        print(f"  {'scenario':16} {'calls':>5} {'ok':>5} {'at kill':>7} {'unexpected':>10}  states")
        for scenario in MIX:
            c = tally.get(scenario.name, collections.Counter())
            states = ", ".join(
                f"{k[6:]} {v}" for k, v in sorted(c.items()) if k.startswith("state ")
            )
            total = sum(v for k, v in c.items() if k.startswith("state "))
            print(
                f"  {scenario.name:16} {total:>5} {c['ok']:>5} {c['failed at a kill']:>7} "
                f"{c['failed unexpectedly']:>10}  {states}"
            )
        print(
            "  states: the sessions' terminal states (none: refused before a session opened). "
            "At the 3 s gap\n  threshold a caller who hangs up after a silent tail (speech+dtmf, "
            "payment) ends canceled."
        )
        restarted = sum(int(w["restarts"]) for w in restarts)
        exits = ", ".join(f"{w['name']} {w['last_exit']}" for w in restarts)
        print(f"kills: {len(run.kills)}; worker restarts: {restarted} "
              f"({restarted - len(run.kills)} not ours); last exits: {exits}")  # fmt: skip
        left_open = store.open_sessions()
        print(f"sessions left open after the pool stopped: {len(left_open)}")
        for s in left_open[:10]:
            print(f"  {s.session_id} owner {s.owner}: {s.status}")
        duplicates, line = duplicate_charges(provider.ledger(), store)
        print(line)
        paid = sum(1 for c in run.calls if c.scenario.name == "payment" and c.status == 0)
        print(f"payment calls that passed: {paid}")
    finally:
        store.close()
    first, last = run.samples[0], run.samples[-1]
    print("memory and descriptors, first sample -> last:")
    print(f"  supervisor: RSS {first.supervisor[0]:.1f} -> {last.supervisor[0]:.1f} MiB, "
          f"fds {first.supervisor[1]} -> {last.supervisor[1]}")  # fmt: skip
    print(f"  workers: RSS sum {first.workers_rss[0]:.1f} -> {last.workers_rss[0]:.1f} MiB, "
          f"largest {first.workers_rss[1]:.1f} -> {last.workers_rss[1]:.1f} MiB; fds sum "
          f"{first.workers_fds[0]} -> {last.workers_fds[0]}, largest {first.workers_fds[1]} -> "
          f"{last.workers_fds[1]} (a restarted worker starts afresh)")  # fmt: skip
    print(f"  kamailio ({last.kamailio[2]} processes): PSS {first.kamailio[0]:.1f} -> "
          f"{last.kamailio[0]:.1f} MiB, fds {first.kamailio[1]} -> {last.kamailio[1]}")  # fmt: skip
    problems = []
    if duplicates:
        problems.append(f"{duplicates} duplicate charges")
    if left_open:
        problems.append(f"{len(left_open)} sessions left open")
    if problems:
        print("FAILED: " + " and ".join(problems) + " (both must be 0)")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long calls are started")
    parser.add_argument("--workers", type=int, default=4, help="worker processes in the pool")
    parser.add_argument("--concurrency", type=int, default=8, help="SIPp calls kept on the line")
    parser.add_argument(
        "--kill-every-s", type=float, default=300.0,
        help="SIGKILL a ready worker this often (0: never)",
    )  # fmt: skip
    parser.add_argument("--sample-every-s", type=float, default=30.0, help="one line this often")
    parser.add_argument("--seed", type=int, default=17, help="seed of the mix and of the victims")
    parser.add_argument("--work", help="keep logs, SIPp traces and the stores here (default: temp)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="voicegate-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"voicegate soak: {args.minutes:g} min, {args.workers} workers, {args.concurrency} calls "
        f"on the line, a kill every {args.kill_every_s:g} s, seed {args.seed}, "
        f"{os.cpu_count()} cores\n  work dir: {work}",
        flush=True,
    )
    provider = Provider(work / "provider").start()
    pool = Pool(work, args.workers, provider)
    try:
        pool.start()
        store = SqliteSessionStore(pool.store_path)
        try:
            run = soak(args, pool, store, work)
        finally:
            store.close()
        restarts = pool.snapshot()
        try:
            pool.server.stop()
        except AssertionError as exc:  # it did not stop on SIGTERM: say so, report anyway
            print(f"the pool did not stop cleanly: {str(exc)[:500]}")
        return report(run, pool, provider, restarts)
    finally:
        if pool.server.process is not None and pool.server.process.poll() is None:
            pool.server.process.kill()
        provider.stop()


if __name__ == "__main__":
    sys.exit(main())
