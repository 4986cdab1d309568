"""Contract tests of ``SessionStore`` (ARCHITECTURE.md "The store").

Everything above the "SQLite only" line is written against the protocol and runs once per
backend in ``_BACKENDS``. The stores are real (STYLE habit 9): SQLite files in ``tmp_path``, and a
fresh database per test on a throw-away PostgreSQL cluster the suite starts (tests/pg_cluster.py);
several store objects on one database stand in for several processes or machines. PostgreSQL's
own promises under concurrency (threads racing take-overs on several connections) are in
tests/unit/test_postgres_store.py.
"""

from __future__ import annotations

import base64
import multiprocessing
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from session.resume import RecordState, issue
from session.store import (
    Checkpoint,
    EventRecord,
    IdempotencyConflict,
    Lease,
    LeaseLost,
    SequenceConflict,
    SessionExists,
    SessionFinished,
    SessionStore,
    StoreError,
    ToolIntent,
    ToolReceipt,
    UnknownIntent,
    UnknownSession,
)
from session.store.migrations import SCHEMA_VERSION, SchemaTooNew, SchemaTooOld
from session.store.postgres import PostgresSessionStore
from session.store.sqlite import SqliteSessionStore

OWNER = "worker-a/5d0c7f0e"
LEASE = Lease(OWNER, 1)  # what create hands OWNER
# Each factory opens a new store object on the backend's one shared database.
_BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Callable[[], SessionStore]]] = {
    "sqlite": lambda _, tmp: lambda: SqliteSessionStore(tmp / "db" / "sessions.sqlite3"),
    "postgresql": lambda request, _: _postgres(request.getfixturevalue("pg_url")),
}


def _postgres(url: str) -> Callable[[], SessionStore]:
    return lambda: PostgresSessionStore(url)

StoreFactory = Callable[[], SessionStore]


