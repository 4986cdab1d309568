"""What the PostgreSQL store promises beyond the shared contract (tests/unit/test_session_store.py):
under real concurrency, across a database that goes away, and without leaking its password.

The server is real (a throw-away cluster, tests/pg_cluster.py); each thread has its own store
object, so its own connection, as the writer threads of several machines would.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from session.resume import issue
from session.store import (
    EventRecord,
    Lease,
    LeaseLost,
    SequenceConflict,
    StoreUnavailable,
)
from session.store.migrations import POSTGRES_SCHEMA, SQLITE_SCHEMA
from session.store.postgres import Availability, PostgresSessionStore, redact
from tests.pg_cluster import PgCluster, running_cluster


def _event(session_id: str, seq: int, **payload: Any) -> EventRecord:
    return EventRecord(session_id, seq, "note", payload or {"n": seq}, [], 100.0 + seq)


def _race(url: str, session_id: str, writers: int, rounds: int, seed: int) -> list[Any]:
    """``writers`` threads, each round: all take the session over at once (a barrier), then
    append until fenced out. Returns each writer's (epochs, seqs written)."""
    barrier = threading.Barrier(writers)
    results: list[Any] = [None] * writers
    errors: list[BaseException] = []

    def run(writer: int) -> None:
        rng = random.Random(seed * 100 + writer)
        store = PostgresSessionStore(url)
        epochs, written = [], []
        try:
            for _ in range(rounds):
                barrier.wait(30)
                lease = store.take_over(session_id, owner=f"node-{writer}/x", at=1.0)
                epochs.append(lease.epoch)
                for _ in range(rng.randint(1, 4)):
                    summary = store.get(session_id)
                    assert summary is not None
                    seq = summary.last_seq + 1
                    try:
                        store.append(
                            _event(session_id, seq, writer=writer, epoch=lease.epoch),
                            lease=lease,
                            status=f"node {writer}",
                        )
                    except LeaseLost:
                        break
                    except SequenceConflict:
                        continue
                    written.append((seq, lease.epoch))
            results[writer] = (epochs, written)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            store.close()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return results


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writers=st.integers(2, 5), rounds=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_racing_take_overs_leave_one_writer_per_epoch_and_lose_no_append(
    pg_url: str, writers: int, rounds: int, seed: int
) -> None:
    store = PostgresSessionStore(pg_url)
    session_id = f"race-{writers}-{rounds}-{seed}"
    store.create(session_id, owner="node-origin/x", meta={}, at=0.0)
    try:
        results = _race(pg_url, session_id, writers, rounds, seed)
        log = store.events(session_id)
        summary = store.get(session_id)
    finally:
        store.close()
    assert summary is not None
    # Every take-over got its own epoch: never two holders of one.
    epochs = sorted(e for epochs, _ in results for e in epochs)
    assert epochs == list(range(2, 2 + writers * rounds))
    assert summary.lease_epoch == epochs[-1]
    # The log is exactly the appends that were accepted, in seq order, without gaps...
    accepted = sorted(
        (seq, writer, epoch)
        for writer, (_, written) in enumerate(results)
        for seq, epoch in written
    )
    assert [r.seq for r in log] == list(range(1, len(log) + 1)) == [a[0] for a in accepted]
    assert [(r.payload["writer"], r.payload["epoch"]) for r in log] == [
        (w, e) for _, w, e in accepted
    ]
    # ... and epochs never go back along it: a fenced-out writer wrote nothing after its fence.
    along = [r.payload["epoch"] for r in log]
    assert along == sorted(along)


