"""Migrations in one place for both stores (session/store/migrations.py), and what ``voicegate
migrate`` and ``serve`` do with a schema: the committed file of the release before the version
table migrates in place and keeps everything; a server refuses an older or newer schema with one
line; an empty store is created at the current version.

tests/fixtures/stores/release-v3.sqlite3 was written by the store of cbfb7e3 (schema version 3):
an ended session with a committed charge, an open session taken over once with an outstanding
intent and a current resume handle (tests/fixtures/stores/README.md).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from session.resume import issue
from session.store import EventRecord, Lease
from session.store.location import SQLITE_FILE, StoreLocation
from session.store.migrations import SCHEMA_VERSION, STEPS, SchemaTooNew, SchemaTooOld
from session.store.postgres import PostgresSessionStore
from session.store.sqlite import SqliteSessionStore

FIXTURE = Path(__file__).parents[1] / "fixtures" / "stores" / "release-v3.sqlite3"
ROOT = Path(__file__).parents[2]


def _release_copy(tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copyfile(FIXTURE, data_dir / SQLITE_FILE)
    return data_dir


def _voicegate(*args: str, data_dir: Path, url: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")}
    env |= {"VOICEGATE_STORAGE_DATA_DIR": str(data_dir), "VOICEGATE_STORAGE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "voicegate", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_steps_reach_the_current_version() -> None:
    assert [s.version for s in STEPS][-1] == SCHEMA_VERSION


def test_a_file_of_the_last_release_is_refused_until_migrated(tmp_path: Path) -> None:
    path = _release_copy(tmp_path) / SQLITE_FILE
    older = rf"version 3, older than the {SCHEMA_VERSION} .*run voicegate migrate"
    with pytest.raises(SchemaTooOld, match=older):
        SqliteSessionStore(path)
    with sqlite3.connect(path) as db:  # refused without a write
        assert db.execute("PRAGMA user_version").fetchone() == (3,)
    db.close()


def test_voicegate_migrate_steps_the_release_file_up_in_place_keeping_everything(
    tmp_path: Path,
) -> None:
    data_dir = _release_copy(tmp_path)
    refused = _voicegate("serve", data_dir=data_dir)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert f"schema version 3, older than the {SCHEMA_VERSION}" in line
    assert "run voicegate migrate" in line

    migrated = _voicegate("migrate", data_dir=data_dir)
    assert migrated.returncode == 0, migrated.stderr
    assert f"from version 3 to {SCHEMA_VERSION}" in migrated.stdout
    again = _voicegate("migrate", data_dir=data_dir)
    assert "nothing to do" in again.stdout

    store = SqliteSessionStore(data_dir / SQLITE_FILE)
    try:
        ended = store.get("s-ended")
        assert ended is not None and ended.terminal_state == "completed"
        assert (ended.tenant, ended.lease_epoch, ended.last_seq) == ("main", 1, 4)
        assert [r.seq for r in store.events("s-ended")] == [1, 2, 3, 4]
        checkpoint = store.latest_checkpoint("s-ended")
        assert checkpoint is not None and checkpoint.seq == 4
        receipt = store.receipt("k-paid")
        assert receipt is not None and receipt.outcome == "committed"
        assert receipt.detail == {"charge_id": "ch_1"}
        opened = store.get("s-open")
        assert opened is not None and (opened.owner, opened.lease_epoch) == (
            "worker-1/cccccccccccc",
            2,
        )
        assert [i.idempotency_key for i in store.outstanding_intents("s-open")] == ["k-open"]
        # The handle issued by the old release still rotates on the new one.
        old = issue(
            "s-open", "default", now=2003.0, ttl_s=600, token_bytes=lambda n: bytes(range(n))
        )
        record = store.resume_handle(old.record.selector)
        assert record is not None and record.state == "current"
        successor = issue("s-open", "default", now=2004.0, ttl_s=600)
        assert store.use_handle(old.record.selector, successor.record)
        # And the session goes on at its lease.
        lease = Lease("worker-1/cccccccccccc", 2)
        store.append(EventRecord("s-open", 3, "note", {}, [], 2005.0), lease=lease, status="on")
    finally:
        store.close()
    fresh = tmp_path / "fresh.sqlite3"
    SqliteSessionStore(fresh).close()
    assert _schema(data_dir / SQLITE_FILE) == _schema(fresh)


def _schema(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master ORDER BY name")]
        columns = [
            (name, str(column[1:4]))
            for name in names
            for column in db.execute(f"PRAGMA table_info({name})").fetchall()
        ]
        versions = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    db.close()
    assert versions == (SCHEMA_VERSION,)
    return columns


def test_an_empty_store_is_created_at_the_current_version(tmp_path: Path, pg_url: str) -> None:
    for location in (StoreLocation("", tmp_path / SQLITE_FILE), StoreLocation(pg_url, tmp_path)):
        assert location.migrate() == (0, SCHEMA_VERSION)
        assert location.migrate() == (SCHEMA_VERSION, SCHEMA_VERSION)
    with psycopg.connect(pg_url) as db:
        rows = db.execute("SELECT version, why FROM schema_version").fetchall()
    assert rows == [(SCHEMA_VERSION, "created at this version")]


def test_postgres_refuses_a_newer_schema_and_migrate_leaves_it(pg_url: str) -> None:
    PostgresSessionStore(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("INSERT INTO schema_version VALUES (%s, 0, 'later')", (SCHEMA_VERSION + 1,))
    for upgrade in (False, True):
        with pytest.raises(SchemaTooNew, match=f"version {SCHEMA_VERSION + 1}, newer than"):
            PostgresSessionStore(pg_url, upgrade=upgrade)


def test_nodes_creating_one_database_at_once_create_it_once(pg_url: str) -> None:
    import threading

    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_it() -> None:
        try:
            barrier.wait(30)
            PostgresSessionStore(pg_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    with psycopg.connect(pg_url) as db:
        assert db.execute("SELECT COUNT(*) FROM schema_version").fetchone() == (1,)


def test_a_store_that_is_not_voicegates_is_refused(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("CREATE TABLE sessions (id int)")
    with pytest.raises(Exception, match="without a schema_version"):
        PostgresSessionStore(pg_url)


def test_serve_refuses_an_unreachable_store_in_one_line(tmp_path: Path) -> None:
    refused = _voicegate(
        "serve", data_dir=tmp_path, url="postgresql://voicegate:pw-not-shown@127.0.0.1:1/vg"
    )
    assert refused.returncode == 3
    (line,) = refused.stderr.strip().splitlines()
    assert "unreachable" in line and "pw-not-shown" not in line
