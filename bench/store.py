"""Session store latency: what a call's "persist, then act" waits on, SQLite and PostgreSQL.

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/store.py                                  # both stores, 2000 operations each
    python bench/store.py --ops 500 --stores sqlite        # a quick look
    python bench/store.py --url postgresql://postgres@127.0.0.1:5432/benchdev   # that server
    python bench/store.py --ops 2000 --with-calls 100      # and again while 100 calls talk

Every step of a live call is persisted before its effects reach the world (session/durable.py):
the event loop hands the step's write to the process's one writer thread
(session/store/writer.py) and acts only once the write's future resolves. The writer runs one
write at a time, so the latency of one store call is what each step of a call waits on before it
acts (a prompt starts, a tool request leaves), and the writer's operations per second bound the
steps per second of every call of a worker together. Measured here, each writer on a store object
of its own, as the writer thread has:

- ``append``: one event per call, a tool intent's event with its effects (a few hundred bytes of
  JSON, the size is printed);
- ``append+checkpoint``: the writer's job for one step: the append, and every CHECKPOINT_EVERY
  events (session/durable.py) and at the session's end the session state's JSON besides; the
  steps that saved a checkpoint are shown again on their own;
- ``take_over``: the lease moving to a new owner (the reaper, start-up settlement, a rejoin);
- ``append+checkpoint`` with ``--threads`` writers at once (threads, each with its own store
  object writing its own sessions): the contention between the writers of a pool's workers, on
  SQLite's one write lock per file, on PostgreSQL's WAL flush. Threads of one process share the
  GIL, which sqlite3 and psycopg release while they wait on the disk or the server.

SQLite: a fresh file in the work directory (WAL, synchronous=FULL, as the runtime opens it).
PostgreSQL: a fresh database on a throw-away cluster (tests/pg_cluster.py: fsync and
synchronous_commit on), or the server ``--url`` names. The file systems are printed: fsync on a
tmpfs costs nothing and would flatter both.

``--with-calls N`` runs every measurement again while N talking SIPp callers hold calls in a pool
(bench/capacity.py's pool and callers) that keeps its sessions in the same database: its own SQLite
file, or the PostgreSQL database the pool is given by VOICEGATE_STORAGE_URL. The store then shares
the machine's cores with the media of N calls and its lock or its server with the pool's writers.

Each session of the measurements gets 100 events, the last one ending it (``completed``), so no
reaper of the pool takes a measured session over; a run ends every session it opened.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import shlex
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from capacity import (  # noqa: E402  (bench/, this script's directory)
    BridgeMedia,
    MachineCpu,
    Pool,
    count_sessions,
    place_calls,
    pool_settings,
    pool_workers,
)

from session import effects as fx  # noqa: E402
from session import events as ev  # noqa: E402
from session.durable import CHECKPOINT_EVERY  # noqa: E402
from session.state import SessionState  # noqa: E402
from session.store import (  # noqa: E402
    Checkpoint,
    EventRecord,
    Lease,
    SessionStore,
    StoreError,
)
from session.store.location import StoreLocation  # noqa: E402
from session.store.postgres import redact  # noqa: E402
from tests.pg_cluster import PgCluster, running_cluster  # noqa: E402

STORES = ("sqlite", "postgresql")
EVENTS_PER_SESSION = 100
OWNER = "bench-store"  # every session of the measurements is owned by "bench-store/..."
TAKE_OVER_SESSIONS = 50  # take_over goes round these
WARM_UP = 20  # untimed steps on a fresh store object: connection, caches, first pages


def _state(session_id: str, seq: int) -> dict[str, Any]:
    state = SessionState(session_id).to_dict()
    state["version"] = seq
    return state


def _event(session_id: str, seq: int) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """A tool intent's event and the effects the machine returns with it (their real shapes)."""
    key = f"{session_id}:turn-{seq // 4}:payments.charge:{seq}"
    digest = hashlib.sha256(key.encode()).hexdigest()
    event = ev.ToolIntent(
        key=key,
        tool="payments.charge",
        kind="write",
        digest=digest,
        turn_id=f"turn-{seq // 4}",
        arguments={
            "amount_cents": 12999,
            "currency": "EUR",
            "reference": f"order-{seq:06d}",
            "card_token": "tok_3f9c1a7e5b2d4c6f8a0e",
            "note": "annual plan renewal, as confirmed on the call",
        },
    )
    effects = [
        fx.SendToolRequest(key).to_dict(),
        fx.ScheduleTimer(f"tool:{key}", due=time.time() + 8.0, generation=3).to_dict(),
    ]
    return event.type, event.to_dict(), effects