@pytest.fixture(params=sorted(_BACKENDS))
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Opens store objects on one database (as separate processes would); closes them all."""
    make = _BACKENDS[request.param](request, tmp_path)
    opened: list[SessionStore] = []

    def factory() -> SessionStore:
        opened.append(make())
        return opened[-1]

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: StoreFactory) -> SessionStore:
    return open_store()


def event(session_id: str, seq: int, **payload: Any) -> EventRecord:
    return EventRecord(
        session_id=session_id,
        seq=seq,
        type="note",
        payload=payload or {"n": seq},
        effects=[{"effect": "log", "seq": seq}],
        at=100.0 + seq,
    )


def intent(key: str, session_id: str = "s", digest: str = "d1", at: float = 1.0) -> ToolIntent:
    return ToolIntent(
        idempotency_key=key,
        session_id=session_id,
        turn_id="t1",
        tool="book_table",
        kind="write",
        digest=digest,
        arguments={"party": 2, "time": "19:30"},
        created_at=at,
    )


def test_events_round_trip_json_exactly(store: SessionStore) -> None:
    meta = {"caller": "***4567", "called_user": "service", "tags": ["a", "b"]}
    store.create("s", owner=OWNER, meta=meta, at=10.0)
    payload = {
        "text": "grüß dich ☎",
        "n": 3,
        "big": 2**62,
        "ratio": 0.1,
        "flag": False,
        "none": None,
        "nested": {"list": [1, [2, {"x": []}]], "empty": {}},
    }
    first = EventRecord("s", 1, "call_offered", payload, [{"kind": "answer", "code": 200}], 11.5)
    store.append(first, lease=LEASE, status="ringing")
    store.append(event("s", 2), lease=LEASE, status="talking")

    assert store.events("s") == [first, event("s", 2)]
    assert store.events("s", after_seq=1) == [event("s", 2)]
    assert store.events("s", limit=1) == [first]
    assert store.events("nobody") == []
    summary = store.get("s")
    assert summary is not None
    assert (summary.created_at, summary.updated_at, summary.last_seq) == (10.0, 102.0, 2)
    assert (summary.owner, summary.status, summary.terminal_state) == (OWNER, "talking", None)
    assert summary.meta == meta
    assert store.get("nobody") is None


def test_a_session_is_created_once(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    with pytest.raises(SessionExists):
        store.create("s", owner="other/1", meta={}, at=2.0)
    summary = store.get("s")
    assert summary is not None
    assert (summary.owner, summary.created_at, summary.last_seq) == (OWNER, 1.0, 0)


def test_writes_to_an_unknown_session_are_refused(store: SessionStore) -> None:
    with pytest.raises(UnknownSession):
        store.append(event("nobody", 1), lease=LEASE, status="x")
    with pytest.raises(UnknownSession):
        store.save_checkpoint(Checkpoint("nobody", 0, {}, 1.0), lease=LEASE)
    with pytest.raises(UnknownSession):
        store.record_intent(intent("k", session_id="nobody"))


@pytest.mark.parametrize("seq", [0, -1, 2, 3, 5])
def test_a_seq_that_does_not_continue_the_log_conflicts(store: SessionStore, seq: int) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    store.append(event("s", 1), lease=LEASE, status="one")
    store.append(event("s", 2), lease=LEASE, status="two")
    before = store.get("s")

    with pytest.raises(SequenceConflict) as raised:
        store.append(
            event("s", seq if seq != 3 else 2), lease=LEASE, status="bad"
        )  # 2 is a duplicate

    assert (raised.value.session_id, raised.value.actual) == ("s", 2)
    assert store.get("s") == before
    assert store.events("s") == [event("s", 1), event("s", 2)]


def test_the_log_closes_at_its_terminal_state(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    store.append(event("s", 1), lease=LEASE, status="talking")
    with pytest.raises(ValueError, match="terminal state"):
        store.append(event("s", 2), lease=LEASE, status="bye", terminal_state="done")
    store.append(event("s", 2), lease=LEASE, status="ended", terminal_state="completed")

    with pytest.raises(SessionFinished) as raised:
        store.append(event("s", 3), lease=LEASE, status="late")
    assert raised.value.terminal_state == "completed"
    with pytest.raises(SessionFinished):
        store.append(event("s", 3), lease=LEASE, status="late", terminal_state="failed")
    summary = store.get("s")
    assert summary is not None
    assert (summary.last_seq, summary.status, summary.terminal_state) == (2, "ended", "completed")


def test_append_many_writes_all_or_nothing(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    store.append(event("s", 1), lease=LEASE, status="one")

    with pytest.raises(SequenceConflict) as raised:
        store.append_many([event("s", 2), event("s", 3), event("s", 5)], lease=LEASE, status="gap")
    assert (raised.value.expected, raised.value.actual) == (5, 3)
    with pytest.raises(ValueError):
        store.append_many(
            [event("s", 2), event("s", 3, bad=float("nan"))], lease=LEASE, status="not json"
        )
    with pytest.raises(ValueError):
        store.append_many([event("s", 2), event("other", 3)], lease=LEASE, status="two sessions")
    with pytest.raises(ValueError):
        store.append_many([], lease=LEASE, status="nothing")
    assert store.events("s") == [event("s", 1)]

    store.append_many(
        [event("s", 2), event("s", 3)], lease=LEASE, status="three", terminal_state="canceled"
    )
    assert [e.seq for e in store.events("s")] == [1, 2, 3]
    summary = store.get("s")
    assert summary is not None
    assert (summary.last_seq, summary.updated_at, summary.terminal_state) == (3, 103.0, "canceled")


def test_an_event_never_moves_a_newer_heartbeat_back(store: SessionStore) -> None:
    # A wall-clock step forward: the heartbeat (wall time) is ahead of the writer's session time.
    store.create("s", owner=OWNER, meta={}, at=1.0)
    assert store.touch("s", lease=LEASE, at=500.0)
    store.append(event("s", 1), lease=LEASE, status="up", terminal_state=None)  # at=101.0
    summary = store.get("s")
    assert summary is not None and summary.updated_at == 500.0
    assert store.open_sessions(updated_before=400.0) == []  # not stale to a reaper


def test_only_the_lease_holder_touches_an_open_session(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    assert not store.touch("s", lease=Lease("worker-b/1", 1), at=5.0)
    assert not store.touch("s", lease=Lease(OWNER, 2), at=5.0)
    assert not store.touch("nobody", lease=LEASE, at=5.0)
    assert store.touch("s", lease=LEASE, at=6.0)
    summary = store.get("s")
    assert summary is not None
    assert summary.updated_at == 6.0

    store.append(event("s", 1), lease=LEASE, status="ended", terminal_state="timed_out")
    assert not store.touch("s", lease=LEASE, at=200.0)
    summary = store.get("s")
    assert summary is not None
    assert summary.updated_at == 101.0


def test_the_checkpoint_with_the_highest_seq_wins(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    assert store.latest_checkpoint("s") is None
    store.append_many([event("s", n) for n in (1, 2, 3)], lease=LEASE, status="three")

    store.save_checkpoint(Checkpoint("s", 0, {"gate": "open"}, 1.0), lease=LEASE)
    store.save_checkpoint(Checkpoint("s", 2, {"gate": "frozen", "intents": []}, 2.0), lease=LEASE)
    store.save_checkpoint(Checkpoint("s", 1, {"gate": "stale"}, 3.0), lease=LEASE)  # late and older
    assert store.latest_checkpoint("s") == Checkpoint(
        "s", 2, {"gate": "frozen", "intents": []}, 2.0
    )
    store.save_checkpoint(Checkpoint("s", 2, {"gate": "reconciling"}, 4.0), lease=LEASE)
    assert store.latest_checkpoint("s") == Checkpoint("s", 2, {"gate": "reconciling"}, 4.0)

    with pytest.raises(StoreError):
        store.save_checkpoint(Checkpoint("s", 4, {}, 5.0), lease=LEASE)  # ahead of the log
    assert store.latest_checkpoint("s") == Checkpoint("s", 2, {"gate": "reconciling"}, 4.0)


def _populate(store: SessionStore, count: int) -> list[str]:
    """Sessions with tied creation times; returns their ids newest first."""
    ids = [f"s{n:02d}" for n in range(count)]
    for n, session_id in enumerate(ids):
        owner = f"worker-{'ab'[n % 2]}/{n}"
        lease = store.create(session_id, owner=owner, meta={"n": n}, at=n // 3)
        status = "talking" if n % 3 else "Reconnecting 50%"
        store.append(event(session_id, 1), lease=lease, status=status)
        if n % 4 == 0:
            store.append(
                event(session_id, 2), lease=lease, status="ended", terminal_state="completed"
            )
    return sorted(ids, key=lambda s: (int(s[1:]) // 3, s), reverse=True)


def _all_pages(store: SessionStore, limit: int, **filters: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page, cursor = store.list(limit=limit, cursor=cursor, **filters)
        pages.append([summary.session_id for summary in page])
        if cursor is None:
            return pages


@pytest.mark.parametrize("limit", [1, 4, 5, 25, 50])
def test_list_pages_visit_every_session_once_newest_first(store: SessionStore, limit: int) -> None:
    newest_first = _populate(store, 25)
    pages = _all_pages(store, limit)
    assert [sid for page in pages for sid in page] == newest_first
    assert all(len(page) == limit for page in pages[:-1])
    assert 1 <= len(pages[-1]) <= limit


def test_a_session_keeps_its_tenant_and_lists_by_it(store: SessionStore) -> None:
    store.create("a1", owner=OWNER, meta={}, at=1.0, tenant="acme")
    store.create("b1", owner=OWNER, meta={}, at=2.0, tenant="beta")
    store.create("a2", owner=OWNER, meta={}, at=3.0, tenant="acme")
    store.create("d1", owner=OWNER, meta={}, at=4.0)
    assert [(store.get(s) or pytest.fail()).tenant for s in ("a1", "b1", "d1")] == [
        "acme",
        "beta",
        "default",
    ]
    assert [s.session_id for s in store.list(tenant="acme")[0]] == ["a2", "a1"]
    assert [s.session_id for s in store.list(tenant="nobody")[0]] == []
    # Pages of one tenant never reach into another's.
    first, cursor = store.list(tenant="acme", limit=1)
    assert [s.session_id for s in first] == ["a2"] and cursor is not None
    assert [s.session_id for s in store.list(tenant="acme", limit=1, cursor=cursor)[0]] == ["a1"]
    # A take-over moves the owner, never the tenant.
    store.take_over("b1", owner="worker-b/1", at=5.0)
    assert (store.get("b1") or pytest.fail()).tenant == "beta"


def test_resume_handles_have_one_current_per_session_and_rotate_once(
    open_store: StoreFactory,
) -> None:
    store, other = open_store(), open_store()
    store.create("s1", owner=OWNER, meta={}, at=1.0, tenant="acme")
    first = issue("s1", "acme", now=1.0, ttl_s=60).record
    store.record_handle(first)
    assert store.resume_handle(first.selector) == first
    assert store.resume_handle("0" * 16) is None
    # A second handle supersedes the first.
    second = issue("s1", "acme", now=2.0, ttl_s=60).record
    store.record_handle(second)
    stored = store.resume_handle(first.selector)
    assert stored is not None and stored.state == RecordState.SUPERSEDED
    assert not store.use_handle(first.selector, issue("s1", "acme", now=3, ttl_s=60).record)
    # Two processes presenting the same handle: exactly one rotates it.
    third = issue("s1", "acme", now=3.0, ttl_s=60).record
    fourth = issue("s1", "acme", now=3.0, ttl_s=60).record
    assert store.use_handle(second.selector, third)
    assert not other.use_handle(second.selector, fourth)
    assert other.resume_handle(fourth.selector) is None  # nothing written on False
    used = other.resume_handle(second.selector)
    assert used is not None and used.state == RecordState.USED
    live = other.resume_handle(third.selector)
    assert live is not None and live.state == RecordState.CURRENT
    with pytest.raises(ValueError):
        store.use_handle(third.selector, issue("s2", "acme", now=3, ttl_s=60).record)
    with pytest.raises(StoreError):
        store.record_handle(third)  # a selector is stored once


def test_resume_handles_need_an_open_session(store: SessionStore) -> None:
    with pytest.raises(UnknownSession):
        store.record_handle(issue("nope", "acme", now=1.0, ttl_s=60).record)
    store.create("s1", owner=OWNER, meta={}, at=1.0)
    store.append(event("s1", 1), lease=LEASE, status="done", terminal_state="completed")
    with pytest.raises(SessionFinished):
        store.record_handle(issue("s1", "default", now=2.0, ttl_s=60).record)


def test_list_filters_page_too(store: SessionStore) -> None:
    newest_first = _populate(store, 25)
    by_id = {sid: store.get(sid) for sid in newest_first}

    def ids(limit: int, **filters: Any) -> list[str]:
        return [sid for page in _all_pages(store, limit, **filters) for sid in page]

    completed = [sid for sid in newest_first if int(sid[1:]) % 4 == 0]
    assert ids(2, terminal_state="completed") == completed
    assert ids(3, open_only=True) == [sid for sid in newest_first if sid not in completed]
    reconnecting = [s for s in newest_first if (by_id[s] or pytest.fail()).status.startswith("R")]
    assert ids(2, status_prefix="Reconnecting 50%") == reconnecting
    assert ids(2, status_prefix="reconnecting") == []  # case-sensitive
    assert ids(2, status_prefix="Reconnecting 5_%") == []  # no wildcards
    assert ids(50, terminal_state="failed") == []
    with pytest.raises(ValueError):
        store.list(terminal_state="completed", open_only=True)
    with pytest.raises(ValueError):
        store.list(limit=0)


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "not a cursor!",
        base64.urlsafe_b64encode(b"not json").decode(),
        base64.urlsafe_b64encode(b"[1]").decode(),
        base64.urlsafe_b64encode(b'["x", "y"]').decode(),
        base64.urlsafe_b64encode(b'[true, "s01"]').decode(),
        base64.urlsafe_b64encode(b'[NaN, "s01"]').decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_a_malformed_cursor_is_a_value_error(store: SessionStore, cursor: str) -> None:
    with pytest.raises(ValueError, match=r"^cursor"):
        store.list(cursor=cursor)


def test_open_sessions_by_age_and_owner(store: SessionStore) -> None:
    leases = [
        store.create(f"s{n}", owner=owner, meta={}, at=float(n))
        for n, owner in enumerate(["worker-a/1", "worker-a/2", "worker-b/1", "worker-a/1"])
    ]
    store.append(event("s3", 1), lease=leases[3], status="ended", terminal_state="failed")
    assert store.touch("s0", lease=leases[0], at=50.0)

    def ids(found: list[Any]) -> list[str]:
        return [summary.session_id for summary in found]

    assert ids(store.open_sessions()) == ["s1", "s2", "s0"]  # least recently updated first
    assert ids(store.open_sessions(updated_before=2.0)) == ["s1"]
    assert ids(store.open_sessions(updated_before=2.5)) == ["s1", "s2"]
    assert ids(store.open_sessions(owner_prefix="worker-a/")) == ["s1", "s0"]
    assert ids(store.open_sessions(owner_prefix="worker-a/1")) == ["s0"]
    assert ids(store.open_sessions(owner_prefix="worker-_")) == []
    assert ids(store.open_sessions(updated_before=60.0, owner_prefix="worker-b")) == ["s2"]


def test_an_intent_is_recorded_once_per_key(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    store.create("other", owner=OWNER, meta={}, at=1.0)
    first = store.record_intent(intent("k1", at=5.0))
    assert first == intent("k1", at=5.0)
    assert store.record_intent(intent("k1", at=9.0)) == first  # a retry returns the original
    assert store.intent("k1") == first
    assert store.intent("k2") is None

    with pytest.raises(IdempotencyConflict) as raised:
        store.record_intent(intent("k1", digest="d2"))
    assert raised.value.key == "k1"
    assert "k1" in str(raised.value)
    with pytest.raises(IdempotencyConflict):
        store.record_intent(intent("k1", session_id="other"))
    with pytest.raises(ValueError):
        store.record_intent(ToolIntent("k3", "s", "t1", "book_table", "delete", "d", {}, 1.0))
    assert store.intent("k1") == first
    assert store.intent("k3") is None


def test_an_ended_session_starts_no_new_intent(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    stored = store.record_intent(intent("k1"))
    store.append(event("s", 1), lease=LEASE, status="ended", terminal_state="needs_human")
    assert store.record_intent(intent("k1")) == stored
    with pytest.raises(SessionFinished):
        store.record_intent(intent("k2"))
    # Reconciliation goes on after the end (seed 000: timed_out intents enter reconciliation).
    assert store.record_receipt(ToolReceipt("k1", "committed", {}, 2.0)).outcome == "committed"


def test_the_first_definitive_receipt_wins(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    with pytest.raises(UnknownIntent):
        store.record_receipt(ToolReceipt("k1", "committed", {}, 2.0))
    store.record_intent(intent("k1"))
    with pytest.raises(ValueError):
        store.record_receipt(ToolReceipt("k1", "maybe", {}, 2.0))

    first = store.record_receipt(ToolReceipt("k1", "committed", {"booking": "B-17"}, 2.0))
    assert first == ToolReceipt("k1", "committed", {"booking": "B-17"}, 2.0)
    assert store.record_receipt(ToolReceipt("k1", "committed", {"other": 1}, 3.0)) == first
    for outcome in ("failed", "not_started", "unknown"):
        with pytest.raises(IdempotencyConflict, match="conflicting receipt"):
            store.record_receipt(ToolReceipt("k1", outcome, {}, 4.0))
    assert store.receipt("k1") == first
    assert store.receipt("k2") is None


def test_an_unknown_receipt_keeps_the_intent_outstanding(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    for key, at in [("k2", 2.0), ("k1", 1.0), ("k3", 2.0)]:
        store.record_intent(intent(key, at=at))
    assert [i.idempotency_key for i in store.outstanding_intents("s")] == ["k1", "k2", "k3"]

    store.record_receipt(ToolReceipt("k1", "failed", {}, 5.0))
    store.record_receipt(ToolReceipt("k2", "unknown", {"status": 504}, 5.0))
    assert store.record_receipt(ToolReceipt("k2", "unknown", {}, 6.0)).detail == {"status": 504}
    assert [i.idempotency_key for i in store.outstanding_intents("s")] == ["k2", "k3"]

    # A later status query settles it; then the answer is final.
    settled = store.record_receipt(ToolReceipt("k2", "not_started", {}, 7.0))
    assert store.receipt("k2") == settled
    assert [i.idempotency_key for i in store.outstanding_intents("s")] == ["k3"]
    assert store.outstanding_intents("nobody") == []


def test_everything_survives_reopening(open_store: StoreFactory) -> None:
    store = open_store()
    store.create("s", owner=OWNER, meta={"caller": "***4567"}, at=1.0)
    store.append_many([event("s", 1), event("s", 2)], lease=LEASE, status="talking")
    store.save_checkpoint(Checkpoint("s", 2, {"gate": "open"}, 3.0), lease=LEASE)
    stored_intent = store.record_intent(intent("k1"))
    store.record_intent(intent("k2"))
    stored_receipt = store.record_receipt(ToolReceipt("k1", "committed", {"id": 1}, 4.0))
    summary = store.get("s")
    store.close()

    reopened = open_store()
    assert reopened.get("s") == summary
    assert reopened.events("s") == [event("s", 1), event("s", 2)]
    assert reopened.latest_checkpoint("s") == Checkpoint("s", 2, {"gate": "open"}, 3.0)
    assert reopened.intent("k1") == stored_intent
    assert reopened.receipt("k1") == stored_receipt
    assert [i.idempotency_key for i in reopened.outstanding_intents("s")] == ["k2"]
    reopened.append(event("s", 3), lease=LEASE, status="resumed")
    assert reopened.list()[0][0].last_seq == 3


def test_a_stale_writer_conflicts_instead_of_forking_the_log(open_store: StoreFactory) -> None:
    # Two writers under one lease (say, two objects of one process): the log's seq still decides.
    old, new = open_store(), open_store()
    lease = old.create("s", owner="worker-a/1", meta={}, at=1.0)
    old.append(event("s", 1), lease=lease, status="one")
    new.append(event("s", 2, writer="new"), lease=lease, status="resumed")  # the session moved on

    with pytest.raises(SequenceConflict) as raised:
        old.append(event("s", 2, writer="old"), lease=lease, status="stale")
    assert (raised.value.expected, raised.value.actual) == (2, 2)
    assert old.events("s") == [event("s", 1), event("s", 2, writer="new")]
    assert new.record_intent(intent("k1")) == old.record_intent(intent("k1"))
    with pytest.raises(IdempotencyConflict):
        old.record_intent(intent("k1", digest="other"))


# Hypothesis reuses the function-scoped store across examples; each example writes its own
# session, so examples cannot see each other.
_SESSIONS = iter(range(10**9))


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(
        st.tuples(
            st.lists(st.sampled_from([0, 0, 0, 0, -1, 1, 2, -3]), min_size=1, max_size=3),
            st.booleans(),
        ),
        max_size=12,
    )
)
def test_the_log_is_exactly_the_accepted_appends(
    store: SessionStore, batches: list[tuple[list[int], bool]]
) -> None:
    session_id = f"h{next(_SESSIONS)}"
    store.create(session_id, owner=OWNER, meta={}, at=0.0)
    accepted: list[EventRecord] = []
    for number, (offsets, as_batch) in enumerate(batches):
        # Each offset shifts a seq away from the one that would continue the log (0: continues).
        seqs, seq = [], len(accepted)
        for offset in offsets:
            seq += 1 + offset
            seqs.append(seq)
        records = [event(session_id, s, batch=number, i=i) for i, s in enumerate(seqs)]
        valid = seqs == list(range(len(accepted) + 1, len(accepted) + 1 + len(seqs)))
        try:
            if as_batch or len(records) > 1:
                store.append_many(records, lease=LEASE, status=f"b{number}")
            else:
                store.append(records[0], lease=LEASE, status=f"b{number}")
        except SequenceConflict:
            assert not valid
        else:
            assert valid
            accepted += records
    assert store.events(session_id) == accepted
    assert [record.seq for record in accepted] == list(range(1, len(accepted) + 1))
    summary = store.get(session_id)
    assert summary is not None
    assert summary.last_seq == len(accepted)


# ---- leases ---------------------------------------------------------------------------------


def test_create_hands_out_the_first_lease(store: SessionStore) -> None:
    assert store.create("s", owner=OWNER, meta={}, at=1.0) == Lease(OWNER, 1)
    summary = store.get("s")
    assert summary is not None
    assert (summary.owner, summary.lease_epoch) == (OWNER, 1)


def test_a_take_over_moves_the_lease_to_the_next_epoch(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    store.append(event("s", 1), lease=LEASE, status="talking")

    assert store.take_over("s", owner="worker-b/2", at=50.0) == Lease("worker-b/2", 2)
    summary = store.get("s")
    assert summary is not None
    assert (summary.owner, summary.lease_epoch, summary.updated_at) == ("worker-b/2", 2, 50.0)
    assert (summary.last_seq, summary.status, summary.terminal_state) == (1, "talking", None)
    # Every take-over is a new epoch, even by the owner it already has.
    assert store.take_over("s", owner="worker-b/2", at=51.0) == Lease("worker-b/2", 3)


def _stale_write(store: SessionStore, operation: str) -> None:
    """One write under the creator's lease, which a take-over made stale."""
    match operation:
        case "append":
            store.append(event("s", 2), lease=LEASE, status="late")
        case "append_terminal":
            store.append(event("s", 2), lease=LEASE, status="late", terminal_state="completed")
        case "append_many":
            store.append_many([event("s", 2), event("s", 3)], lease=LEASE, status="late")
        case "append_bad_seq":  # the lease is checked before the seq
            store.append(event("s", 7), lease=LEASE, status="late")
        case "checkpoint":
            store.save_checkpoint(Checkpoint("s", 1, {"gate": "late"}, 9.0), lease=LEASE)


