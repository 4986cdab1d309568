"""The ledger: one SQLite file, one row per idempotency key, the outcome stored with the answer.

Why it is safe (seed 000: side effects happen once and leave a receipt):
- ``key`` is UNIQUE, and every write runs in ``BEGIN IMMEDIATE`` ... ``COMMIT``: the write lock is
  taken before the key is looked up, so two requests (or two processes) with one key are
  serialised and the second finds the first's row. The UNIQUE constraint is the backstop.
- WAL with ``synchronous=FULL``: when ``charge()`` returns, the row survives power loss, and the
  HTTP layer only answers after it returns (durable before any response byte).
- The exact response text is stored with the row, so a replay and the status endpoint return the
  original answer byte for byte instead of re-deriving it.

Each call opens its own connection and closes it: calls run in worker threads
(``asyncio.to_thread``) and a connection is never shared between threads.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Final

from providers.payments.contract import (
    ChargeRequest,
    Outcome,
    canonical_json,
    committed_body,
    failed_body,
    refusal,
)

_STORED: Final = (Outcome.COMMITTED.value, Outcome.FAILED.value, Outcome.NOT_STARTED.value)

_SCHEMA: Final = f"""
CREATE TABLE IF NOT EXISTS charges (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    key            TEXT NOT NULL UNIQUE,
    status         TEXT NOT NULL CHECK (status IN {_STORED!r}),
    request_digest TEXT,
    charge_id      TEXT UNIQUE,
    amount_cents   INTEGER,
    currency       TEXT,
    account        TEXT,
    reference      TEXT,
    reason         TEXT,
    http_status    INTEGER,
    response       TEXT,
    created_at     REAL NOT NULL
)"""


class KeyReused(Exception):
    """The key is in the ledger with a different request (HTTP 422); nothing was written."""


class KeyFenced(Exception):
    """The status endpoint reported this key ``not_started``, so it can never start (HTTP 409)."""


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One key's outcome. A ``not_started`` row is a fence: only ``key`` and ``created_at``."""

    seq: int
    key: str
    status: str
    request_digest: str | None
    charge_id: str | None
    amount_cents: int | None
    currency: str | None
    account: str | None
    reference: str | None
    reason: str | None
    http_status: int | None
    response: str | None  # the exact JSON text first sent for this key
    created_at: float

    def public(self) -> dict[str, object]:
        """The row for ``GET /v1/ledger`` (everything but the stored response text)."""
        row = asdict(self)
        del row["response"]
        return row


@dataclass(frozen=True, slots=True)
class Recorded:
    row: LedgerRow
    replayed: bool  # True when the row was already there (same key, same request)


_COLUMNS: Final = ", ".join(f.name for f in fields(LedgerRow))


def new_charge_id() -> str:
    return f"ch_{secrets.token_hex(12)}"


class Ledger:
    """The provider's durable state. Methods block (SQLite I/O): call them from a worker thread."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        charge_ids: Callable[[], str] = new_charge_id,
    ) -> None:
        self.path = path
        self._clock = clock
        self._charge_ids = charge_ids
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as db:
            # WAL is a property of the file: set once, every later connection uses it.
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        # isolation_level=None: no implicit transactions, we write BEGIN IMMEDIATE ourselves.
        with closing(sqlite3.connect(self.path, isolation_level=None, timeout=10.0)) as db:
            db.execute("PRAGMA synchronous=FULL")  # per connection: fsync on every commit
            db.execute("PRAGMA busy_timeout=10000")
            yield db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @staticmethod
    def _select(db: sqlite3.Connection, key: str) -> LedgerRow | None:
        found = db.execute(f"SELECT {_COLUMNS} FROM charges WHERE key = ?", (key,)).fetchone()
        return LedgerRow(*found) if found is not None else None

    def _insert(self, db: sqlite3.Connection, **values: object) -> LedgerRow:
        values["created_at"] = self._clock()
        names = ", ".join(values)
        marks = ", ".join("?" * len(values))
        db.execute(f"INSERT INTO charges ({names}) VALUES ({marks})", tuple(values.values()))
        row = self._select(db, str(values["key"]))
        assert row is not None  # just inserted, inside the same transaction
        return row

    def charge(self, key: str, request: ChargeRequest) -> Recorded:
        """Record the outcome of a charge under ``key``, once; committed when this returns.

        A key already recorded with the same request returns that row (``replayed``); with
        another request raises KeyReused; fenced by a ``not_started`` answer raises KeyFenced.
        A refused charge (``contract.refusal``) is recorded as ``failed`` just like a success.
        """
        digest = request.digest()
        with self._write() as db:
            if (row := self._select(db, key)) is not None:
                if row.status == Outcome.NOT_STARTED:
                    raise KeyFenced(key)
                if row.request_digest != digest:
                    raise KeyReused(key)
                return Recorded(row, replayed=True)
            charge_id: str | None = None
            if (reason := refusal(request)) is not None:
                status, http_status = Outcome.FAILED, 402
                body = failed_body(key, reason, request)
            else:
                status, http_status, charge_id = Outcome.COMMITTED, 200, self._charge_ids()
                body = committed_body(key, charge_id, request)
            row = self._insert(
                db,
                key=key,
                status=status.value,
                request_digest=digest,
                charge_id=charge_id,
                amount_cents=request.amount_cents,
                currency=request.currency,
                account=request.account,
                reference=request.reference,
                reason=reason,
                http_status=http_status,
                response=canonical_json(body),
            )
            return Recorded(row, replayed=False)

    def lookup(self, key: str) -> LedgerRow | None:
        """The key's row, or None. Reads only: a ``None`` here is not yet ``not_started``."""
        with self._connection() as db:
            return self._select(db, key)

    def lookup_or_fence(self, key: str) -> LedgerRow:
        """The key's row; when there is none, insert and return a ``not_started`` fence.

        The fence is what makes ``not_started`` definitive (seed 000: "confirmed not started"
        lets the caller start a new action): a request with this key that arrives later, say
        delayed in the network, is refused with KeyFenced instead of charging a second time.
        """
        with self._write() as db:
            if (row := self._select(db, key)) is not None:
                return row
            return self._insert(db, key=key, status=Outcome.NOT_STARTED.value)

    def rows(self) -> list[LedgerRow]:
        """Every row, oldest first."""
        with self._connection() as db:
            found = db.execute(f"SELECT {_COLUMNS} FROM charges ORDER BY seq").fetchall()
        return [LedgerRow(*row) for row in found]
