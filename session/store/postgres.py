"""The shared session store: PostgreSQL through psycopg 3 (ARCHITECTURE.md "The store").

Several machines write one database, so every guarantee SQLite gets from its single write lock is
made explicit here, inside the transaction that writes:

- fencing: a write under a lease first locks the session's row (``SELECT ... FOR UPDATE``) and
  compares owner and epoch there; a take-over bumps the epoch under the same row lock. Two
  writers racing for one session queue on that lock, so of two holders of one epoch only one
  appends at a given seq, and a taken-over owner's late write is refused (LeaseLost) and changes
  nothing;
- persist, then act: every call returns only after COMMIT with ``synchronous_commit = on`` (set
  on each connection, whatever the server's default), so what a caller acts on is on disk;
- resume handles rotate by compare-and-set on the handle's state under the session's row lock,
  and receipts settle under their intent's row lock: of two racing calls exactly one wins.

A connection that breaks raises :class:`~session.store.StoreUnavailable`, or, for a store opened
with ``retry`` (the writer's), is re-opened with a bounded backoff until the database answers,
and the write is run again. A commit whose answer was lost may have landed: each write first asks
whether it did (its event, intent or handle is there, exactly as written) and then returns as if
it had just committed, so a repeated write never writes twice.

A URL's password is never put in a message or a log line; libpq also takes it from
``PGPASSWORD`` or a passfile, which is what docs/storage.md recommends.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.types.json import Json

from session.resume import RecordState, ResumeRecord
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
    StoreUnavailable,
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
    POSTGRES_SCHEMA,
    SCHEMA_VERSION,
    SchemaTooOld,
    check,
    steps_from,
)
from session.store.nodes import NODE_STATES, NodeRecord
from session.store.rows import JSON_FIELDS, dump, names

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger("voicegate.store")

R = TypeVar("R", bound="DataclassInstance")
T = TypeVar("T")

# Serialization failures and deadlocks: the transaction did nothing and may simply run again.
_RETRY_SQLSTATES = frozenset({"40001", "40P01"})
# Every migration of one database runs under this advisory lock, so two nodes migrating at once
# apply each step once.
_MIGRATION_LOCK = 0x766F6963  # "voic"
_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


def redact(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` parameter), for
    messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://(unparseable URL)"
    if parts.query:
        query = "&".join(
            f"{name}=***" if name.lower() == "password" else f"{name}{eq}{value}"
            for name, eq, value in (p.partition("=") for p in parts.query.split("&"))
        )
        parts = parts._replace(query=query)
    if parts.password is None:
        return urlunsplit(parts)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class Availability:
    """Whether the database answers, shared by every store object of a process (thread-safe).

    The runtime reads it to refuse new calls and turn ``/readyz`` to 503 while the database is
    away, and to end calls that could not persist for ``storage.unavailable_deadline_s``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self.outages = 0
        self.stopping = threading.Event()  # set at shutdown: a retrying write gives up
        self._watchers: list[Callable[[bool], None]] = []

    def watch(self, changed: Callable[[bool], None]) -> None:
        """Call ``changed(available)`` at each change, from the thread that noticed it."""
        self._watchers.append(changed)

    def down(self) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = self._clock()
            self.outages += 1
        for changed in self._watchers:
            changed(False)

    def up(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            self._down_since = None
        for changed in self._watchers:
            changed(True)

    def down_for(self) -> float | None:
        """Seconds since the database stopped answering; None while it answers."""
        with self._lock:
            return None if self._down_since is None else self._clock() - self._down_since


def _params(record: DataclassInstance) -> dict[str, object]:
    """Named parameters for a record; JSON fields serialized now, so a value that is not JSON
    fails before any transaction starts."""
    values = {name: getattr(record, name) for name in names(type(record))}
    return {k: Json(dump(v), dumps=str) if k in JSON_FIELDS else v for k, v in values.items()}


def _insert(table: str, cls: type[DataclassInstance]) -> str:
    columns = names(cls)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES (%({')s, %('.join(columns)})s)"


def _record(cls: type[R], row: Sequence[Any]) -> R:
    return cls(**dict(zip(names(cls), row, strict=True)))


class _Lost(Exception):
    """Internal: the connection broke; ``committed`` is None when a COMMIT's answer was lost."""

    def __init__(self, cause: BaseException, committed: bool | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.committed = committed


class PostgresSessionStore:
    """``SessionStore`` on a PostgreSQL database. One connection, used by one thread at a time.

    ``retry``: when the database is away, wait for it (backoff, until ``availability.stopping``)
    instead of raising StoreUnavailable: for the writer thread, whose queue holds the writes in
    order meanwhile. ``upgrade``: step an older schema up (``voicegate migrate``).
    """

    def __init__(
        self,
        url: str,
        *,
        upgrade: bool = False,
        retry: bool = False,
        availability: Availability | None = None,
        connect_timeout_s: int = 3,
        now: float | None = None,
    ) -> None:
        self.url = url
        self.where = redact(url)
        self.retry = retry
        self.availability = availability or Availability()
        self._connect_timeout_s = connect_timeout_s
        self._db: psycopg.Connection[Any] | None = None
        self._connect_or_wait()
        try:
            self.found_version = self._prepare(upgrade, time.time() if now is None else now)
        except BaseException:
            self.close()
            raise

    # --- connections --------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            db = psycopg.connect(
                self.url,
                autocommit=False,
                connect_timeout=self._connect_timeout_s,
                application_name="voicegate",
                # Persist, then act: a returned COMMIT is on the server's disk, whatever the
                # server's default. A silent peer is noticed by TCP, not after hours.
                options="-c synchronous_commit=on -c idle_in_transaction_session_timeout=30000",
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
                tcp_user_timeout=10000,
            )
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"session store {self.where} unreachable: {_why(exc)}") from None
        except psycopg.Error as exc:
            raise StoreError(f"cannot open session store {self.where}: {_why(exc)}") from None
        self.availability.up()
        return db

    def _connect_or_wait(self) -> psycopg.Connection[Any]:
        attempt = 0
        while True:
            try:
                self._db = self._connect()
                return self._db
            except StoreUnavailable:
                self.availability.down()
                if not self.retry or self.availability.stopping.is_set():
                    raise
            delay = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
            attempt += 1
            if self.availability.stopping.wait(delay):
                raise StoreUnavailable(f"session store {self.where}: stopped waiting (shutdown)")

    def _connection(self) -> psycopg.Connection[Any]:
        if self._db is None or self._db.closed:
            return self._connect_or_wait()
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @contextmanager
    def _txn(self) -> Iterator[psycopg.Cursor[Any]]:
        db = self._connection()
        try:
            with db.cursor() as cur:
                yield cur
        except BaseException as exc:
            if db.broken or (isinstance(exc, psycopg.OperationalError) and db.closed):
                self._db = None
                raise _Lost(exc, committed=False) from exc
            if not db.closed:
                db.rollback()
            raise
        try:
            db.commit()
        except psycopg.Error as exc:
            if db.broken or db.closed:
                self._db = None
                raise _Lost(exc, committed=None) from exc
            db.rollback()
            raise

    def _run(
        self,
        work: Callable[[psycopg.Cursor[Any]], T],
        landed: Callable[[psycopg.Cursor[Any]], bool] | None = None,
    ) -> T:
        """``work`` in one transaction; on a broken connection, reconnect (when retrying) and
        run it again, first checking with ``landed`` whether a commit whose answer was lost had
        in fact landed (then ``work``'s result is read again by running it: every ``work`` here
        returns the same value when what it writes is already stored)."""
        attempt = 0
        while True:
            try:
                with self._txn() as cur:
                    if attempt and landed is not None and landed(cur):
                        log.info("store.commit_had_landed", extra={"store": self.where})
                    return work(cur)
            except _Lost as lost:
                if not self.retry and attempt == 0:
                    # A connection left broken by an earlier outage: one fresh one at once
                    # (it fails fast if the database is still away).
                    attempt += 1
                    continue
                self.availability.down()
                if not self.retry or self.availability.stopping.is_set():
                    raise StoreUnavailable(
                        f"session store {self.where} lost its connection: {_why(lost.cause)}"
                    ) from None
                log.warning(
                    "store.connection_lost",
                    extra={"store": self.where, "why": _why(lost.cause), "attempt": attempt + 1},
                )
            except psycopg.Error as exc:
                if exc.sqlstate in _RETRY_SQLSTATES and attempt < 20:
                    attempt += 1
                    continue
                raise StoreError(f"session store {self.where} failed: {_why(exc)}") from None
            attempt += 1
            if self.availability.stopping.wait(_BACKOFF_S[min(attempt, len(_BACKOFF_S)) - 1]):
                raise StoreUnavailable(f"session store {self.where}: stopped waiting (shutdown)")

    def _read(self, sql: str, params: Sequence[object] | Mapping[str, object]) -> list[Any]:
        def work(cur: psycopg.Cursor[Any]) -> list[Any]:
            cur.execute(sql, params)
            return cur.fetchall()

        return self._run(work)

    def _select(
        self, cls: type[R], table: str, where: str, params: Sequence[object]
    ) -> builtins.list[R]:
        sql = f"SELECT {', '.join(names(cls))} FROM {table} {where}"
        return [_record(cls, row) for row in self._read(sql, params)]

    # --- schema -------------------------------------------------------------------------------

    def _prepare(self, upgrade: bool, now: float) -> int:
        def work(cur: psycopg.Cursor[Any]) -> int:
            # One migrator per database at a time; the lock ends with the transaction.
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            found = _version(cur)
            if found == 0:
                if _has_table(cur, "sessions"):
                    raise StoreError(
                        f"session store {self.where} holds a sessions table without a"
                        " schema_version: not a voicegate database, or one made by hand"
                    )
                for statement in POSTGRES_SCHEMA:
                    cur.execute(statement)
                _record_version(cur, SCHEMA_VERSION, CREATED_WHY, now)
            elif upgrade and FIRST_VERSION["postgresql"] <= found < SCHEMA_VERSION:
                for version, why, statements in steps_from("postgresql", found):
                    for statement in statements:
                        cur.execute(statement)
                    _record_version(cur, version, why, now)
            elif found < FIRST_VERSION["postgresql"]:
                raise SchemaTooOld(self.where, found)
            check(self.where, _version(cur))
            return found

        return self._run(work)

    # --- sessions -----------------------------------------------------------------------------

    def _fence(
        self, cur: psycopg.Cursor[Any], session_id: str, lease: Lease | None, *, share: bool = False
    ) -> tuple[int, str | None]:
        """Inside a write: lock the session's row, then last seq and terminal state of a session
        that honours ``lease`` (when given). The lock is held to COMMIT, so no take-over slips in
        between this check and the write it guards."""
        lock = "FOR SHARE" if share else "FOR UPDATE"
        cur.execute(
            "SELECT last_seq, terminal_state, owner, lease_epoch FROM sessions"
            f" WHERE session_id = %s {lock}",
            (session_id,),
        )
        row = cur.fetchone()
        if row is None:
            raise UnknownSession(session_id)
        last_seq, terminal_state, owner, epoch = row
        if lease is not None and (owner, epoch) != (lease.owner, lease.epoch):
            raise LeaseLost(session_id, lease, owner, int(epoch))
        return int(last_seq), terminal_state

    def _open_session(
        self, cur: psycopg.Cursor[Any], session_id: str, lease: Lease | None = None, **kw: bool
    ) -> int:
        last_seq, terminal_state = self._fence(cur, session_id, lease, **kw)
        if terminal_state is not None:
            raise SessionFinished(session_id, terminal_state)
        return last_seq

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

        def landed(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(
                "SELECT owner, created_at FROM sessions WHERE session_id = %s", (session_id,)
            )
            return cur.fetchone() == (owner, at)

        made = False

        def work(cur: psycopg.Cursor[Any]) -> None:
            nonlocal made
            if made:
                return
            cur.execute(_insert("sessions", SessionSummary) + " ON CONFLICT DO NOTHING", params)
            if cur.rowcount != 1:
                raise SessionExists(session_id)

        def once(cur: psycopg.Cursor[Any]) -> bool:
            nonlocal made
            made = landed(cur)
            return made

        self._run(work, once)
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
        rows = [_params(record) for record in records]
        done = False

        def landed(cur: psycopg.Cursor[Any]) -> bool:
            # Ours landed if the log holds these very events and the lease is still ours.
            nonlocal done
            self._fence(cur, session_id, lease)
            stored = _events(cur, session_id, records[0].seq - 1, len(records))
            done = stored == [_canonical(r) for r in records]
            return done

        def work(cur: psycopg.Cursor[Any]) -> None:
            if done:
                return
            last_seq = self._open_session(cur, session_id, lease)
            for offset, record in enumerate(records):
                if record.seq != last_seq + 1 + offset:
                    raise SequenceConflict(session_id, record.seq, last_seq + offset)
            cur.executemany(_insert("events", EventRecord), rows)
            # updated_at never moves a newer heartbeat back (see SessionStore.append).
            cur.execute(
                "UPDATE sessions SET last_seq = %s, updated_at = GREATEST(updated_at, %s),"
                " status = %s, terminal_state = %s WHERE session_id = %s",
                (records[-1].seq, records[-1].at, status, terminal_state, session_id),
            )

        self._run(work, landed)

    def touch(self, session_id: str, *, lease: Lease, at: float) -> bool:
        def work(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(
                "UPDATE sessions SET updated_at = %s WHERE session_id = %s AND owner = %s"
                " AND lease_epoch = %s AND terminal_state IS NULL",
                (at, session_id, lease.owner, lease.epoch),
            )
            return cur.rowcount == 1

        return self._run(work)

    def take_over(self, session_id: str, *, owner: str, at: float) -> Lease:
        def work(cur: psycopg.Cursor[Any]) -> Lease:
            self._open_session(cur, session_id)
            cur.execute(
                "UPDATE sessions SET owner = %s, lease_epoch = lease_epoch + 1, updated_at = %s"
                " WHERE session_id = %s RETURNING lease_epoch",
                (owner, at, session_id),
            )
            (epoch,) = cur.fetchone() or (0,)
            return Lease(owner, int(epoch))

        # Run again after a lost commit, a take-over moves the lease once more, still to
        # ``owner``: the epoch it may have got first was never written under.
        return self._run(work)

    def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> builtins.list[EventRecord]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        where = "WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s"
        return self._select(EventRecord, "events", where, (session_id, after_seq, limit))

    def save_checkpoint(self, checkpoint: Checkpoint, *, lease: Lease) -> None:
        params = _params(checkpoint)

        def work(cur: psycopg.Cursor[Any]) -> None:
            last_seq, _ = self._fence(cur, checkpoint.session_id, lease)
            if not 0 <= checkpoint.seq <= last_seq:
                raise StoreError(
                    f"session {checkpoint.session_id!r}: checkpoint at seq {checkpoint.seq}"
                    f" is outside the log (0..{last_seq})"
                )
            # A late save of an older checkpoint must not replace a newer one.
            cur.execute(
                _insert("checkpoints", Checkpoint) + " ON CONFLICT (session_id) DO UPDATE SET"
                " seq = excluded.seq, state = excluded.state, at = excluded.at"
                " WHERE excluded.seq >= checkpoints.seq",
                params,
            )

        self._run(work)

    def latest_checkpoint(self, session_id: str) -> Checkpoint | None:
        found = self._select(Checkpoint, "checkpoints", "WHERE session_id = %s", (session_id,))
        return found[0] if found else None

    def get(self, session_id: str) -> SessionSummary | None:
        found = self._select(SessionSummary, "sessions", "WHERE session_id = %s", (session_id,))
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
            "%s",
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
        where, params = open_where("%s", updated_before=updated_before, owner_prefix=owner_prefix)
        return self._select(SessionSummary, "sessions", where, params)

    # --- tool intents and receipts -------------------------------------------------------------

    def record_intent(self, intent: ToolIntent) -> ToolIntent:
        if intent.kind not in INTENT_KINDS:
            raise ValueError(f"intent kind {intent.kind!r} is not one of {INTENT_KINDS}")
        params = _params(intent)

        def work(cur: psycopg.Cursor[Any]) -> ToolIntent:
            if (stored := _intent(cur, intent.idempotency_key)) is not None:
                _same_intent(stored, intent)
                return stored
            # The session's row (shared: intents of one session may go in together), so no
            # intent is added to a session that is ending in another transaction.
            self._open_session(cur, intent.session_id, share=True)
            cur.execute(_insert("tool_intents", ToolIntent) + " ON CONFLICT DO NOTHING", params)
            stored = _intent(cur, intent.idempotency_key)  # a racing insert of the key wins
            assert stored is not None
            _same_intent(stored, intent)
            return stored

        # Idempotent by key: after a lost commit, running it again returns the stored intent.
        return self._run(work)

    def record_receipt(self, receipt: ToolReceipt) -> ToolReceipt:
        if receipt.outcome not in RECEIPT_OUTCOMES:
            raise ValueError(f"outcome {receipt.outcome!r} is not one of {RECEIPT_OUTCOMES}")
        params = _params(receipt)
        key = receipt.idempotency_key

        def work(cur: psycopg.Cursor[Any]) -> ToolReceipt:
            # The intent's row lock orders racing receipts of one key: the first definitive wins.
            cur.execute("SELECT 1 FROM tool_intents WHERE idempotency_key = %s FOR UPDATE", (key,))
            if cur.fetchone() is None:
                raise UnknownIntent(key)
            if stored := _receipt(cur, key):
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
            cur.execute(
                _insert("tool_receipts", ToolReceipt) + " ON CONFLICT (idempotency_key) DO UPDATE"
                " SET outcome = excluded.outcome, detail = excluded.detail, at = excluded.at",
                params,
            )
            found = _receipt(cur, key)
            assert found is not None
            return found

        return self._run(work)

    def intent(self, key: str) -> ToolIntent | None:
        return self._run(lambda cur: _intent(cur, key))

    def receipt(self, key: str) -> ToolReceipt | None:
        return self._run(lambda cur: _receipt(cur, key))

    def outstanding_intents(self, session_id: str) -> builtins.list[ToolIntent]:
        where = (
            "WHERE session_id = %s AND NOT EXISTS (SELECT 1 FROM tool_receipts AS r"
            " WHERE r.idempotency_key = tool_intents.idempotency_key AND r.outcome != 'unknown')"
            " ORDER BY created_at, position"
        )
        return self._select(ToolIntent, "tool_intents", where, (session_id,))

    # --- the node registry --------------------------------------------------------------------

    def node_heartbeat(self, record: NodeRecord) -> None:
        if record.state not in NODE_STATES:
            raise ValueError(f"node state {record.state!r} is not one of {NODE_STATES}")
        params = node_sql.heartbeat_params(record, Json(dump(record.workers_json()), dumps=str))
        self._run(lambda cur: cur.execute(node_sql.heartbeat_sql("%s"), params))

    def nodes(self) -> builtins.list[NodeRecord]:
        return [_node(row) for row in self._read(node_sql.select_sql(), ())]

    def claim_node(
        self, name: str, incarnation: str, *, by: str, at: float, dead_before: float
    ) -> bool:
        params = node_sql.claim_params(name, incarnation, by=by, at=at, dead_before=dead_before)

        def work(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(node_sql.claim_sql("%s"), params)
            return cur.rowcount == 1

        return self._run(work)

    def leave_node(self, name: str, incarnation: str, *, at: float) -> None:
        self._run(lambda cur: cur.execute(node_sql.leave_sql("%s"), (at, name, incarnation)))

    # --- resume handles -------------------------------------------------------------------------

    def record_handle(self, record: ResumeRecord) -> None:
        def landed(cur: psycopg.Cursor[Any]) -> bool:
            return _handle(cur, record.selector) == dataclasses.replace(
                record, state=RecordState.CURRENT.value
            )

        done = False

        def once(cur: psycopg.Cursor[Any]) -> bool:
            nonlocal done
            done = landed(cur)
            return done

        def work(cur: psycopg.Cursor[Any]) -> None:
            if not done:
                self._issue(cur, record)

        self._run(work, once)

    def resume_handle(self, selector: str) -> ResumeRecord | None:
        return self._run(lambda cur: _handle(cur, selector))

    def handles_used(self, session_id: str) -> int:
        rows = self._read(
            "SELECT COUNT(*) FROM resume_handles WHERE session_id = %s AND state = %s",
            (session_id, RecordState.USED.value),
        )
        return int(rows[0][0])

    def use_handle(self, selector: str, successor: ResumeRecord) -> bool:
        rotated = False

        def once(cur: psycopg.Cursor[Any]) -> bool:
            nonlocal rotated
            old = _handle(cur, selector)
            rotated = (
                old is not None
                and old.state == RecordState.USED.value
                and _handle(cur, successor.selector) is not None
            )
            return rotated

        def work(cur: psycopg.Cursor[Any]) -> bool:
            if rotated:
                return True
            found = _handle(cur, selector)
            if found is None:
                return False
            # The session's row before the handle's: the order record_handle takes them in.
            cur.execute(
                "SELECT 1 FROM sessions WHERE session_id = %s FOR UPDATE", (found.session_id,)
            )
            cur.execute(
                "UPDATE resume_handles SET state = %s WHERE selector = %s AND state = %s"
                " RETURNING session_id, tenant",
                (RecordState.USED.value, selector, RecordState.CURRENT.value),
            )
            row = cur.fetchone()
            if row is None:
                return False  # used or superseded by a racing call: it reports the reuse
            if (successor.session_id, successor.tenant) != tuple(row):
                raise ValueError("a successor belongs to the same session and tenant")
            self._issue(cur, successor)
            return True

        return self._run(work, once)

    def _issue(self, cur: psycopg.Cursor[Any], record: ResumeRecord) -> None:
        """Inside a write: supersede the session's current handle, keep ``record`` current."""
        self._open_session(cur, record.session_id)
        cur.execute(
            "UPDATE resume_handles SET state = %s WHERE session_id = %s AND state = %s",
            (RecordState.SUPERSEDED.value, record.session_id, RecordState.CURRENT.value),
        )
        cur.execute(
            "INSERT INTO resume_handles (selector, verifier_digest, session_id, tenant,"
            " issued_at, expires_at, state) VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (
                record.selector,
                record.verifier_digest,
                record.session_id,
                record.tenant,
                record.issued_at,
                record.expires_at,
                RecordState.CURRENT.value,
            ),
        )
        if cur.rowcount != 1:
            raise StoreError("resume handle selector already stored")


def _why(exc: BaseException) -> str:
    # libpq's first line says what failed; later lines repeat it per address tried.
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _has_table(cur: psycopg.Cursor[Any], name: str) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
    row = cur.fetchone()
    return bool(row and row[0])


def _version(cur: psycopg.Cursor[Any]) -> int:
    if not _has_table(cur, "schema_version"):
        return 0
    cur.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")
    row = cur.fetchone()
    return int(row[0]) if row else 0


def _record_version(cur: psycopg.Cursor[Any], version: int, why: str, now: float) -> None:
    cur.execute(
        "INSERT INTO schema_version (version, applied_at, why) VALUES (%s, %s, %s)",
        (version, now, why),
    )


def _canonical(record: EventRecord) -> EventRecord:
    # As the store gives it back: JSON through its canonical text.
    return dataclasses.replace(
        record,
        payload=json.loads(dump(record.payload)),
        effects=json.loads(dump(record.effects)),
    )


def _events(
    cur: psycopg.Cursor[Any], session_id: str, after_seq: int, limit: int
) -> builtins.list[EventRecord]:
    cur.execute(
        f"SELECT {', '.join(names(EventRecord))} FROM events"
        " WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s",
        (session_id, after_seq, limit),
    )
    return [_record(EventRecord, row) for row in cur.fetchall()]


def _intent(cur: psycopg.Cursor[Any], key: str) -> ToolIntent | None:
    cur.execute(
        f"SELECT {', '.join(names(ToolIntent))} FROM tool_intents WHERE idempotency_key = %s",
        (key,),
    )
    row = cur.fetchone()
    return _record(ToolIntent, row) if row else None


def _same_intent(stored: ToolIntent, intent: ToolIntent) -> None:
    if stored.session_id != intent.session_id:
        raise IdempotencyConflict(intent.idempotency_key, "used by another session")
    if stored.digest != intent.digest:
        raise IdempotencyConflict(intent.idempotency_key, "used with another digest")


def _receipt(cur: psycopg.Cursor[Any], key: str) -> ToolReceipt | None:
    cur.execute(
        f"SELECT {', '.join(names(ToolReceipt))} FROM tool_receipts WHERE idempotency_key = %s",
        (key,),
    )
    row = cur.fetchone()
    return _record(ToolReceipt, row) if row else None


def _handle(cur: psycopg.Cursor[Any], selector: str) -> ResumeRecord | None:
    cur.execute(
        "SELECT selector, verifier_digest, session_id, tenant, issued_at, expires_at, state"
        " FROM resume_handles WHERE selector = %s",
        (selector,),
    )
    row = cur.fetchone()
    return ResumeRecord(*row) if row else None


def _node(row: Sequence[Any]) -> NodeRecord:
    name, incarnation, api_url, workers, started_at, heartbeat_at, state, by, by_at = row
    if isinstance(workers, str):  # ``json`` columns come back parsed; be sure either way
        workers = json.loads(workers)
    return NodeRecord(
        name, incarnation, api_url, NodeRecord.workers_from(workers), started_at, heartbeat_at,
        state, by, by_at,
    )  # fmt: skip