@pytest.mark.parametrize(
    "operation",
    ["append", "append_terminal", "append_many", "append_bad_seq", "checkpoint", "touch"],
)
def test_the_previous_owner_writes_nothing_after_a_take_over(
    open_store: StoreFactory, operation: str
) -> None:
    old, new = open_store(), open_store()  # two processes on one database
    old.create("s", owner=OWNER, meta={}, at=1.0)
    old.append(event("s", 1), lease=LEASE, status="talking")
    old.save_checkpoint(Checkpoint("s", 1, {"gate": "open"}, 2.0), lease=LEASE)
    taken = new.take_over("s", owner="worker-b/2", at=3.0)
    before = (new.get("s"), new.events("s"), new.latest_checkpoint("s"))

    if operation == "touch":
        assert not old.touch("s", lease=LEASE, at=99.0)  # a heartbeat says False, not raises
    else:
        with pytest.raises(LeaseLost) as raised:
            _stale_write(old, operation)
        lost = raised.value
        assert (lost.session_id, lost.lease, lost.owner, lost.epoch) == ("s", LEASE, taken.owner, 2)
        assert str(lost) == (
            f"session 's' is now owned by 'worker-b/2' at epoch 2; lease ({OWNER!r}, 1) is stale"
        )
    assert (new.get("s"), new.events("s"), new.latest_checkpoint("s")) == before
    assert old.get("s") == before[0]


