"""The durable session store: what every implementation (SQLite now, PostgreSQL later) promises.

The event log is the truth (STYLE habit 6): a session's live state is a fold over its events, and a
checkpoint is only a shortcut into that fold. The store knows nothing of the state machine: events,
effects, checkpoints and meta are JSON objects it keeps byte-for-byte as JSON, so a value read back
equals the value written (tuples come back as lists, as JSON has no tuples).

Callers see only the errors below, never a database's own: the contract tests in
``tests/unit/test_session_store.py`` run against every implementation.

Tool intents and receipts implement the write path of ARCHITECTURE.md "Side effects": an intent is
persisted before the request is sent, keyed by its idempotency key, and its receipt after. Both are
durable when the call returns, so a crash between any two steps leaves evidence to reconcile from
(seed 000: "query side-effect receipts", never replay the write).

Ownership is a lease with a fencing epoch, kept in the session's row. ``create`` hands out epoch 1;
``take_over`` (a reaper, start-up reconciliation, another worker a caller rejoins through) moves the
session to a new owner at the next epoch. Every write to a session presents its lease and is
checked in the same transaction that writes, so once a session is taken over the previous owner's
late writes are refused with :class:`LeaseLost` and change nothing: there is one writer per epoch,
and epochs only grow.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from session.resume import ResumeRecord
from session.store.nodes import NodeRecord
from session.vocabulary import IntentKind, Outcome, Terminal

# Seed 000: every session ends in exactly one of these. Kept here, not imported from the state
# machine, so the store stays independent of how the machine is written.
# The vocabulary's values, as the store keeps them (plain strings in its rows).
TERMINAL_STATES: Final = tuple(t.value for t in Terminal)
INTENT_KINDS: Final = tuple(k.value for k in IntentKind)
RECEIPT_OUTCOMES: Final = tuple(o.value for o in Outcome)
# The tenant of a session created without one, and of every session from before tenants.
DEFAULT_TENANT: Final = "default"


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One event of a session's log and the effects the machine returned for it."""

    session_id: str
    seq: int  # 1, 2, 3, ... per session, without gaps
    type: str
    payload: Mapping[str, Any]
    effects: Sequence[Mapping[str, Any]]
    at: float  # epoch seconds from the runtime's clock


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The machine's serialized state after folding events ``1..seq``."""

    session_id: str
    seq: int
    state: Mapping[str, Any]
    at: float


@dataclass(frozen=True, slots=True)
class Lease:
    """The right to write one session: valid while the session's stored owner and epoch equal it."""

    owner: str  # "worker-name/incarnation-uuid", as in SessionSummary.owner
    epoch: int  # 1 at creation, +1 at each take-over


@dataclass(frozen=True, slots=True)
class SessionSummary:
    session_id: str
    created_at: float
    updated_at: float  # time of the last append or touch
    last_seq: int  # 0 before the first event
    owner: str | None  # "worker-name/incarnation-uuid" of the process serving the session
    lease_epoch: int  # the epoch of the owner's lease: 1 at creation, +1 at each take-over
    status: str  # one-line status the caller derived from its state on the last append
    terminal_state: str | None  # one of TERMINAL_STATES once recorded, never changed after
    meta: Mapping[str, Any]
    tenant: str = DEFAULT_TENANT  # the tenant whose call this is (config/tenants.py), never changed


@dataclass(frozen=True, slots=True)
class ToolIntent:
    idempotency_key: str
    session_id: str
    turn_id: str
    tool: str
    kind: str  # one of INTENT_KINDS
    digest: str  # of tool + arguments + session + turn (ARCHITECTURE.md "Side effects")
    arguments: Mapping[str, Any]
    created_at: float


@dataclass(frozen=True, slots=True)
class ToolReceipt:
    idempotency_key: str
    outcome: str  # one of RECEIPT_OUTCOMES
    detail: Mapping[str, Any]
    at: float


def check_terminal_state(terminal_state: str | None) -> None:
    """Raise ValueError unless ``terminal_state`` is None or one of TERMINAL_STATES."""
    if terminal_state is not None and terminal_state not in TERMINAL_STATES:
        raise ValueError(f"terminal state {terminal_state!r} is not one of {TERMINAL_STATES}")


