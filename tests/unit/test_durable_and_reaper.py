"""DurableSession (persist, then act) and the reaper, on a real SQLite store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from session import effects as fx
from session import events as ev
from session.durable import CHECKPOINT_EVERY, DurableSession, ReadOnlySession
from session.machine import IllegalTransition
from session.reaper import REASON_PREDECESSOR, reap_one, reap_predecessors, reap_stale
from session.state import SessionState
from session.store import Lease, LeaseLost, SequenceConflict, SessionFinished
from session.store.sqlite import SqliteSessionStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteSessionStore]:
    s = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    yield s
    s.close()


def _start(
    store: SqliteSessionStore, sid: str, owner: str = "w/1", at: float = 100.0
) -> DurableSession:
    session, _ = DurableSession.create(
        store,
        sid,
        owner=owner,
        meta={"called_user": "service"},
        offered=ev.CallOffered(caller="<sip:***123@x>", called_user="service"),
        now=at,
    )
    return session


def test_every_accepted_step_is_logged_with_its_effects(store: SqliteSessionStore) -> None:
    session = _start(store, "s1")
    session.apply(ev.CallAnswered(), 101.0)
    session.apply(ev.TurnStarted("t1"), 102.0)
    session.apply(ev.TurnCommitted("t1"), 102.5)
    effects = session.apply(ev.MediaLost(), 103.0)
    records = store.events("s1")
    assert [r.type for r in records] == [
        "call_offered",
        "call_answered",
        "turn_started",
        "turn_committed",
        "media_lost",
    ]
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    assert records[-1].effects == [e.to_dict() for e in effects]
    summary = store.get("s1")
    assert summary is not None and summary.status == session.state.status()
    assert "gate frozen" in summary.status


def test_an_illegal_event_changes_neither_state_nor_log(store: SqliteSessionStore) -> None:
    session = _start(store, "s1")
    before = session.state
    with pytest.raises(IllegalTransition, match="turn_started"):
        session.apply(ev.TurnStarted("t1"), 101.0)  # not answered yet
    assert session.state is before
    assert len(store.events("s1")) == 1


def test_stale_events_are_not_logged(store: SqliteSessionStore) -> None:
    session = _start(store, "s1")
    session.apply(ev.CallAnswered(), 101.0)
    effects = session.apply(ev.MediaRestored(generation=7), 102.0)
    assert isinstance(effects[0], fx.StaleEventIgnored)
    assert len(store.events("s1")) == 2


def test_load_rebuilds_the_live_state_from_checkpoint_and_tail(store: SqliteSessionStore) -> None:
    session = _start(store, "s1")
    session.apply(ev.CallAnswered(), 101.0)
    t = 102.0
    for i in range(CHECKPOINT_EVERY + 3):  # crosses a checkpoint, then a tail of events
        session.apply(ev.TurnStarted(f"t{i}"), t)
        session.apply(ev.TurnCommitted(f"t{i}"), t + 0.1)
        t += 1
    checkpoint = store.latest_checkpoint("s1")
    assert checkpoint is not None and 0 < checkpoint.seq < session.state.version
    assert DurableSession.load(store, "s1").state == session.state


def test_a_second_writer_with_a_stale_view_is_refused(store: SqliteSessionStore) -> None:
    mine = _start(store, "s1")
    theirs = DurableSession(store, mine.state, mine.lease)  # same lease, a view gone stale
    mine.apply(ev.CallAnswered(), 101.0)
    with pytest.raises(SequenceConflict):
        theirs.apply(ev.CallerHangup(), 101.5)
    assert DurableSession.load(store, "s1").state == mine.state


def test_a_loaded_session_is_read_only(store: SqliteSessionStore) -> None:
    _start(store, "s1")
    view = DurableSession.load(store, "s1")
    assert view.lease is None
    with pytest.raises(ReadOnlySession, match="take_over"):
        view.apply(ev.CallAnswered(), 101.0)
    assert len(store.events("s1")) == 1


def test_a_take_over_fences_the_previous_owner(store: SqliteSessionStore) -> None:
    mine = _start(store, "s1")
    mine.apply(ev.CallAnswered(), 101.0)
    assert mine.lease == Lease("w/1", 1)

    theirs = DurableSession.take_over(store, "s1", owner="w/2", now=102.0)
    assert theirs.lease == Lease("w/2", 2)
    assert theirs.state == mine.state  # the whole log, loaded after the lease was taken
    with pytest.raises(LeaseLost) as raised:
        mine.apply(ev.CallerHangup(), 103.0)
    assert (raised.value.owner, raised.value.epoch) == ("w/2", 2)
    assert mine.state == theirs.state  # not advanced
    theirs.apply(ev.CallerHangup(), 104.0)
    assert [r.type for r in store.events("s1")][-1] == "caller_hangup"
    with pytest.raises(SessionFinished):
        DurableSession.take_over(store, "s1", owner="w/3", now=105.0)


def test_predecessor_sessions_are_reaped_once_with_what_was_known(
    store: SqliteSessionStore,
) -> None:
    old = _start(store, "old", owner="worker-0/dead")
    old.apply(ev.CallAnswered(), 101.0)
    old.apply(ev.TurnStarted("t1"), 102.0)
    old.apply(ev.TurnCommitted("t1"), 102.1)
    old.apply(ev.ToolIntent("k1", "pay", "write", "d1", "t1"), 102.2)
    _start(store, "other-worker", owner="worker-1/alive")
    _start(store, "mine", owner="worker-0/me")

    assert reap_predecessors(store, worker="worker-0", me="worker-0/me", now=103.0) == ["old"]
    assert reap_predecessors(store, worker="worker-0", me="worker-0/me", now=104.0) == []
    state = DurableSession.load(store, "old").state
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage) == ("failed", "process")
    assert REASON_PREDECESSOR in state.ended.reason
    assert "1 tool call with unknown outcome left for reconciliation" in state.ended.reason
    # The intent is kept, never assumed.
    assert state.outstanding_keys() == ("k1",)
    for sid in ("other-worker", "mine"):
        summary = store.get(sid)
        assert summary is not None and summary.terminal_state is None
    # The reaper took the session over before finalising it: the dead owner is fenced out.
    summary = store.get("old")
    assert summary is not None and (summary.owner, summary.lease_epoch) == ("worker-0/me", 2)
    with pytest.raises(LeaseLost):
        old.apply(ev.CallerHangup(), 105.0)


class _Racing:
    """A store on which another writer acts just before or just after the reaper's take-over."""

    def __init__(self, store: SqliteSessionStore, before: Any, after: Any) -> None:
        self._store, self._before, self._after = store, before, after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def take_over(self, session_id: str, *, owner: str, at: float) -> Lease:
        self._before()
        lease = self._store.take_over(session_id, owner=owner, at=at)
        self._after()
        return lease