def test_the_new_owner_carries_on_where_the_log_ends(open_store: StoreFactory) -> None:
    old, new = open_store(), open_store()
    old.create("s", owner=OWNER, meta={}, at=1.0)
    old.append(event("s", 1), lease=LEASE, status="talking")
    lease = new.take_over("s", owner="worker-b/2", at=3.0)

    assert new.touch("s", lease=lease, at=4.0)
    new.append(event("s", 2, writer="new"), lease=lease, status="resumed")
    new.save_checkpoint(Checkpoint("s", 2, {"gate": "open"}, 5.0), lease=lease)
    with pytest.raises(SequenceConflict):  # the lease holder still continues the log exactly
        new.append(event("s", 4), lease=lease, status="gap")
    new.append(event("s", 3), lease=lease, status="ended", terminal_state="completed")
    assert old.events("s") == [event("s", 1), event("s", 2, writer="new"), event("s", 3)]
    summary = old.get("s")
    assert summary is not None
    assert (summary.owner, summary.lease_epoch, summary.terminal_state) == (
        "worker-b/2",
        2,
        "completed",
    )
    # The stale lease hears LeaseLost, not SessionFinished: it must stop, not reload.
    with pytest.raises(LeaseLost):
        old.append(event("s", 4), lease=LEASE, status="late")
    # The current lease of an ended session hears SessionFinished, whatever the seq.
    with pytest.raises(SessionFinished):
        new.append(event("s", 9), lease=lease, status="late")
    with pytest.raises(UnknownSession):
        new.append(event("nobody", 1), lease=lease, status="x")


