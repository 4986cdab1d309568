"""Every schema of the session store, for both backends, in one place (ARCHITECTURE.md "The store").

A database records the versions applied to it in ``schema_version`` (one row per version, with
when and why), and its schema is the one :data:`SCHEMA_VERSION` names. A new, empty database is
created at that version at once; an older one is stepped up only by :func:`upgrade`, which
``voicegate migrate`` runs: a server refuses to start on a schema older than it needs or newer
than it knows (``SchemaTooOld``, ``SchemaTooNew``), so no release writes rows another release
cannot read.

SQLite files from before the version table (versions 1 to 3) kept their version in ``PRAGMA
user_version``; it is still kept in step there, so a release that knows only the pragma refuses a
newer file instead of writing into it. PostgreSQL starts at version 4: it has no older schemas.

Adding a version: append a :class:`Step` to :data:`STEPS` with the statements of both backends,
and change the ``CREATE`` statements below to the new shape (a new database gets them directly;
an old one gets the steps, and the contract tests check that both end with the same tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from session.resume import RecordState
from session.store import INTENT_KINDS, RECEIPT_OUTCOMES, TERMINAL_STATES, StoreError
from session.store.nodes import NODE_STATES

SCHEMA_VERSION: Final = 5

_HANDLE_STATES: Final = tuple(s.value for s in RecordState)


class SchemaMismatch(StoreError):
    """The database's schema is not the one this release reads and writes; nothing was written."""

    def __init__(self, where: str, found: int, needed: int, message: str) -> None:
        super().__init__(message)
        self.where = where
        self.found = found
        self.needed = needed


class SchemaTooOld(SchemaMismatch):
    def __init__(self, where: str, found: int, needed: int = SCHEMA_VERSION) -> None:
        super().__init__(
            where,
            found,
            needed,
            f"session store {where} has schema version {found}, older than the {needed} this"
            " voicegate needs: run voicegate migrate",
        )


class SchemaTooNew(SchemaMismatch):
    def __init__(self, where: str, found: int, known: int = SCHEMA_VERSION) -> None:
        super().__init__(
            where,
            found,
            known,
            f"session store {where} has schema version {found}, newer than the {known} this"
            " voicegate knows: run a voicegate release that knows it",
        )


@dataclass(frozen=True, slots=True)
class Step:
    """From ``version - 1`` to ``version``: the statements of each backend, run in one
    transaction with the row that records it."""

    version: int
    why: str
    sqlite: Sequence[str]
    postgres: Sequence[str]


# --- SQLite ---------------------------------------------------------------------------------------

_SQLITE_RESUME: Final = (
    f"""CREATE TABLE resume_handles (
        selector        TEXT PRIMARY KEY,
        verifier_digest TEXT NOT NULL,
        session_id      TEXT NOT NULL REFERENCES sessions,
        tenant          TEXT NOT NULL,
        issued_at       REAL NOT NULL,
        expires_at      REAL NOT NULL,
        state           TEXT NOT NULL CHECK (state IN {_HANDLE_STATES!r}))""",
    # At most one current handle per session, even against a racing writer.
    "CREATE UNIQUE INDEX resume_handles_current ON resume_handles (session_id)"
    " WHERE state = 'current'",
)

_SQLITE_VERSION_TABLE: Final = (
    """CREATE TABLE schema_version (
        version    INTEGER PRIMARY KEY,
        applied_at REAL NOT NULL,
        why        TEXT NOT NULL)""",
)

# The node registry (session/store/nodes.py): one row per node of a cluster, its heartbeat, and
# who took its sessions over once it went silent.
_SQLITE_NODES: Final = (
    f"""CREATE TABLE nodes (
        name          TEXT PRIMARY KEY,
        incarnation   TEXT NOT NULL,
        api_url       TEXT NOT NULL,
        workers       TEXT NOT NULL,
        started_at    REAL NOT NULL,
        heartbeat_at  REAL NOT NULL,
        state         TEXT NOT NULL CHECK (state IN {NODE_STATES!r}),
        taken_over_by TEXT,
        taken_over_at REAL)""",
)
_POSTGRES_NODES: Final = (
    f"""CREATE TABLE nodes (
        name          text COLLATE "C" PRIMARY KEY,
        incarnation   text COLLATE "C" NOT NULL,
        api_url       text NOT NULL,
        workers       json NOT NULL,
        started_at    double precision NOT NULL,
        heartbeat_at  double precision NOT NULL,
        state         text NOT NULL CHECK (state IN {NODE_STATES!r}),
        taken_over_by text COLLATE "C",
        taken_over_at double precision)""",
)

