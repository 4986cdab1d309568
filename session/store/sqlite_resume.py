"""The resume-handle half of :class:`~session.store.sqlite.SqliteSessionStore` (the contract is
``SessionStore.record_handle`` / ``resume_handle`` / ``use_handle``).

One row per handle ever issued, by selector (the table is in session/store/migrations.py); a
session has at most one ``current`` row (a partial unique index holds that even against a racing
writer). Rotation is a compare-and-set on the
state inside one write transaction, so of two calls presenting one handle at once exactly one
rotates it and the other learns it was used.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from session.resume import RecordState, ResumeRecord
from session.store import SessionFinished, StoreError, UnknownSession

_COLUMNS = "selector, verifier_digest, session_id, tenant, issued_at, expires_at, state"


class _Db(Protocol):
    _db: sqlite3.Connection

    def _write(self) -> AbstractContextManager[None]: ...


class ResumeHandlesSql:
    """Mixed into the SQLite store: uses its connection and its write transactions."""

    def record_handle(self: _Db, record: ResumeRecord) -> None:
        with self._write():
            _issue(self._db, record)

    def resume_handle(self: _Db, selector: str) -> ResumeRecord | None:
        sql = f"SELECT {_COLUMNS} FROM resume_handles WHERE selector = ?"
        try:
            row = self._db.execute(sql, (selector,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"session store read failed: {exc}") from exc
        return ResumeRecord(*row) if row else None

    def handles_used(self: _Db, session_id: str) -> int:
        sql = "SELECT COUNT(*) FROM resume_handles WHERE session_id = ? AND state = ?"
        try:
            (count,) = self._db.execute(sql, (session_id, RecordState.USED.value)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"session store read failed: {exc}") from exc
        return int(count)

    def use_handle(self: _Db, selector: str, successor: ResumeRecord) -> bool:
        with self._write():
            row = self._db.execute(
                "SELECT session_id, tenant FROM resume_handles WHERE selector = ? AND state = ?",
                (selector, RecordState.CURRENT.value),
            ).fetchone()
            if row is None:
                return False
            if (successor.session_id, successor.tenant) != tuple(row):
                raise ValueError("a successor belongs to the same session and tenant")
            self._db.execute(
                "UPDATE resume_handles SET state = ? WHERE selector = ?",
                (RecordState.USED.value, selector),
            )
            _issue(self._db, successor)
        return True


def _issue(db: sqlite3.Connection, record: ResumeRecord) -> None:
    """Inside a write: supersede the session's current handle, keep ``record`` current."""
    found = db.execute(
        "SELECT terminal_state FROM sessions WHERE session_id = ?", (record.session_id,)
    ).fetchone()
    if found is None:
        raise UnknownSession(record.session_id)
    if found[0] is not None:
        raise SessionFinished(record.session_id, found[0])
    db.execute(
        "UPDATE resume_handles SET state = ? WHERE session_id = ? AND state = ?",
        (RecordState.SUPERSEDED.value, record.session_id, RecordState.CURRENT.value),
    )
    try:
        db.execute(
            f"INSERT INTO resume_handles ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (*_values(record), RecordState.CURRENT.value),
        )
    except sqlite3.IntegrityError as exc:
        raise StoreError("resume handle selector already stored") from exc


def _values(record: ResumeRecord) -> Iterator[object]:
    yield from (
        record.selector,
        record.verifier_digest,
        record.session_id,
        record.tenant,
        record.issued_at,
        record.expires_at,
    )