def test_an_ended_or_unknown_session_cannot_be_taken_over(store: SessionStore) -> None:
    store.create("s", owner=OWNER, meta={}, at=1.0)
    store.append(event("s", 1), lease=LEASE, status="ended", terminal_state="failed")
    before = store.get("s")
    with pytest.raises(SessionFinished) as raised:
        store.take_over("s", owner="worker-b/2", at=5.0)
    assert raised.value.terminal_state == "failed"
    assert store.get("s") == before
    with pytest.raises(UnknownSession):
        store.take_over("nobody", owner="worker-b/2", at=5.0)
    assert store.get("nobody") is None


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["take_over", "append", "touch"]), st.integers(0, 9)),
        max_size=20,
    )
)
def test_only_the_latest_lease_writes(store: SessionStore, steps: list[tuple[str, int]]) -> None:
    """Any interleaving of take-overs and writes: a write is accepted iff its lease is the last
    one handed out, and the log is exactly the accepted writes."""
    session_id = f"l{next(_SESSIONS)}"
    handed_out = [store.create(session_id, owner="w0/a", meta={}, at=0.0)]
    accepted: list[EventRecord] = []
    for number, (step, pick) in enumerate(steps):
        current = handed_out[-1]
        lease = handed_out[pick % len(handed_out)]
        if step == "take_over":
            taken = store.take_over(session_id, owner=f"w{pick % 3}/a", at=float(number))
            assert taken == Lease(f"w{pick % 3}/a", current.epoch + 1)
            handed_out.append(taken)
        elif step == "touch":
            assert store.touch(session_id, lease=lease, at=float(number)) == (lease == current)
        else:
            record = event(session_id, len(accepted) + 1, step=number)
            try:
                store.append(record, lease=lease, status=f"s{number}")
            except LeaseLost as lost:
                assert lease != current
                assert (lost.owner, lost.epoch) == (current.owner, current.epoch)
            else:
                assert lease == current
                accepted.append(record)
    assert store.events(session_id) == accepted
    summary = store.get(session_id)
    assert summary is not None
    assert (summary.owner, summary.lease_epoch) == (handed_out[-1].owner, len(handed_out))


