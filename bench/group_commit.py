"""The writer's group commit on SQLite: a pool's worth of processes writing one file.

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/group_commit.py                       # 50 processes x 4 calls, batched and not
    python bench/group_commit.py --procs 25 --seconds 20

Each process stands for a pool worker: one StoreWriter (session/store/writer.py) on the shared
SQLite file, as the runtime opens it (WAL, synchronous=FULL), and 4 calls. Every call writes a
burst of two events about every ``--every`` seconds (a caller's turn ends and the reply starts: two
steps of one call a few milliseconds apart, the commonest pair in bench/capacity.py's logs), about
the rate of a talking call there. Once with ``max_batch`` 1 (a transaction per write, as before
group commit) and once with the writer's default. Reported: commits per second (COMMIT statements
the connections ran), write latency from submit to the future resolving (what "persist, then act"
waits on), and writes that failed (SQLite's 5 s busy timeout: "database is locked").
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from session.store import EventRecord, Lease, SessionStore  # noqa: E402
from session.store.sqlite import SqliteSessionStore  # noqa: E402
from session.store.writer import MAX_BATCH, StoreWriter  # noqa: E402

CALLS = 4


def worker(
    index: int,
    path: Path,
    seconds: float,
    every: float,
    max_batch: int,
    start: float,
    spin: bool,
    switch_s: float | None,
    out: Any,
) -> None:
    if switch_s is not None:
        sys.setswitchinterval(switch_s)
    commits = [0]

    def open_store() -> SqliteSessionStore:
        store = SqliteSessionStore(path)
        store._db.set_trace_callback(
            lambda sql: commits.__setitem__(0, commits[0] + (sql == "COMMIT"))
        )
        return store

    writer = StoreWriter(open_store, max_batch=max_batch)
    rng = random.Random(index)
    names = [f"w{index}-c{n}-{max_batch}-{start}" for n in range(CALLS)]
    leases = [writer.submit(partial(create, name)).result() for name in names]
    seqs = [0] * CALLS
    latencies: list[float] = []
    failures: list[str] = []
    commits[0] = 0
    while time.time() < start:
        time.sleep(0.01)
    due = [time.monotonic() + rng.uniform(0, every) for _ in range(CALLS)]
    end = time.monotonic() + seconds

    def done(submitted: float) -> Any:
        def record(f: Future[None]) -> None:
            if f.exception() is not None:
                failures.append(str(f.exception()))
            else:
                latencies.append(time.monotonic() - submitted)

        return record

    while (now := time.monotonic()) < end:
        call = min(range(CALLS), key=due.__getitem__)
        if due[call] > now:
            if not spin:
                time.sleep(due[call] - now)
            continue
        for _ in range(2):
            seqs[call] += 1
            record = EventRecord(names[call], seqs[call], "turn_committed", {}, [], time.time())
            lease: Lease = leases[call]
            future = writer.submit(partial(append, record, lease))
            future.add_done_callback(done(time.monotonic()))
        due[call] += every * rng.uniform(0.8, 1.2)
    writer.flush()
    writer.close()
    out.put((latencies, failures, commits[0]))


def create(name: str, store: SessionStore) -> Lease:
    return store.create(name, owner="bench", meta={}, at=1.0)


def append(record: EventRecord, lease: Lease, store: SessionStore) -> None:
    store.append(record, lease=lease, status="active")


def run(
    procs: int,
    seconds: float,
    every: float,
    max_batch: int,
    path: Path,
    spin: bool,
    switch_s: float | None,
) -> str:
    out: Any = mp.get_context("fork").Queue()
    start = time.time() + 2.0
    workers = [
        mp.get_context("fork").Process(
            target=worker, args=(i, path, seconds, every, max_batch, start, spin, switch_s, out)
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    results = [out.get() for _ in workers]
    for w in workers:
        w.join()
    latencies = sorted(x for r in results for x in r[0])
    failures = [x for r in results for x in r[1]]
    commits = sum(r[2] for r in results)
    writes = len(latencies) + len(failures)

    def q(p: float) -> float:
        return float(latencies[min(len(latencies) - 1, int(p * len(latencies)))]) * 1000

    locked = sum("locked" in f for f in failures)
    return (
        f"  max_batch {max_batch:>3}: {writes / seconds:6.1f} writes/s, "
        f"{commits / seconds:6.1f} commits/s ({writes / max(1, commits):.2f} writes a commit), "
        f"latency p50 {q(0.5):6.1f} ms p99 {q(0.99):7.1f} ms max {latencies[-1] * 1000:7.1f} ms"
        f" (mean {statistics.fmean(latencies) * 1000:.1f}), failed {len(failures)}"
        f" ({locked} 'database is locked')"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--procs", type=int, default=50, help="writer processes (pool workers)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between a call's bursts")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs, in turns")
    parser.add_argument(
        "--burn", type=int, default=2,
        help="processes spinning on the CPU meanwhile (default 2: the saturated machine of "
        "bench/capacity.py's 200-call step, where writes timed out; 0: an idle machine)",
    )  # fmt: skip
    parser.add_argument(
        "--spin", action="store_true",
        help="each process's main thread runs Python between its writes instead of sleeping, "
        "as a saturated worker's event loop does: the writer thread then waits for the GIL at "
        "every step of its transaction, holding the file's write lock",
    )  # fmt: skip
    parser.add_argument(
        "--switch-interval", type=float, default=None,
        help="sys.setswitchinterval of each process, in seconds (default: Python's 0.005)",
    )  # fmt: skip
    args = parser.parse_args()
    rate = args.procs * CALLS * 2 / args.every
    print(
        f"group commit: {args.procs} processes x {CALLS} calls, a burst of 2 events per call "
        f"every {args.every:g} s (about {rate:.0f} writes/s), {args.seconds:g} s per run"
    )
    burners = [mp.get_context("fork").Process(target=burn, daemon=True) for _ in range(args.burn)]
    for b in burners:
        b.start()
    print(f"  {args.burn} CPU-bound processes alongside")
    try:
        with tempfile.TemporaryDirectory(prefix="voicegate-group-commit-") as tmp:
            print(f"  file: {tmp}/s.sqlite3")
            for _ in range(args.rounds):
                for max_batch in (1, MAX_BATCH):
                    path = Path(tmp) / "s.sqlite3"
                    result = run(
                        args.procs, args.seconds, args.every, max_batch, path, args.spin,
                        args.switch_interval,
                    )  # fmt: skip
                    print(result, flush=True)
    finally:
        for b in burners:
            b.kill()
    return 0


def burn() -> None:
    while True:
        pass


if __name__ == "__main__":
    sys.exit(main())