def test_racing_handle_uses_rotate_once(pg_url: str) -> None:
    store = PostgresSessionStore(pg_url)
    store.create("s", owner="a/1", meta={}, at=0.0)
    first = issue("s", "default", now=0.0, ttl_s=60)
    store.record_handle(first.record)
    barrier = threading.Barrier(4)
    won: list[bool] = []

    def use(n: int) -> None:
        mine = PostgresSessionStore(pg_url)
        try:
            barrier.wait(30)
            successor = issue("s", "default", now=1.0, ttl_s=60)
            won.append(mine.use_handle(first.record.selector, successor.record))
        finally:
            mine.close()

    threads = [threading.Thread(target=use, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert sorted(won) == [False, False, False, True]
        assert store.handles_used("s") == 1
        with psycopg.connect(pg_url) as db:
            (current,) = db.execute(
                "SELECT COUNT(*) FROM resume_handles WHERE session_id = 's' AND state = 'current'"
            ).fetchone() or (0,)
        assert current == 1
    finally:
        store.close()


@pytest.fixture
def own_cluster() -> Iterator[PgCluster]:
    with running_cluster() as cluster:
        cluster.create_database("vg")
        yield cluster


def test_a_store_that_does_not_retry_says_unavailable_and_recovers(own_cluster: PgCluster) -> None:
    url = own_cluster.url("vg")
    availability = Availability()
    seen: list[bool] = []
    availability.watch(seen.append)
    store = PostgresSessionStore(url, availability=availability)
    store.create("s", owner="a/1", meta={}, at=0.0)
    own_cluster.kill()
    with pytest.raises(StoreUnavailable, match=r"unreachable|lost its connection"):
        store.get("s")
    assert availability.down_for() is not None
    own_cluster.restart()
    assert store.get("s") is not None  # a fresh connection, at once
    assert availability.down_for() is None
    assert seen == [False, True]
    store.close()


def test_a_retrying_write_waits_for_the_database_and_lands_once(own_cluster: PgCluster) -> None:
    url = own_cluster.url("vg")
    availability = Availability()
    writer = PostgresSessionStore(url, retry=True, availability=availability)
    lease = writer.create("s", owner="a/1", meta={}, at=0.0)
    writer.append(_event("s", 1), lease=lease, status="talking")
    own_cluster.kill()
    down = threading.Event()
    availability.watch(lambda available: down.set() if not available else None)
    done: list[BaseException | None] = []

    def append() -> None:
        try:
            writer.append(_event("s", 2), lease=lease, status="talking")
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=append)
    thread.start()
    assert down.wait(30), "the writer never noticed the database was gone"
    assert not done  # still waiting: nothing is lost, nothing is acted on
    own_cluster.restart()
    thread.join(60)
    assert done == [None]
    reader = PostgresSessionStore(url)
    try:
        assert [r.seq for r in reader.events("s")] == [1, 2]
    finally:
        reader.close()
        writer.close()


def test_a_commit_whose_answer_was_lost_is_not_written_twice(pg_url: str) -> None:
    # The append's COMMIT landed but its answer did not: the retry finds its own events there,
    # exactly as written, and returns instead of failing on a seq conflict or writing again.
    store = PostgresSessionStore(pg_url, retry=True)
    lease = store.create("s", owner="a/1", meta={}, at=0.0)
    record = _event("s", 1, n=1)
    real_commit = psycopg.Connection.commit
    calls = {"n": 0}

    def commit_then_drop(self: psycopg.Connection[Any]) -> None:
        real_commit(self)
        calls["n"] += 1
        if calls["n"] == 1:
            self.close()  # the answer is lost with the connection
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    psycopg.Connection.commit = commit_then_drop  # type: ignore[method-assign]
    try:
        store.append(record, lease=lease, status="talking")
    finally:
        psycopg.Connection.commit = real_commit  # type: ignore[method-assign]
    assert [r.seq for r in store.events("s")] == [1]
    with pytest.raises(SequenceConflict):  # a real second append of seq 1 still conflicts
        store.append(_event("s", 1, n=2), lease=lease, status="talking")
    store.close()


def test_every_connection_commits_synchronously(pg_url: str) -> None:
    store = PostgresSessionStore(pg_url)
    try:
        rows = store._read("SHOW synchronous_commit", ())
        assert rows == [("on",)]
    finally:
        store.close()


def test_a_password_never_reaches_a_message() -> None:
    url = "postgresql://voicegate:s3cret-pw@127.0.0.1:1/vg"
    assert redact(url) == "postgresql://voicegate:***@127.0.0.1:1/vg"
    in_query = "postgresql://127.0.0.1:1/vg?sslmode=disable&password=s3cret-pw"
    assert redact(in_query) == "postgresql://127.0.0.1:1/vg?sslmode=disable&password=***"
    with pytest.raises(StoreUnavailable) as refused:
        PostgresSessionStore(url, connect_timeout_s=1)
    assert "s3cret-pw" not in str(refused.value)
    assert "voicegate:***@127.0.0.1:1" in str(refused.value)
    # And a config error about the URL shows it without the password either.
    from config import ConfigError, load_settings

    with pytest.raises(ConfigError) as bad:
        load_settings(environ={"VOICEGATE_STORAGE_URL": "postgresql://u:s3cret-pw@/nodb"})
    assert "s3cret-pw" not in str(bad.value) and "storage.url" in str(bad.value)


def test_both_backends_keep_the_same_columns() -> None:
    def columns(schema: tuple[str, ...]) -> dict[str, list[str]]:
        tables: dict[str, list[str]] = {}
        for statement in schema:
            if not statement.startswith("CREATE TABLE"):
                continue
            name = statement.split()[2]
            body = statement[statement.index("(") + 1 :]
            tables[name] = [
                line.split()[0]
                for line in body.splitlines()
                if line.strip() and not line.strip().startswith(("PRIMARY", "position"))
            ]
        return tables

    assert columns(SQLITE_SCHEMA) == columns(POSTGRES_SCHEMA)


def test_a_lease_is_checked_in_the_transaction_that_writes(pg_url: str) -> None:
    # A take-over committed between another writer's read and its write: the write is refused.
    old = PostgresSessionStore(pg_url)
    new = PostgresSessionStore(pg_url)
    try:
        lease = old.create("s", owner="a/1", meta={}, at=0.0)
        assert old.get("s") is not None
        assert new.take_over("s", owner="b/1", at=1.0) == Lease("b/1", 2)
        with pytest.raises(LeaseLost):
            old.append(_event("s", 1), lease=lease, status="late")
        assert old.events("s") == []
    finally:
        old.close()
        new.close()