# ---- SQLite only ----------------------------------------------------------------------------


def _append_worker(path: str, session_id: str, writer: int, count: int, go: Any) -> None:
    """A separate process appending ``count`` events, re-reading the log after each conflict."""
    store = SqliteSessionStore(Path(path))
    go.wait(30)
    written = 0
    while written < count:
        summary = store.get(session_id)
        assert summary is not None
        record = event(session_id, summary.last_seq + 1, writer=writer, n=written)
        try:
            store.append(record, lease=LEASE, status=f"writer {writer}")
        except SequenceConflict:
            continue
        written += 1
    store.close()


def test_processes_sharing_the_file_never_fork_the_log(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    store = SqliteSessionStore(path)
    store.create("s", owner=OWNER, meta={}, at=1.0)
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    workers = [
        context.Process(target=_append_worker, args=(str(path), "s", writer, 25, go))
        for writer in range(3)
    ]
    for worker in workers:
        worker.start()
    go.set()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0]

    log = store.events("s")
    store.close()
    assert [record.seq for record in log] == list(range(1, 76))
    for writer in range(3):
        mine = [r.payload["n"] for r in log if r.payload["writer"] == writer]
        assert mine == list(range(25))


def test_sqlite_is_opened_for_durability(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    store = SqliteSessionStore(path)
    own = store._db  # synchronous, busy_timeout and foreign_keys are per connection
    assert own.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    assert own.execute("PRAGMA busy_timeout").fetchone() == (5000,)
    assert own.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert own.isolation_level is None
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {
            "sessions",
            "events",
            "checkpoints",
            "tool_intents",
            "tool_receipts",
            "resume_handles",
            "schema_version",
            "nodes",
        }
        types = {
            row[2].upper()
            for table in tables
            for row in db.execute(f"PRAGMA table_info({table})").fetchall()
        }
    db.close()
    assert types <= {"TEXT", "REAL", "INTEGER"}  # no BLOB: no raw audio column


def test_sqlite_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    SqliteSessionStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO schema_version VALUES (?, 1.0, 'a later release')", (SCHEMA_VERSION + 1,)
        )
    db.close()
    newer = f"schema version {SCHEMA_VERSION + 1}, newer than the {SCHEMA_VERSION}"
    with pytest.raises(SchemaTooNew, match=newer):
        SqliteSessionStore(path)
    with pytest.raises(SchemaTooNew, match=newer):  # and migrate does not touch it either
        SqliteSessionStore(path, upgrade=True)