# The keyset of ``SessionStore.list``: (created_at, session_id) of the last row served. Shared by
# every implementation, so a cursor means the same thing whichever store issued it.
def encode_cursor(created_at: float, session_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at, session_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The keyset in a cursor from ``encode_cursor``; ValueError("cursor ...") if malformed."""
    try:
        value = json.loads(base64.b64decode(cursor, altchars=b"-_", validate=True))
    except (ValueError, binascii.Error) as exc:  # JSONDecodeError and UnicodeError are ValueErrors
        raise ValueError(f"cursor {cursor!r} is malformed") from exc
    match value:
        case [float() | int() as created_at, str() as session_id] if not isinstance(
            created_at, bool
        ) and math.isfinite(created_at):
            return float(created_at), session_id
    raise ValueError(f"cursor {cursor!r} is malformed")


class StoreError(Exception):
    """Base of every error a store raises; also raised, chained, when the database itself fails."""


class SequenceConflict(StoreError):
    """An append did not continue the log: another writer got there first, or the caller is stale.

    ``expected`` is the seq the caller tried to write (what it believed comes next); ``actual`` is
    the session's last stored seq, so the caller can reload events after its own last known one.
    """

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"session {session_id!r}: append at seq {expected} but the log ends at seq {actual}"
            f" (next is {actual + 1})"
        )
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class LeaseLost(StoreError):
    """A write presented a lease the session no longer honours: it was taken over (reaped, settled
    at start-up, or moved to another worker). Nothing was written. The holder must stop acting for
    the session, not reload and retry: ``owner`` and ``epoch`` say who holds it now.
    """

    def __init__(self, session_id: str, lease: Lease, owner: str | None, epoch: int) -> None:
        super().__init__(
            f"session {session_id!r} is now owned by {owner!r} at epoch {epoch};"
            f" lease ({lease.owner!r}, {lease.epoch}) is stale"
        )
        self.session_id = session_id
        self.lease = lease
        self.owner = owner
        self.epoch = epoch


class UnknownSession(StoreError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"unknown session {session_id!r}")
        self.session_id = session_id


class SessionExists(StoreError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists")
        self.session_id = session_id


class SessionFinished(StoreError):
    """The session already recorded its terminal state; its log is closed."""

    def __init__(self, session_id: str, terminal_state: str) -> None:
        super().__init__(f"session {session_id!r} already ended as {terminal_state!r}")
        self.session_id = session_id
        self.terminal_state = terminal_state


class IdempotencyConflict(StoreError):
    """The key is already used by a different intent, or a receipt contradicts the stored one
    (then ``stored`` and ``offered`` are the two outcomes)."""

    def __init__(
        self, key: str, reason: str, *, stored: str | None = None, offered: str | None = None
    ) -> None:
        super().__init__(f"idempotency key {key!r}: {reason}")
        self.key = key
        self.reason = reason
        self.stored = stored
        self.offered = offered


class UnknownIntent(StoreError):
    def __init__(self, key: str) -> None:
        super().__init__(f"no intent with idempotency key {key!r}; record the intent first")
        self.key = key


class StoreUnavailable(StoreError):
    """The database cannot be reached (refused, lost, timed out). For a write, nothing was
    written, or the store could not learn whether it was and gave up: a writer that retries
    (session/store/writer.py) re-runs the write, which every store makes safe to repeat."""


class SessionStore(Protocol):
    """Durable sessions, event logs, checkpoints, tool intents and receipts.

    Every write is atomic and durable (committed) when it returns. Arguments a caller got wrong
    regardless of stored data (an unknown terminal state or outcome, a malformed cursor, a batch
    mixing sessions) raise ``ValueError``; conflicts with stored data raise a ``StoreError``.

    Writes to a session's log, heartbeat and checkpoint present a :class:`Lease`. Tool intents and
    receipts do not: an intent row follows the fenced append of its ``tool_intent`` event, and a
    receipt is evidence of what a provider did, worth keeping whoever holds the session now.
    """

    def create(
        self,
        session_id: str,
        *,
        owner: str,
        meta: Mapping[str, Any],
        at: float,
        tenant: str = DEFAULT_TENANT,
    ) -> Lease:
        """Start a session of ``tenant`` with ``last_seq`` 0 and status ``"created"``, owned by
        ``owner``.

        Returns its first lease, ``Lease(owner, 1)``. Raises SessionExists.
        """
        ...

    def append(
        self,
        record: EventRecord,
        *,
        lease: Lease,
        status: str,
        terminal_state: str | None = None,
    ) -> None:
        """Append one event: ``record.seq`` must be ``last_seq + 1``.

        Checked in this order, and on any error nothing is written: UnknownSession; LeaseLost if
        ``lease`` is not the session's current one; SessionFinished if a terminal state was
        already recorded; SequenceConflict. The lease comes before the log's state: a writer
        that lost its lease must stop whatever the log says now, and SessionFinished or
        SequenceConflict would invite it to reload and go on. Sets ``updated_at`` to
        ``record.at`` unless a heartbeat set it later (``record.at`` is the writer's session time,
        which a wall-clock step can leave behind the heartbeat's wall time), ``status``, and
        ``terminal_state`` when given (which closes the log after this event).
        """
        ...

    def append_many(
        self,
        records: Sequence[EventRecord],
        *,
        lease: Lease,
        status: str,
        terminal_state: str | None = None,
    ) -> None:
        """Append consecutive events of one session in one transaction: all or none.

        Checks as :meth:`append`.
        """
        ...

    def touch(self, session_id: str, *, lease: Lease, at: float) -> bool:
        """Heartbeat: set ``updated_at`` if ``lease`` is the session's current one and it is open.

        Returns whether it did: False for an unknown session, a stale lease or an ended session.
        """
        ...

    def take_over(self, session_id: str, *, owner: str, at: float) -> Lease:
        """Make ``owner`` the session's owner at the next epoch, atomically; returns the new lease.

        Sets ``updated_at`` to ``at``. Every lease handed out before is stale from then on: its
        appends, touches and checkpoints are refused. Raises UnknownSession, or SessionFinished
        for a session whose log is closed (there is nothing left to own).
        """
        ...

    def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> builtins.list[EventRecord]:
        """Events with seq > ``after_seq`` in seq order, at most ``limit`` of them.

        An unknown session has no events: [].
        """
        ...

    def save_checkpoint(self, checkpoint: Checkpoint, *, lease: Lease) -> None:
        """Keep ``checkpoint`` unless one with a higher seq is already stored.

        Fenced like an append: raises UnknownSession, then LeaseLost for a stale lease. ``seq``
        must lie in ``0..last_seq`` (a checkpoint cannot run ahead of the log): else StoreError.
        An ended session still takes one (its owner checkpoints the terminal state).
        """
        ...

    def latest_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The checkpoint with the highest seq (the last one saved at that seq), or None."""
        ...

    def get(self, session_id: str) -> SessionSummary | None: ...

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
        """One page of sessions, newest first (``created_at`` desc, then ``session_id`` desc),
        only ``tenant``'s when given.

        Returns the page and an opaque cursor for the next one (None on the last page). Paging
        with the cursor visits every matching session exactly once, even while sessions are
        created. A malformed cursor raises ``ValueError("cursor ...")``.
        """
        ...

    def open_sessions(
        self, *, updated_before: float | None = None, owner_prefix: str | None = None
    ) -> builtins.list[SessionSummary]:
        """Sessions without a terminal state, least recently updated first.

        Optionally only those with ``updated_at < updated_before`` and/or whose owner starts with
        ``owner_prefix`` (case-sensitive, no wildcards).
        """
        ...

    def record_intent(self, intent: ToolIntent) -> ToolIntent:
        """Persist an intent before its request is sent; returns the stored intent.

        Idempotent: the same key with the same session and digest returns the stored intent
        (even after the session ended). The key with another session or digest raises
        IdempotencyConflict. A new intent for an ended session raises SessionFinished.
        """
        ...

    def record_receipt(self, receipt: ToolReceipt) -> ToolReceipt:
        """Persist the outcome of an intent; returns the stored receipt.

        The intent must exist (else UnknownIntent). The first definitive outcome (committed,
        failed, not_started) wins: repeating it returns the stored receipt, a different outcome
        raises IdempotencyConflict ("conflicting receipt"). An ``unknown`` receipt is stored but
        may be replaced by a definitive one once reconciliation learns it.
        """
        ...

    def intent(self, key: str) -> ToolIntent | None: ...

    def receipt(self, key: str) -> ToolReceipt | None: ...

    def outstanding_intents(self, session_id: str) -> builtins.list[ToolIntent]:
        """Intents without a definitive receipt (none, or ``unknown``), oldest first."""
        ...

    # Resume handles (session/resume.py): records only, never a handle's verifier.

    def record_handle(self, record: ResumeRecord) -> None:
        """Keep ``record`` (state ``current``) as its session's live handle; the session's
        previous current handle, if any, becomes ``superseded`` in the same transaction.

        Raises UnknownSession, SessionFinished (an ended session is not resumed), or StoreError
        for a selector already stored."""
        ...

    def resume_handle(self, selector: str) -> ResumeRecord | None:
        """The record of ``selector``, whatever its state, or None."""
        ...

    def use_handle(self, selector: str, successor: ResumeRecord) -> bool:
        """Rotate: if ``selector`` is its session's current handle, make it ``used`` and
        ``successor`` (same session and tenant) current, atomically; True. False if it was not
        current (used or superseded meanwhile, by a racing use: the caller reports a reuse).
        Nothing is written on False."""
        ...

    def handles_used(self, session_id: str) -> int:
        """How many of the session's handles were ever rotated (``used``): one per rejoin that
        got that far, whether or not its ``rejoined`` event has been logged yet."""
        ...

    # The node registry (session/store/nodes.py): the nodes of a cluster sharing this store.

    def node_heartbeat(self, record: NodeRecord) -> None:
        """Keep ``record`` as its node's row (insert or refresh; a new incarnation replaces
        the row, claim and all). ``record.state`` must be one of NODE_STATES, else ValueError."""
        ...

    def nodes(self) -> builtins.list[NodeRecord]:
        """Every node's row, by name."""
        ...

    def claim_node(
        self, name: str, incarnation: str, *, by: str, at: float, dead_before: float
    ) -> bool:
        """Claim the dead node ``name`` (still at ``incarnation``, silent since before
        ``dead_before``, not left) for the survivor ``by`` ("<node>/<incarnation>"), if nobody
        alive holds the claim; True if ``by`` holds it now (also when it already did)."""
        ...

    def leave_node(self, name: str, incarnation: str, *, at: float) -> None:
        """The node stopped cleanly: ``left`` (nothing of it to take over). No-op for another
        incarnation's row."""
        ...

    def close(self) -> None: ...