@dataclass
class Result:
    store: str
    calls: int  # talking calls in the pool meanwhile (0: none)
    workload: str
    writers: int
    latencies_ns: list[int] = field(default_factory=list)
    wall_s: float = 0.0  # 0.0: a subset of another row's operations, no rate of its own
    errors: int = 0
    first_error: str = ""

    def ms(self, q: float) -> float:
        if not self.latencies_ns:
            return float("nan")
        ordered = sorted(self.latencies_ns)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] / 1e6

    def row(self) -> str:
        rate = f"{len(self.latencies_ns) / self.wall_s:>9.0f}" if self.wall_s else f"{'-':>9}"
        calls = str(self.calls) if self.calls else "-"
        return (
            f"  {self.store:<11}{calls:>6}  {self.workload:<24}{self.writers:>7}"
            f"{len(self.latencies_ns):>7}{self.ms(0.5):>9.2f}{self.ms(0.99):>9.2f}"
            f"{self.ms(1.0):>9.2f}{rate}{self.errors:>8}"
        )


HEADER = (
    f"  {'store':<11}{'calls':>6}  {'workload':<24}{'writers':>7}{'ops':>7}{'p50 ms':>9}"
    f"{'p99 ms':>9}{'max ms':>9}{'ops/s':>9}{'errors':>8}"
)


class Writer:
    """One writer's sessions on one store object: a session is created (untimed) when the last
    one ended, gets events at seq 1, 2, ... under its lease, and its 100th event ends it."""

    def __init__(self, store: SessionStore, tag: str) -> None:
        self.store = store
        self.owner = f"{OWNER}/{tag}-{uuid.uuid4().hex[:8]}"
        self.session: str | None = None
        self.lease = Lease(self.owner, 0)
        self.seq = 0

    def _create(self) -> str:
        session_id = f"{self.owner.replace('/', '-')}-{uuid.uuid4().hex[:12]}"
        self.lease = self.store.create(
            session_id, owner=self.owner, meta={"bench": "store"}, at=time.time()
        )
        self.session, self.seq = session_id, 0
        return session_id

    def step(self, checkpoint: bool) -> tuple[int, bool]:
        """One step, timed from the append's call to the checkpoint's return: (ns, whether it
        saved a checkpoint)."""
        session_id = self.session or self._create()
        self.seq += 1
        last = self.seq == EVENTS_PER_SESSION
        kind, payload, effects = _event(session_id, self.seq)
        now = time.time()
        record = EventRecord(session_id, self.seq, kind, payload, effects, now)
        saves = checkpoint and (self.seq % CHECKPOINT_EVERY == 0 or last)
        state = _state(session_id, self.seq) if saves else None
        began = time.perf_counter_ns()
        self.store.append(
            record,
            lease=self.lease,
            status="signaling confirmed, media flowing, agent up, gate open",
            terminal_state="completed" if last else None,
        )
        if state is not None:
            checkpoint_ = Checkpoint(session_id, self.seq, state, now)
            self.store.save_checkpoint(checkpoint_, lease=self.lease)
        elapsed = time.perf_counter_ns() - began
        if last:
            self.session = None
        return elapsed, saves

    def abandon(self) -> None:
        """After a failed write: the session's log is not what this writer thinks; start anew."""
        self.session = None

    def close(self) -> None:
        """End the session still open (untimed), so no reaper finds it later."""
        if self.session is None:
            return
        kind, payload, effects = _event(self.session, self.seq + 1)
        record = EventRecord(self.session, self.seq + 1, kind, payload, effects, time.time())
        with contextlib.suppress(StoreError):
            self.store.append(record, lease=self.lease, status="ended", terminal_state="completed")
        self.session = None