# The schema of version 1, as released: a file written by it must open, migrated, and keep its data.
_V1_SCHEMA = (
    """CREATE TABLE sessions (
        session_id     TEXT PRIMARY KEY,
        created_at     REAL NOT NULL,
        updated_at     REAL NOT NULL,
        last_seq       INTEGER NOT NULL DEFAULT 0,
        owner          TEXT,
        status         TEXT NOT NULL,
        terminal_state TEXT CHECK (terminal_state IN
            ('completed', 'canceled', 'timed_out', 'failed', 'needs_human')),
        meta           TEXT NOT NULL)""",
    "CREATE INDEX sessions_newest ON sessions (created_at DESC, session_id DESC)",
    "CREATE INDEX sessions_open ON sessions (updated_at) WHERE terminal_state IS NULL",
    """CREATE TABLE events (
        session_id TEXT NOT NULL REFERENCES sessions,
        seq        INTEGER NOT NULL CHECK (seq >= 1),
        type       TEXT NOT NULL,
        payload    TEXT NOT NULL,
        effects    TEXT NOT NULL,
        at         REAL NOT NULL,
        PRIMARY KEY (session_id, seq)) WITHOUT ROWID""",
    """CREATE TABLE checkpoints (
        session_id TEXT PRIMARY KEY REFERENCES sessions,
        seq        INTEGER NOT NULL,
        state      TEXT NOT NULL,
        at         REAL NOT NULL)""",
    """CREATE TABLE tool_intents (
        idempotency_key TEXT PRIMARY KEY,
        session_id      TEXT NOT NULL REFERENCES sessions,
        turn_id         TEXT NOT NULL,
        tool            TEXT NOT NULL,
        kind            TEXT NOT NULL CHECK (kind IN ('read', 'write')),
        digest          TEXT NOT NULL,
        arguments       TEXT NOT NULL,
        created_at      REAL NOT NULL)""",
    "CREATE INDEX tool_intents_session ON tool_intents (session_id, created_at)",
    """CREATE TABLE tool_receipts (
        idempotency_key TEXT PRIMARY KEY REFERENCES tool_intents,
        outcome         TEXT NOT NULL CHECK (outcome IN
            ('committed', 'failed', 'not_started', 'unknown')),
        detail          TEXT NOT NULL,
        at              REAL NOT NULL)""",
)