SQLITE_SCHEMA: Final = (
    f"""CREATE TABLE sessions (
        session_id     TEXT PRIMARY KEY,
        created_at     REAL NOT NULL,
        updated_at     REAL NOT NULL,
        last_seq       INTEGER NOT NULL DEFAULT 0,
        owner          TEXT,
        status         TEXT NOT NULL,
        terminal_state TEXT CHECK (terminal_state IN {TERMINAL_STATES!r}),
        meta           TEXT NOT NULL,
        lease_epoch    INTEGER NOT NULL DEFAULT 1 CHECK (lease_epoch >= 1),
        tenant         TEXT NOT NULL DEFAULT 'default')""",
    "CREATE INDEX sessions_newest ON sessions (created_at DESC, session_id DESC)",
    "CREATE INDEX sessions_tenant ON sessions (tenant, created_at DESC, session_id DESC)",
    "CREATE INDEX sessions_open ON sessions (updated_at) WHERE terminal_state IS NULL",
    """CREATE TABLE events (
        session_id TEXT NOT NULL REFERENCES sessions,
        seq        INTEGER NOT NULL CHECK (seq >= 1),
        type       TEXT NOT NULL,
        payload    TEXT NOT NULL,
        effects    TEXT NOT NULL,
        at         REAL NOT NULL,
        PRIMARY KEY (session_id, seq)) WITHOUT ROWID""",
    # One row per session: only the latest checkpoint is ever read, the log keeps the history.
    """CREATE TABLE checkpoints (
        session_id TEXT PRIMARY KEY REFERENCES sessions,
        seq        INTEGER NOT NULL,
        state      TEXT NOT NULL,
        at         REAL NOT NULL)""",
    f"""CREATE TABLE tool_intents (
        idempotency_key TEXT PRIMARY KEY,
        session_id      TEXT NOT NULL REFERENCES sessions,
        turn_id         TEXT NOT NULL,
        tool            TEXT NOT NULL,
        kind            TEXT NOT NULL CHECK (kind IN {INTENT_KINDS!r}),
        digest          TEXT NOT NULL,
        arguments       TEXT NOT NULL,
        created_at      REAL NOT NULL)""",
    "CREATE INDEX tool_intents_session ON tool_intents (session_id, created_at)",
    f"""CREATE TABLE tool_receipts (
        idempotency_key TEXT PRIMARY KEY REFERENCES tool_intents,
        outcome         TEXT NOT NULL CHECK (outcome IN {RECEIPT_OUTCOMES!r}),
        detail          TEXT NOT NULL,
        at              REAL NOT NULL)""",
    *_SQLITE_RESUME,
    *_SQLITE_VERSION_TABLE,
    *_SQLITE_NODES,
)

# --- PostgreSQL -----------------------------------------------------------------------------------
# JSON columns are ``json`` (the text as written, so a value reads back byte-for-byte as SQLite's
# does; ``jsonb`` would normalise it and refuses \u0000), times are epoch seconds as SQLite keeps
# them, so rows move between the two stores unchanged. Keys and statuses compare byte by byte
# (``COLLATE "C"``), as SQLite's do, so pages and prefixes mean the same on both.

