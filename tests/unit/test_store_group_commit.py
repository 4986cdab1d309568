"""The writer's group commit (session/store/writer.py): writes that queued behind a slow one share
one SQLite transaction, each keeps its own atomicity in it, and no future resolves before the
transaction committed."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from session.store import EventRecord, Lease, LeaseLost, StoreError
from session.store.sqlite import SqliteSessionStore
from session.store.writer import StoreWriter


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "s.sqlite3"


@pytest.fixture
def writer(path: Path) -> Iterator[StoreWriter]:
    w = StoreWriter(lambda: SqliteSessionStore(path), name="test-writer")
    yield w
    w.close()


def held_up(writer: StoreWriter) -> threading.Event:
    """A slow write at the head of the queue: what is submitted next queues up behind it."""
    disk = threading.Event()
    started = threading.Event()

    def slow(_: Any) -> None:
        started.set()
        assert disk.wait(10), "the test never let the slow write finish"

    writer.submit(slow)
    assert started.wait(10), "the writer never started the slow write"
    return disk


def visible(path: Path) -> set[str]:
    """Sessions a separate connection sees: only what has committed."""
    db = sqlite3.connect(path)
    try:
        return {row[0] for row in db.execute("SELECT session_id FROM sessions")}
    finally:
        db.close()


def event(session_id: str, seq: int) -> EventRecord:
    return EventRecord(session_id, seq, "call_answered", {}, [], 2.0)


def create(session_id: str) -> Any:
    return lambda store: store.create(session_id, owner="w/1", meta={}, at=1.0)


def test_writes_that_queued_up_commit_together_and_resolve_only_after(
    writer: StoreWriter, path: Path
) -> None:
    disk = held_up(writer)
    created = [writer.submit(create(s)) for s in ("c1", "c2", "c3")]
    seen_inside: Future[set[str]] = writer.submit(lambda store: visible(path))
    assert not any(f.done() for f in created)
    disk.set()
    assert [f.result(10) for f in created] == [Lease("w/1", 1)] * 3
    # Inside the batch, after all three ran, another connection saw none of them: one
    # transaction, not three.
    assert seen_inside.result(10) == set()
    assert visible(path) == {"c1", "c2", "c3"}


def test_a_refused_write_in_a_batch_leaves_the_others_written(
    writer: StoreWriter, path: Path
) -> None:
    for s in ("c1", "c2", "c3"):
        writer.submit(create(s)).result(10)
    lease, stolen = Lease("w/1", 1), Lease("w/2", 7)
    disk = held_up(writer)
    ok1 = writer.submit(lambda store: store.append(event("c1", 1), lease=lease, status="active"))
    refused = writer.submit(
        lambda store: store.append(event("c2", 1), lease=stolen, status="active")
    )
    ok3 = writer.submit(lambda store: store.append(event("c3", 1), lease=lease, status="active"))
    disk.set()
    ok1.result(10)
    ok3.result(10)
    with pytest.raises(LeaseLost):
        refused.result(10)
    reader = SqliteSessionStore(path)
    try:
        assert [len(reader.events(s)) for s in ("c1", "c2", "c3")] == [1, 0, 1]
    finally:
        reader.close()


def test_a_commit_that_fails_fails_every_write_of_the_batch(
    writer: StoreWriter, path: Path
) -> None:
    def orphan_event(store: Any) -> None:
        # A real COMMIT failure: a foreign key checked only at COMMIT, broken by an event of
        # a session that does not exist.
        store._db.execute("PRAGMA defer_foreign_keys=ON")
        store._db.execute(
            "INSERT INTO events (session_id, seq, type, payload, effects, at)"
            " VALUES ('nobody', 1, 'call_answered', '{}', '[]', 1.0)"
        )

    disk = held_up(writer)
    created = writer.submit(create("c1"))
    broken = writer.submit(orphan_event)
    disk.set()
    for future in (created, broken):
        with pytest.raises(StoreError, match="FOREIGN KEY"):
            future.result(10)
    assert visible(path) == set()
    # The writer goes on: the next write commits on its own.
    assert writer.submit(create("c2")).result(10) == Lease("w/1", 1)
    assert visible(path) == {"c2"}