def test_the_reaper_gives_way_to_an_owner_that_ended_the_session(
    store: SqliteSessionStore,
) -> None:
    owner = _start(store, "s1", at=0.0)
    (summary,) = store.open_sessions()
    racing = _Racing(store, lambda: owner.apply(ev.CallerHangup(), 999.0), lambda: None)
    assert not reap_one(racing, summary, me="w/reaper", now=1000.0, reason="test")
    ended = store.get("s1")
    assert ended is not None and (ended.terminal_state, ended.lease_epoch) == ("canceled", 1)
    assert [r.type for r in store.events("s1")] == ["call_offered", "caller_hangup"]


def test_the_reaper_gives_way_to_a_later_take_over(
    store: SqliteSessionStore, tmp_path: Path
) -> None:
    _start(store, "s1", at=0.0)
    rival = SqliteSessionStore(tmp_path / "sessions.sqlite3")  # another worker's connection
    try:
        (summary,) = store.open_sessions()
        racing = _Racing(
            store, lambda: None, lambda: rival.take_over("s1", owner="w/rival", at=1000.0)
        )
        assert not reap_one(racing, summary, me="w/reaper", now=1000.0, reason="test")
    finally:
        rival.close()
    after = store.get("s1")
    assert after is not None and after.terminal_state is None
    assert (after.owner, after.lease_epoch) == ("w/rival", 3)
    assert [r.type for r in store.events("s1")] == ["call_offered"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ages=st.lists(st.floats(min_value=0, max_value=600), min_size=1, max_size=8),
    threshold=st.floats(min_value=10, max_value=300),
    touched=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_the_reaper_is_idempotent_and_never_touches_a_live_session(
    tmp_path_factory: pytest.TempPathFactory,
    ages: list[float],
    threshold: float,
    touched: list[bool],
) -> None:
    store = SqliteSessionStore(tmp_path_factory.mktemp("reaper") / "s.sqlite3")
    now = 10_000.0
    try:
        for i, age in enumerate(ages):
            _start(store, f"s{i}", owner=f"w/{i}", at=now - age)
            if touched[i]:
                # A live owner heartbeats well inside the threshold.
                store.touch(f"s{i}", lease=Lease(f"w/{i}", 1), at=now - threshold / 3)
        first = reap_stale(store, me="reaper/1", now=now, stale_after_s=threshold)
        second = reap_stale(store, me="reaper/1", now=now, stale_after_s=threshold)
        assert second == []
        for i, age in enumerate(ages):
            summary = store.get(f"s{i}")
            assert summary is not None
            # As the store compares (not ``age > threshold``, which rounds differently).
            stale = now - age < now - threshold and not touched[i]
            assert (f"s{i}" in first) == stale
            assert (summary.terminal_state == "failed") == stale
            # A reaped session was taken over first; a live one kept its owner's lease.
            expected = ("reaper/1", 2) if stale else (f"w/{i}", 1)
            assert (summary.owner, summary.lease_epoch) == expected
    finally:
        store.close()


def test_a_reaped_session_refuses_its_late_owner(store: SqliteSessionStore) -> None:
    session = _start(store, "s1", at=0.0)
    session.apply(ev.CallAnswered(), 1.0)
    assert reap_stale(store, me="w/2", now=1000.0, stale_after_s=120) == ["s1"]
    events = store.events("s1")
    # The late owner's write does not resurrect it: its lease was taken before the reaping.
    with pytest.raises(LeaseLost) as raised:
        session.apply(ev.CallerHangup(), 1001.0)
    assert (raised.value.owner, raised.value.epoch) == ("w/2", 2)
    assert session.lease is not None
    assert not store.touch("s1", lease=session.lease, at=1002.0)
    assert store.events("s1") == events
    reloaded = DurableSession.load(store, "s1").state
    assert reloaded.ended is not None and reloaded.ended.terminal_state == "failed"
    assert SessionState.from_dict(reloaded.to_dict()) == reloaded