POSTGRES_SCHEMA: Final = (
    f"""CREATE TABLE sessions (
        session_id     text COLLATE "C" PRIMARY KEY,
        created_at     double precision NOT NULL,
        updated_at     double precision NOT NULL,
        last_seq       bigint NOT NULL DEFAULT 0,
        owner          text COLLATE "C",
        status         text COLLATE "C" NOT NULL,
        terminal_state text CHECK (terminal_state IN {TERMINAL_STATES!r}),
        meta           json NOT NULL,
        lease_epoch    bigint NOT NULL DEFAULT 1 CHECK (lease_epoch >= 1),
        tenant         text COLLATE "C" NOT NULL DEFAULT 'default')""",
    "CREATE INDEX sessions_newest ON sessions (created_at DESC, session_id DESC)",
    "CREATE INDEX sessions_tenant ON sessions (tenant, created_at DESC, session_id DESC)",
    "CREATE INDEX sessions_open ON sessions (updated_at) WHERE terminal_state IS NULL",
    """CREATE TABLE events (
        session_id text COLLATE "C" NOT NULL REFERENCES sessions,
        seq        bigint NOT NULL CHECK (seq >= 1),
        type       text NOT NULL,
        payload    json NOT NULL,
        effects    json NOT NULL,
        at         double precision NOT NULL,
        PRIMARY KEY (session_id, seq))""",
    """CREATE TABLE checkpoints (
        session_id text COLLATE "C" PRIMARY KEY REFERENCES sessions,
        seq        bigint NOT NULL,
        state      json NOT NULL,
        at         double precision NOT NULL)""",
    # ``position`` orders intents recorded within one clock tick as SQLite's rowid does.
    f"""CREATE TABLE tool_intents (
        idempotency_key text COLLATE "C" PRIMARY KEY,
        session_id      text COLLATE "C" NOT NULL REFERENCES sessions,
        turn_id         text NOT NULL,
        tool            text NOT NULL,
        kind            text NOT NULL CHECK (kind IN {INTENT_KINDS!r}),
        digest          text NOT NULL,
        arguments       json NOT NULL,
        created_at      double precision NOT NULL,
        position        bigint GENERATED ALWAYS AS IDENTITY)""",
    "CREATE INDEX tool_intents_session ON tool_intents (session_id, created_at, position)",
    f"""CREATE TABLE tool_receipts (
        idempotency_key text COLLATE "C" PRIMARY KEY REFERENCES tool_intents,
        outcome         text NOT NULL CHECK (outcome IN {RECEIPT_OUTCOMES!r}),
        detail          json NOT NULL,
        at              double precision NOT NULL)""",
    f"""CREATE TABLE resume_handles (
        selector        text COLLATE "C" PRIMARY KEY,
        verifier_digest text NOT NULL,
        session_id      text COLLATE "C" NOT NULL REFERENCES sessions,
        tenant          text COLLATE "C" NOT NULL,
        issued_at       double precision NOT NULL,
        expires_at      double precision NOT NULL,
        state           text NOT NULL CHECK (state IN {_HANDLE_STATES!r}))""",
    "CREATE UNIQUE INDEX resume_handles_current ON resume_handles (session_id)"
    " WHERE state = 'current'",
    "CREATE INDEX resume_handles_session ON resume_handles (session_id, state)",
    """CREATE TABLE schema_version (
        version    integer PRIMARY KEY,
        applied_at double precision NOT NULL,
        why        text NOT NULL)""",
    *_POSTGRES_NODES,
)

# Version 1 is the first SQLite schema (sessions, events, checkpoints, intents, receipts).
STEPS: Final = (
    Step(
        2,
        "the lease's fencing epoch; sessions of a v1 file keep their owner at epoch 1",
        sqlite=(
            "ALTER TABLE sessions ADD COLUMN"
            " lease_epoch INTEGER NOT NULL DEFAULT 1 CHECK (lease_epoch >= 1)",
        ),
        postgres=(),
    ),
    Step(
        3,
        "tenants (sessions from before them are the default's) and resume handles",
        sqlite=(
            "ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'",
            "CREATE INDEX sessions_tenant ON sessions (tenant, created_at DESC, session_id DESC)",
            *_SQLITE_RESUME,
        ),
        postgres=(),
    ),
    Step(
        4,
        "the schema_version table: versions applied, when and why (PostgreSQL starts here)",
        sqlite=_SQLITE_VERSION_TABLE,
        postgres=(),
    ),
    Step(
        5,
        "the node registry: the nodes of a cluster, their heartbeats and take-overs",
        sqlite=_SQLITE_NODES,
        postgres=_POSTGRES_NODES,
    ),
)
# The first version each backend's history has.
FIRST_VERSION: Final = {"sqlite": 1, "postgresql": 4}
CREATED_WHY: Final = "created at this version"

assert [s.version for s in STEPS] == list(range(2, SCHEMA_VERSION + 1))


def steps_from(backend: str, found: int) -> list[tuple[int, str, Sequence[str]]]:
    """What takes a ``backend`` database from version ``found`` to :data:`SCHEMA_VERSION`:
    (version, why, statements) in order."""
    chosen = []
    for step in STEPS:
        if step.version > found:
            statements = step.sqlite if backend == "sqlite" else step.postgres
            chosen.append((step.version, step.why, statements))
    return chosen


def check(where: str, found: int) -> None:
    """Raise SchemaTooOld or SchemaTooNew unless ``found`` is :data:`SCHEMA_VERSION`."""
    if found < SCHEMA_VERSION:
        raise SchemaTooOld(where, found)
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(where, found)