def run_steps(
    store: SessionStore, name: str, calls: int, ops: int, checkpoint: bool
) -> tuple[Result, Result | None]:
    """``ops`` single-writer steps; with ``checkpoint`` also the steps that saved one apart."""
    workload = "append+checkpoint" if checkpoint else "append"
    result = Result(name, calls, workload, 1)
    saved = Result(name, calls, "  (steps w/ checkpoint)", 1)
    writer = Writer(store, "single")
    began = time.perf_counter()
    try:
        for _ in range(ops):
            try:
                elapsed, saves = writer.step(checkpoint)
            except StoreError as error:
                result.errors += 1
                result.first_error = result.first_error or str(error)
                writer.abandon()
                continue
            result.latencies_ns.append(elapsed)
            if saves:
                saved.latencies_ns.append(elapsed)
        result.wall_s = time.perf_counter() - began
    finally:
        writer.close()
    return result, saved if checkpoint else None


def run_take_over(store: SessionStore, name: str, calls: int, ops: int) -> Result:
    """``ops`` take-overs, round a set of open sessions of one event each."""
    result = Result(name, calls, "take_over", 1)
    owner = f"{OWNER}/take-over-{uuid.uuid4().hex[:8]}"
    leases: dict[str, Lease] = {}
    for _ in range(min(TAKE_OVER_SESSIONS, ops)):
        session_id = f"{owner.replace('/', '-')}-{uuid.uuid4().hex[:12]}"
        lease = store.create(session_id, owner=owner, meta={"bench": "store"}, at=time.time())
        kind, payload, effects = _event(session_id, 1)
        store.append(
            EventRecord(session_id, 1, kind, payload, effects, time.time()),
            lease=lease,
            status="created",
        )
        leases[session_id] = lease
    sessions = list(leases)
    began = time.perf_counter()
    try:
        for i in range(ops):
            session_id = sessions[i % len(sessions)]
            t0 = time.perf_counter_ns()
            try:
                lease = store.take_over(session_id, owner=f"{owner}-{i % 7}", at=time.time())
            except StoreError as error:
                result.errors += 1
                result.first_error = result.first_error or str(error)
                continue
            result.latencies_ns.append(time.perf_counter_ns() - t0)
            leases[session_id] = lease
        result.wall_s = time.perf_counter() - began
    finally:
        for session_id, lease in leases.items():
            kind, payload, effects = _event(session_id, 2)
            with contextlib.suppress(StoreError):
                store.append(
                    EventRecord(session_id, 2, kind, payload, effects, time.time()),
                    lease=lease,
                    status="ended",
                    terminal_state="completed",
                )
    return result


def run_concurrent(
    open_store: Callable[[], SessionStore], name: str, calls: int, ops: int, threads: int
) -> Result:
    """``threads`` writers at once, each with its own store object and sessions, ``ops`` steps
    (append+checkpoint) between them; the rate is theirs together."""
    result = Result(name, calls, "append+checkpoint", threads)
    per_thread = max(1, ops // threads)
    start = threading.Barrier(threads + 1)
    lock = threading.Lock()

    def write(index: int) -> None:
        latencies: list[int] = []
        errors: list[str] = []
        store: SessionStore | None = None
        writer: Writer | None = None
        try:
            store = open_store()
            writer = Writer(store, f"thread{index}")
            for _ in range(WARM_UP):
                writer.step(True)
            writer.close()
        except Exception as error:  # reported with the figures; the other writers go on
            errors.append(f"opening or warming up: {error}")
            writer = None
        try:
            start.wait(timeout=120)
            if writer is not None:
                for _ in range(per_thread):
                    try:
                        elapsed, _ = writer.step(True)
                    except StoreError as error:
                        errors.append(str(error))
                        writer.abandon()
                        continue
                    latencies.append(elapsed)
                writer.close()
        except threading.BrokenBarrierError:
            errors.append("the writers' start barrier broke")
        finally:
            if store is not None:
                store.close()
            with lock:
                result.latencies_ns.extend(latencies)
                result.errors += len(errors)
                result.first_error = result.first_error or (errors[0] if errors else "")

    workers = [
        threading.Thread(target=write, args=(i,), name=f"bench-writer-{i}") for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    start.wait(timeout=120)
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    result.wall_s = time.perf_counter() - began
    return result


def measure(
    location: StoreLocation, name: str, calls: int, args: argparse.Namespace
) -> list[Result]:
    """Every workload on ``location``, printing each row as it is done."""
    results: list[Result] = []

    def done(result: Result | None) -> None:
        if result is not None:
            results.append(result)
            print(result.row(), flush=True)
            if result.first_error:
                print(f"      first error: {result.first_error}", flush=True)

    store = location.open()
    try:
        warm = Writer(store, "warm-up")
        for _ in range(WARM_UP):
            warm.step(True)
        warm.close()
        for result in run_steps(store, name, calls, args.ops, checkpoint=False):
            done(result)
        for result in run_steps(store, name, calls, args.ops, checkpoint=True):
            done(result)
        done(run_take_over(store, name, calls, args.ops))
    finally:
        store.close()
    done(run_concurrent(location.open, name, calls, args.ops, args.threads))
    return results


# --- where the stores are ---------------------------------------------------------------------


def filesystem(path: Path) -> str:
    """The type of the file system holding ``path`` (the longest mount point above it)."""
    best, kind = "", "?"
    resolved = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1]
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, kind = mount, parts[2]
    return kind


def describe_postgres(url: str) -> str:
    with psycopg.connect(url, connect_timeout=10) as db:
        row = db.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'),"
            " current_setting('wal_sync_method'), current_setting('shared_buffers')"
        ).fetchone()
    version, fsync, sync_method, shared_buffers = row or ("?", "?", "?", "?")
    return (
        f"PostgreSQL {version}, fsync={fsync}, wal_sync_method={sync_method}, "
        f"shared_buffers={shared_buffers} (the store sets synchronous_commit=on on its "
        "connections)"
    )


