"""The embedded session store: one SQLite file in WAL mode (ARCHITECTURE.md "The store").

Every write runs in ``BEGIN IMMEDIATE`` ... ``COMMIT``: the write lock is taken before the checks
are read, so two processes sharing the file can never interleave a read-check-write (a stale
writer gets SequenceConflict, not a forked log), and a lease is checked in the very transaction
that writes under it (a taken-over owner gets LeaseLost, never a late write). ``synchronous=FULL``
makes a returned write survive power loss, not just a crash of the process: intents and receipts
must (seed 000).
No column holds raw audio.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from session.store import (
    DEFAULT_TENANT,
    INTENT_KINDS,
    RECEIPT_OUTCOMES,
    Checkpoint,
    EventRecord,
    IdempotencyConflict,
    Lease,
    LeaseLost,
    SequenceConflict,
    SessionExists,
    SessionFinished,
    SessionSummary,
    StoreError,
    ToolIntent,
    ToolReceipt,
    UnknownIntent,
    UnknownSession,
    check_terminal_state,
)
from session.store import nodes as node_sql
from session.store.listing import list_where, open_where, page
from session.store.migrations import (
    CREATED_WHY,
    FIRST_VERSION,
    SCHEMA_VERSION,
    SQLITE_SCHEMA,
    SchemaTooOld,
    check,
    steps_from,
)
from session.store.nodes import NODE_STATES, NodeRecord
from session.store.rows import JSON_FIELDS, dump, names
from session.store.sqlite_resume import ResumeHandlesSql

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


# Each table's columns are named as its record's fields, so rows map to records one to one.
def _params(record: DataclassInstance) -> dict[str, object]:
    """Named SQL parameters for a record, its JSON fields serialized."""
    values = {name: getattr(record, name) for name in names(type(record))}
    return {k: dump(v) if k in JSON_FIELDS else v for k, v in values.items()}


def _insert(table: str, cls: type[DataclassInstance], verb: str = "INSERT") -> str:
    columns = names(cls)
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES (:{', :'.join(columns)})"


def _record(cls: type[R], row: Sequence[Any]) -> R:
    values = zip(names(cls), row, strict=True)
    return cls(**{k: json.loads(v) if k in JSON_FIELDS else v for k, v in values})


class SqliteSessionStore(ResumeHandlesSql):
    """``SessionStore`` on one SQLite file. One connection, used from the thread that opened it."""

    def __init__(self, path: Path, *, upgrade: bool = False, now: float | None = None) -> None:
        """Open (creating an empty file at the current schema version). A file at an older
        version raises SchemaTooOld unless ``upgrade`` (``voicegate migrate``), which steps it
        up in place, recording each version at ``now``; a newer one raises SchemaTooNew."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self._db = sqlite3.connect(
                path, isolation_level=None, timeout=5.0, check_same_thread=True
            )
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open session store {path}: {exc}") from exc
        try:
            self.found_version = self._prepare(upgrade, time.time() if now is None else now)
        except BaseException:
            self._db.close()
            raise

    def _version(self) -> int:
        has_table = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if has_table:
            (version,) = self._db.execute("SELECT MAX(version) FROM schema_version").fetchone()
            return int(version or 0)
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        return int(version)

    def _prepare(self, upgrade: bool, now: float) -> int:
        """Create or step up the schema; returns the version found. One transaction: two
        processes opening a file at once create or migrate it once, and a migration that fails
        leaves the file at its old version."""
        with self._write():
            found = self._version()
            if found == 0:
                for statement in SQLITE_SCHEMA:
                    self._db.execute(statement)
                self._record_version(SCHEMA_VERSION, CREATED_WHY, now)
            elif upgrade and FIRST_VERSION["sqlite"] <= found < SCHEMA_VERSION:
                for version, why, statements in steps_from("sqlite", found):
                    for statement in statements:
                        self._db.execute(statement)
                    self._record_version(version, why, now)
            elif found < FIRST_VERSION["sqlite"]:
                raise SchemaTooOld(str(self.path), found)
            check(str(self.path), self._version())
        return found

    def _record_version(self, version: int, why: str, now: float) -> None:
        if version >= 4:  # the table exists from version 4
            self._db.execute(
                "INSERT INTO schema_version (version, applied_at, why) VALUES (?, ?, ?)",
                (version, now, why),
            )
        # Kept in step for releases that read only the pragma: they refuse a newer file.
        self._db.execute(f"PRAGMA user_version={version}")

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction, holding the write lock from the start (BEGIN IMMEDIATE)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"session store busy or unavailable: {exc}") from exc
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"session store write failed: {exc}") from exc
            raise

    def _select(
        self, cls: type[R], table: str, where: str, params: Sequence[object]
    ) -> builtins.list[R]:
        sql = f"SELECT {', '.join(names(cls))} FROM {table} {where}"
        try:
            return [_record(cls, row) for row in self._db.execute(sql, params)]
        except sqlite3.Error as exc:
            raise StoreError(f"session store read failed: {exc}") from exc

    def _open_session(self, session_id: str, lease: Lease | None = None) -> int:
        """Inside a write: the last seq of a session that exists, honours ``lease`` (when given)
        and has not ended; else UnknownSession, LeaseLost, SessionFinished, in that order."""
        last_seq, terminal_state = self._fence(session_id, lease)
        if terminal_state is not None:
            raise SessionFinished(session_id, terminal_state)
        return last_seq

    def _fence(self, session_id: str, lease: Lease | None) -> tuple[int, str | None]:
        """Inside a write: last seq and terminal state of a session that honours ``lease``, if any.

        The write lock is held from here to COMMIT, so no take-over slips in between the check and
        the write it guards.
        """
        row = self._db.execute(
            "SELECT last_seq, terminal_state, owner, lease_epoch FROM sessions"
            " WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        if row is None:
            raise UnknownSession(session_id)
        last_seq, terminal_state, owner, epoch = row
        if lease is not None and (owner, epoch) != (lease.owner, lease.epoch):
            raise LeaseLost(session_id, lease, owner, epoch)
        return int(last_seq), terminal_state

    def close(self) -> None:
        self._db.close()

    # --- the node registry --------------------------------------------------------------------

    def node_heartbeat(self, record: NodeRecord) -> None:
        if record.state not in NODE_STATES:
            raise ValueError(f"node state {record.state!r} is not one of {NODE_STATES}")
        params = node_sql.heartbeat_params(record, dump(record.workers_json()))
        with self._write():
            self._db.execute(node_sql.heartbeat_sql("?"), params)

    def nodes(self) -> builtins.list[NodeRecord]:
        try:
            rows = self._db.execute(node_sql.select_sql()).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"session store read failed: {exc}") from exc
        return [_node(row, json.loads(row[3])) for row in rows]

    def claim_node(
        self, name: str, incarnation: str, *, by: str, at: float, dead_before: float
    ) -> bool:
        params = node_sql.claim_params(name, incarnation, by=by, at=at, dead_before=dead_before)
        with self._write():
            return self._db.execute(node_sql.claim_sql("?"), params).rowcount == 1

    def leave_node(self, name: str, incarnation: str, *, at: float) -> None:
        with self._write():
            self._db.execute(node_sql.leave_sql("?"), (at, name, incarnation))

    def create(
        self,
        session_id: str,
        *,
        owner: str,
        meta: Mapping[str, Any],
        at: float,
        tenant: str = DEFAULT_TENANT,
    ) -> Lease:
        lease = Lease(owner, 1)
        summary = SessionSummary(
            session_id, at, at, 0, owner, lease.epoch, "created", None, meta, tenant
        )
        params = _params(summary)
        with self._write():
            exists = "SELECT 1 FROM sessions WHERE session_id = ?"
            if self._db.execute(exists, (session_id,)).fetchone():
                raise SessionExists(session_id)
            self._db.execute(_insert("sessions", SessionSummary), params)
        return lease

    def append(
        self,
        record: EventRecord,
        *,
        lease: Lease,
        status: str,
        terminal_state: str | None = None,
    ) -> None:
        self.append_many([record], lease=lease, status=status, terminal_state=terminal_state)

    def append_many(
        self,
        records: Sequence[EventRecord],
        *,
        lease: Lease,
        status: str,
        terminal_state: str | None = None,
    ) -> None:
        check_terminal_state(terminal_state)
        if not records:
            raise ValueError("append_many needs at least one event")
        session_id = records[0].session_id
        if any(record.session_id != session_id for record in records):
            raise ValueError("append_many: all events must belong to one session")
        # Serialized before the lock is taken: a payload that is not JSON fails without a write.
        rows = [_params(record) for record in records]
        with self._write():
            last_seq = self._open_session(session_id, lease)
            for offset, record in enumerate(records):
                if record.seq != last_seq + 1 + offset:
                    raise SequenceConflict(session_id, record.seq, last_seq + offset)
            self._db.executemany(_insert("events", EventRecord), rows)
            # updated_at is the reaper's sign of life, compared across processes in wall-clock
            # time; an event's ``at`` is the writer's session time, which a wall-clock step can
            # leave behind a heartbeat. It never moves a newer heartbeat back.
            self._db.execute(
                "UPDATE sessions SET last_seq = ?, updated_at = MAX(updated_at, ?), status = ?,"
                " terminal_state = ? WHERE session_id = ?",
                (records[-1].seq, records[-1].at, status, terminal_state, session_id),
            )

    def touch(self, session_id: str, *, lease: Lease, at: float) -> bool:
        with self._write():
            cursor = self._db.execute(
                "UPDATE sessions SET updated_at = ? WHERE session_id = ? AND owner = ?"
                " AND lease_epoch = ? AND terminal_state IS NULL",
                (at, session_id, lease.owner, lease.epoch),
            )
            return cursor.rowcount == 1

    def take_over(self, session_id: str, *, owner: str, at: float) -> Lease:
        with self._write():
            self._open_session(session_id)
            self._db.execute(
                "UPDATE sessions SET owner = ?, lease_epoch = lease_epoch + 1, updated_at = ?"
                " WHERE session_id = ?",
                (owner, at, session_id),
            )
            select = "SELECT lease_epoch FROM sessions WHERE session_id = ?"
            (epoch,) = self._db.execute(select, (session_id,)).fetchone()
        return Lease(owner, int(epoch))

    def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> builtins.list[EventRecord]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        where = "WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        params = (session_id, after_seq, -1 if limit is None else limit)
        return self._select(EventRecord, "events", where, params)

    def save_checkpoint(self, checkpoint: Checkpoint, *, lease: Lease) -> None:
        params = _params(checkpoint)
        with self._write():
            last_seq, _ = self._fence(checkpoint.session_id, lease)
            if not 0 <= checkpoint.seq <= last_seq:
                raise StoreError(
                    f"session {checkpoint.session_id!r}: checkpoint at seq {checkpoint.seq}"
                    f" is outside the log (0..{last_seq})"
                )
            # A late save of an older checkpoint must not replace a newer one.
            self._db.execute(
                _insert("checkpoints", Checkpoint) + " ON CONFLICT (session_id) DO UPDATE SET"
                " seq = excluded.seq, state = excluded.state, at = excluded.at"
                " WHERE excluded.seq >= checkpoints.seq",
                params,
            )

    def latest_checkpoint(self, session_id: str) -> Checkpoint | None:
        found = self._select(Checkpoint, "checkpoints", "WHERE session_id = ?", (session_id,))
        return found[0] if found else None

    def get(self, session_id: str) -> SessionSummary | None:
        found = self._select(SessionSummary, "sessions", "WHERE session_id = ?", (session_id,))
        return found[0] if found else None

    def list(
        self,
        *,
        terminal_state: str | None = None,
        open_only: bool = False,
        status_prefix: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> tuple[builtins.list[SessionSummary], str | None]:
        sql, params = list_where(
            "?",
            terminal_state=terminal_state,
            open_only=open_only,
            status_prefix=status_prefix,
            limit=limit,
            cursor=cursor,
            tenant=tenant,
        )
        return page(self._select(SessionSummary, "sessions", sql, params), limit)

    def open_sessions(
        self, *, updated_before: float | None = None, owner_prefix: str | None = None
    ) -> builtins.list[SessionSummary]:
        where, params = open_where("?", updated_before=updated_before, owner_prefix=owner_prefix)
        return self._select(SessionSummary, "sessions", where, params)

    def record_intent(self, intent: ToolIntent) -> ToolIntent:
        if intent.kind not in INTENT_KINDS:
            raise ValueError(f"intent kind {intent.kind!r} is not one of {INTENT_KINDS}")
        params = _params(intent)
        with self._write():
            if stored := self.intent(intent.idempotency_key):
                if stored.session_id != intent.session_id:
                    raise IdempotencyConflict(intent.idempotency_key, "used by another session")
                if stored.digest != intent.digest:
                    raise IdempotencyConflict(intent.idempotency_key, "used with another digest")
                return stored
            self._open_session(intent.session_id)  # no new side effect once a session ended
            self._db.execute(_insert("tool_intents", ToolIntent), params)
        return _record(ToolIntent, builtins.list(params.values()))

    def record_receipt(self, receipt: ToolReceipt) -> ToolReceipt:
        if receipt.outcome not in RECEIPT_OUTCOMES:
            raise ValueError(f"outcome {receipt.outcome!r} is not one of {RECEIPT_OUTCOMES}")
        params = _params(receipt)
        key = receipt.idempotency_key
        with self._write():
            if self.intent(key) is None:
                raise UnknownIntent(key)
            if stored := self.receipt(key):
                if stored.outcome == receipt.outcome:
                    return stored
                # 'unknown' is no outcome yet (seed 000): a later status query may settle it.
                if stored.outcome != "unknown":
                    raise IdempotencyConflict(
                        key,
                        f"conflicting receipt: {receipt.outcome!r}, stored {stored.outcome!r}",
                        stored=stored.outcome,
                        offered=receipt.outcome,
                    )
            self._db.execute(_insert("tool_receipts", ToolReceipt, "INSERT OR REPLACE"), params)
        return _record(ToolReceipt, builtins.list(params.values()))

    def intent(self, key: str) -> ToolIntent | None:
        found = self._select(ToolIntent, "tool_intents", "WHERE idempotency_key = ?", (key,))
        return found[0] if found else None

    def receipt(self, key: str) -> ToolReceipt | None:
        found = self._select(ToolReceipt, "tool_receipts", "WHERE idempotency_key = ?", (key,))
        return found[0] if found else None

    def outstanding_intents(self, session_id: str) -> builtins.list[ToolIntent]:
        # 'unknown' receipts are kept as evidence, but the intent is still to be reconciled.
        where = (
            "WHERE session_id = ? AND NOT EXISTS (SELECT 1 FROM tool_receipts AS r"
            " WHERE r.idempotency_key = tool_intents.idempotency_key AND r.outcome != 'unknown')"
            " ORDER BY created_at, rowid"
        )
        return self._select(ToolIntent, "tool_intents", where, (session_id,))


def _node(row: Sequence[Any], workers: object) -> NodeRecord:
    name, incarnation, api_url, _, started_at, heartbeat_at, state, by, by_at = row
    return NodeRecord(
        name, incarnation, api_url, NodeRecord.workers_from(workers), started_at, heartbeat_at,
        state, by, by_at,
    )  # fmt: skip
