"""A durable record of every call: offered, answered, ended, and the one terminal state it ended in.

SQLite in WAL mode. Each write commits before the call moves on, so a record survives a crash of the
process at any point after it was written. A terminal state, once written, is never overwritten
(seed 000: every session ends in exactly one terminal state).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

TERMINAL_STATES: Final = ("completed", "canceled", "timed_out", "failed", "needs_human")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    call_id        TEXT PRIMARY KEY,
    sip_call_id    TEXT NOT NULL,
    remote         TEXT NOT NULL,
    called_user    TEXT NOT NULL,
    transport      TEXT NOT NULL,
    started_at     REAL NOT NULL,
    answered_at    REAL,
    ended_at       REAL,
    terminal_state TEXT CHECK (terminal_state IN
        ('completed', 'canceled', 'timed_out', 'failed', 'needs_human')),
    stage          TEXT,
    reason         TEXT
);
CREATE INDEX IF NOT EXISTS calls_open ON calls (terminal_state) WHERE terminal_state IS NULL;
"""

_COLUMNS = (
    "call_id, sip_call_id, remote, called_user, transport, started_at, answered_at, ended_at,"
    " terminal_state, stage, reason"
)


@dataclass(frozen=True, slots=True)
class CallRecord:
    call_id: str
    sip_call_id: str
    remote: str
    called_user: str
    transport: str
    started_at: float
    answered_at: float | None
    ended_at: float | None
    terminal_state: str | None
    stage: str | None
    reason: str | None

    def as_json(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class UnknownTerminalState(ValueError):
    def __init__(self, state: str) -> None:
        super().__init__(f"unknown terminal state {state!r}; expected one of {TERMINAL_STATES}")


class CallRecordStore:
    """The ``calls`` table. One connection, used from one thread (the asyncio loop)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a record the caller was told about must survive power loss, not just a crash.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def offered(
        self,
        *,
        call_id: str,
        sip_call_id: str,
        remote: str,
        called_user: str,
        transport: str,
        at: float,
    ) -> None:
        self._db.execute(
            "INSERT INTO calls (call_id, sip_call_id, remote, called_user, transport, started_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (call_id, sip_call_id, remote, called_user, transport, at),
        )

    def answered(self, call_id: str, at: float) -> None:
        self._db.execute(
            "UPDATE calls SET answered_at = ? WHERE call_id = ? AND answered_at IS NULL",
            (at, call_id),
        )

    def ended(
        self, call_id: str, *, at: float, terminal_state: str, reason: str, stage: str | None = None
    ) -> bool:
        """Record the end of a call. Returns False if it already had a terminal state."""
        if terminal_state not in TERMINAL_STATES:
            raise UnknownTerminalState(terminal_state)
        cursor = self._db.execute(
            "UPDATE calls SET ended_at = ?, terminal_state = ?, reason = ?, stage = ?"
            " WHERE call_id = ? AND terminal_state IS NULL",
            (at, terminal_state, reason, stage, call_id),
        )
        return cursor.rowcount == 1

    def get(self, call_id: str) -> CallRecord | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM calls WHERE call_id = ?", (call_id,)
        ).fetchone()
        return CallRecord(*row) if row else None

    def recent(self, limit: int = 100) -> list[CallRecord]:
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM calls ORDER BY started_at DESC LIMIT ?", (limit,)
        ).fetchall()
        return [CallRecord(*row) for row in rows]

    def open_calls(self) -> list[CallRecord]:
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM calls WHERE terminal_state IS NULL ORDER BY started_at"
        ).fetchall()
        return [CallRecord(*row) for row in rows]

    def finalize_orphans(self, *, at: float, reason: str) -> list[str]:
        """End every call a previous process left open, as ``failed`` at stage ``process``.

        Called at start-up, before this process takes calls: an open record then can only belong
        to a process that died. Idempotent: finalised records are no longer open.
        """
        orphans = [record.call_id for record in self.open_calls()]
        for call_id in orphans:
            self.ended(call_id, at=at, terminal_state="failed", reason=reason, stage="process")
        return orphans