def payload_sizes() -> str:
    _, payload, effects = _event("bench-store-0123456789ab", 42)
    state = _state("bench-store-0123456789ab", 40)
    return (
        f"event: {len(json.dumps(payload)) + len(json.dumps(effects))} bytes of JSON "
        f"(payload {len(json.dumps(payload))}, effects {len(json.dumps(effects))}); checkpoint: "
        f"{len(json.dumps(state))} bytes; {EVENTS_PER_SESSION} events per session, a "
        f"checkpoint every {CHECKPOINT_EVERY} and at its end"
    )


@dataclass
class Target:
    """One store to measure: its name and where a quiet run's store lives."""

    name: str
    location: StoreLocation


# --- under calls ------------------------------------------------------------------------------


def under_calls(
    target: Target,
    args: argparse.Namespace,
    work: Path,
    cluster: PgCluster | None,
    quiet_s: float,
) -> list[Result]:
    """The measurements again while ``--with-calls`` callers talk in a pool sharing the store."""
    calls = args.with_calls
    workers = pool_workers(calls)
    url = ""
    if target.name == "postgresql":
        if cluster is not None:
            cluster.create_database("bench_calls")
            url = cluster.url("bench_calls")
        else:
            url = args.url
    media = BridgeMedia(quality=8, clock_rate=16000)  # capacity.py's defaults
    pool = Pool(work / f"calls-{target.name}", workers, media, pool_settings(storage_url=url))
    location = pool.store()
    # Long enough for every measurement under load (slower than on a quiet machine): the callers
    # hang up by themselves after it, and are killed if the pool stops first.
    hold_s = 4 * quiet_s + 60
    print(
        f"\n{target.name}, while {calls} calls talk in a pool of {workers} workers writing the "
        f"same store ({location.describe()}):",
        flush=True,
    )
    try:
        pool.start()
        callers = place_calls(pool, calls, work / f"calls-{target.name}", hold_s, "callers")
        try:
            time.sleep(2)  # every call's media settled
            held = pool.answered()
            machine = MachineCpu()
            began = time.monotonic()
            print(HEADER, flush=True)
            results = measure(location, target.name, held, args)
            took = time.monotonic() - began
            busy = machine.percent()
            held_after = pool.answered()
        finally:
            pool.server.stop()  # ends the calls (BYE): the callers then finish by themselves
            callers.kill()
    finally:
        pool.server.stop()
    print(
        f"  calls held: {held} when the measurements began, {held_after} when they ended "
        f"({took:.1f} s later); machine {busy:.0f}% busy meanwhile (all cores, whoever used "
        f"them), load average {os.getloadavg()[0]:.2f} after"
    )
    if held_after < held:
        print("  (some calls ended before the measurements did: their last part ran with fewer)")
    written = count_sessions(location, lambda s: not (s.owner or "").startswith(OWNER))
    print(f"  sessions the pool wrote to this store: {written}")
    if target.name == "postgresql":
        stray = count_sessions(StoreLocation("", location.sqlite_path))
        if stray:
            print(
                f"  WARNING: {stray} sessions in the pool's SQLite file: the pool did not write "
                "to PostgreSQL (is VOICEGATE_STORAGE_URL wired into the runtime?)"
            )
    return results