def _write_v1_file(path: Path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for statement in _V1_SCHEMA:
        db.execute(statement)
    db.execute(
        "INSERT INTO sessions VALUES ('open', 1.0, 2.0, 1, 'worker-a/1', 'talking', NULL, '{}')"
    )
    db.execute(
        "INSERT INTO sessions VALUES ('done', 1.0, 3.0, 1, 'worker-a/1', 'ended', 'completed',"
        ' \'{"caller": "***4567"}\')'
    )
    for session_id in ("open", "done"):
        db.execute(
            "INSERT INTO events VALUES (?, 1, 'note', '{\"n\":1}', '[]', 2.0)", (session_id,)
        )
    db.execute("PRAGMA user_version=1")
    db.close()


def _columns(path: Path) -> list[tuple[Any, ...]]:
    """Every table's columns and every index, as SQLite describes them."""
    with sqlite3.connect(path) as db:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        (recorded,) = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master ORDER BY name")]
        columns = [
            (name, *column)
            for name in names
            for column in db.execute(f"PRAGMA table_info({name})").fetchall()
        ]
    db.close()
    assert version == recorded == SCHEMA_VERSION
    return [(name,) for name in names] + columns


def test_sqlite_migrates_a_version_1_file_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    _write_v1_file(path)
    with pytest.raises(SchemaTooOld, match=r"version 1, older than .*: run voicegate migrate"):
        SqliteSessionStore(path)  # a server does not migrate: voicegate migrate does

    store = SqliteSessionStore(path, upgrade=True)
    opened = store.get("open")
    assert opened is not None
    assert (opened.owner, opened.lease_epoch, opened.last_seq, opened.status) == (
        "worker-a/1",
        1,
        1,
        "talking",
    )
    done = store.get("done")
    assert done is not None
    assert (done.lease_epoch, done.terminal_state, done.meta, done.tenant) == (
        1,
        "completed",
        {"caller": "***4567"},
        "default",  # sessions from before tenants are the default tenant's
    )
    assert store.events("open") == [EventRecord("open", 1, "note", {"n": 1}, [], 2.0)]
    # The owner of a v1 session holds epoch 1 and goes on writing until someone takes it over.
    store.append(event("open", 2), lease=Lease("worker-a/1", 1), status="resumed")
    assert store.take_over("open", owner="worker-b/1", at=9.0) == Lease("worker-b/1", 2)
    store.close()

    # Reopening a migrated file is a no-op; it has the very table a new file has.
    SqliteSessionStore(path).close()
    SqliteSessionStore(tmp_path / "new.sqlite3").close()
    assert _columns(path) == _columns(tmp_path / "new.sqlite3")


def _take_over_worker(
    path: str, session_id: str, writer: int, rounds: int, barrier: Any, results: Any
) -> None:
    """A separate process that, each round, takes the session over as soon as every process is
    ready (so the take-overs race), then appends until fenced out or 5 events are written.

    On even rounds every process also waits until all have taken over before it writes, so two
    of the three are certainly fenced out whatever the scheduler does; odd rounds race freely."""
    store = SqliteSessionStore(Path(path))
    epochs: list[int] = []
    written: list[int] = []
    refused = {"lease_lost": 0, "sequence_conflict": 0}
    for round_number in range(rounds):
        barrier.wait(30)
        lease = store.take_over(session_id, owner=f"worker-{writer}/x", at=float(writer))
        epochs.append(lease.epoch)
        if round_number % 2 == 0:
            barrier.wait(30)
        for _ in range(5):
            summary = store.get(session_id)
            assert summary is not None
            seq = summary.last_seq + 1
            record = event(session_id, seq, writer=writer, epoch=lease.epoch)
            try:
                store.append(record, lease=lease, status=f"writer {writer}")
            except LeaseLost:
                refused["lease_lost"] += 1
                break
            except SequenceConflict:
                refused["sequence_conflict"] += 1
                continue
            written.append(seq)
    store.close()
    results.put((writer, epochs, written, refused))


def test_processes_racing_take_overs_leave_one_writer_per_epoch(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    store = SqliteSessionStore(path)
    store.create("s", owner=OWNER, meta={}, at=1.0)
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(3), context.Queue()
    workers = [
        context.Process(
            target=_take_over_worker, args=(str(path), "s", writer, 20, barrier, results)
        )
        for writer in range(3)
    ]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0]

    log = store.events("s")
    summary = store.get("s")
    store.close()
    assert summary is not None
    epochs = sorted(epoch for _, taken, _, _ in reports for epoch in taken)
    # Every take-over got its own epoch, one after the other from the creator's 1.
    assert epochs == list(range(2, 2 + len(epochs)))
    assert summary.lease_epoch == 1 + len(epochs)
    # No seq twice, no gap: the log is exactly the writes that were accepted.
    assert [record.seq for record in log] == list(range(1, len(log) + 1))
    assert sorted(seq for _, _, written, _ in reports for seq in written) == [
        record.seq for record in log
    ]
    # Fencing: each event was written under its writer's own lease, and a later epoch's event is
    # never followed by an earlier epoch's.
    taken_by = {epoch: writer for writer, taken, _, _ in reports for epoch in taken}
    assert all(taken_by[r.payload["epoch"]] == r.payload["writer"] for r in log)
    logged_epochs = [record.payload["epoch"] for record in log]
    assert logged_epochs == sorted(logged_epochs)
    # Refused writes were all fenced (LeaseLost) or, at worst, seq conflicts; and it did race.
    assert sum(refused["lease_lost"] for *_, refused in reports) > 0