# --- main ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations per workload")
    parser.add_argument(
        "--stores", default=",".join(STORES), help="comma-separated: sqlite, postgresql"
    )
    parser.add_argument(
        "--url",
        help="an existing PostgreSQL database (postgresql://user@host:port/db) instead of a "
        "throw-away cluster; --with-calls points the pool at it too",
    )
    parser.add_argument("--threads", type=int, default=4, help="writers of the concurrent run")
    parser.add_argument(
        "--with-calls", type=int, default=0, metavar="N",
        help="then measure again while N talking calls run in a pool on the same store",
    )  # fmt: skip
    parser.add_argument("--work", help="keep the SQLite files and pool logs here (default: temp)")
    args = parser.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = [s for s in stores if s not in STORES]
    if unknown or not stores:
        parser.error(f"--stores: {unknown or 'none'}; choose from {', '.join(STORES)}")
    if args.ops < 1 or args.threads < 1 or args.with_calls < 0:
        parser.error("--ops and --threads must be at least 1, --with-calls at least 0")
    work = Path(args.work or tempfile.mkdtemp(prefix="voicegate-bench-store-"))
    work.mkdir(parents=True, exist_ok=True)

    print("reproduce: python " + shlex.join(["bench/store.py", *sys.argv[1:]]))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"machine: {os.cpu_count()} cores, load average {load} at start; python "
        f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"psycopg {psycopg.__version__}"
    )
    print(f"  work dir: {work}")
    print(f"  {payload_sizes()}")
    with contextlib.ExitStack() as stack:
        cluster: PgCluster | None = None
        targets: list[Target] = []
        for name in stores:
            if name == "sqlite":
                path = work / "quiet" / "store.sqlite3"
                targets.append(Target(name, StoreLocation("", path)))
                print(
                    f"  sqlite: {path} ({filesystem(work)}), WAL, synchronous=FULL, "
                    f"busy_timeout 5 s"
                )
                continue
            if args.url:
                url = args.url
                where = f"the server of --url {redact(url)}"
            else:
                cluster = stack.enter_context(running_cluster())
                cluster.create_database("bench_store")
                url = cluster.url("bench_store")
                where = (
                    f"a throw-away cluster on port {cluster.port} ({filesystem(cluster.directory)}"
                    f" {cluster.directory}, started in {cluster.start_seconds or 0:.1f} s)"
                )
            targets.append(Target(name, StoreLocation(url, work / "unused.sqlite3")))
            print(f"  postgresql: {where}; {describe_postgres(url)}")

        print(f"\nno pool running, {args.ops} operations per workload:")
        print(HEADER, flush=True)
        results: list[Result] = []
        quiet_s: dict[str, float] = {}
        for target in targets:
            began = time.monotonic()
            results += measure(target.location, target.name, 0, args)
            quiet_s[target.name] = time.monotonic() - began
        if args.with_calls:
            for target in targets:
                results += under_calls(target, args, work, cluster, quiet_s[target.name])

    print(
        f"\nall figures ({args.ops} operations per workload, {args.threads} concurrent writers; "
        f"load average {os.getloadavg()[0]:.2f} at the end):"
    )
    print(HEADER)
    for name in stores:
        for result in results:
            if result.store == name:
                print(result.row())
    print(
        "  calls: talking calls the pool held when the measurements began (-: no pool running).\n"
        "  p50/p99/max: latency of one call into the store, as the writer thread waits on it;\n"
        "  append+checkpoint: per step (its append, and its checkpoint when one is due).\n"
        "  ops/s: operations over the wall time of the run (its writers together, and the\n"
        "  untimed creation of a session every 100 events included)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
