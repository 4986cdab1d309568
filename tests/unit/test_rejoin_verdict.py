"""voicegate/call/rejoin.py against the real SQLite store: what presenting a handle comes to,
and that a refusal changes nothing; the reaper's end of an away session (session/reaper.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from session import events as ev
from session.durable import DurableSession
from session.reaper import expire_away, reap_stale
from session.resume import ResumeResult, issue
from session.state import Signaling
from session.store.sqlite import SqliteSessionStore
from voicegate.call.rejoin import report_reuse, verify_and_take

TTL = 600.0
T0 = 1_800_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteSessionStore]:
    s = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    yield s
    s.close()


def _away(store: SqliteSessionStore, sid: str = "s1", tenant: str = "main") -> str:
    """A session transferred out blind; returns the handle its REFER carried."""
    lease = store.create(sid, owner="w1/a", meta={}, at=T0, tenant=tenant)
    session = DurableSession(store, DurableSession.load(store, sid).state, lease)
    session.apply(ev.CallOffered("***123", "service", {"resume_ttl_s": TTL}), T0)
    session.apply(ev.CallAnswered(), T0 + 1)
    session.apply(ev.TransferStarted("sip:desk@cc.example"), T0 + 2)
    session.apply(ev.TransferFinished(1, ok=True, status=200), T0 + 3)
    assert session.state.signaling is Signaling.AWAY
    handle = issue(sid, tenant, now=T0 + 2, ttl_s=TTL)
    store.record_handle(handle.record)
    return handle.text


def _snapshot(store: SqliteSessionStore, sid: str = "s1") -> tuple[object, ...]:
    summary = store.get(sid)
    assert summary is not None
    return (summary.last_seq, summary.lease_epoch, summary.owner, summary.status)


def test_a_valid_handle_rotates_and_takes_the_session_over_at_the_next_epoch(
    store: SqliteSessionStore,
) -> None:
    text = _away(store)
    verdict = verify_and_take(store, text, tenant="main", owner="w2/b", now=T0 + 10, ttl_s=TTL)
    assert verdict.result is ResumeResult.OK and not verdict.busy
    assert verdict.session is not None and verdict.session.lease is not None
    assert verdict.session.lease.epoch == 2 and verdict.session.lease.owner == "w2/b"
    assert verdict.successor is not None
    current = store.resume_handle(verdict.successor.record.selector)
    assert current is not None and current.state == "current"
    # Used once: again it is a reuse, and nothing moves.
    before = _snapshot(store)
    again = verify_and_take(store, text, tenant="main", owner="w3/c", now=T0 + 11, ttl_s=TTL)
    assert (again.result, again.session_id, again.session) == (ResumeResult.REUSED, "s1", None)
    assert _snapshot(store) == before
    assert text not in repr(verdict) and text not in repr(again)


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("other tenant", ResumeResult.CROSS_TENANT),
        ("forged", ResumeResult.INVALID),
        ("malformed", ResumeResult.INVALID),
        ("late", ResumeResult.EXPIRED),
    ],
)
def test_a_refused_handle_changes_nothing(
    store: SqliteSessionStore, how: str, expected: ResumeResult
) -> None:
    text = _away(store)
    before = _snapshot(store)
    tenant, now = "main", T0 + 10
    if how == "other tenant":
        tenant = "other"
    elif how == "forged":
        text = text[:-4] + ("AAAA" if not text.endswith("AAAA") else "BBBB")
    elif how == "malformed":
        text = "vgr1.nothing"
    else:
        now = T0 + 2 + TTL
    verdict = verify_and_take(store, text, tenant=tenant, owner="w2/b", now=now, ttl_s=TTL)
    assert (verdict.result, verdict.session, verdict.session_id) == (expected, None, "")
    assert _snapshot(store) == before


def test_a_session_with_its_caller_on_a_call_is_busy_and_its_handle_is_kept(
    store: SqliteSessionStore,
) -> None:
    text = _away(store)
    # Its previous call's BYE is still under way in this process.
    verdict = verify_and_take(
        store, text, tenant="main", owner="w2/b", now=T0 + 10, ttl_s=TTL, live=frozenset({"s1"})
    )
    assert verdict.busy and verdict.session is None and verdict.status == 486
    ok = verify_and_take(store, text, tenant="main", owner="w2/b", now=T0 + 11, ttl_s=TTL)
    assert ok.result is ResumeResult.OK and ok.session is not None


def test_a_reuse_of_an_away_sessions_handle_is_recorded_in_its_log(
    store: SqliteSessionStore,
) -> None:
    _away(store)
    assert report_reuse(store, "s1", owner="w2/b", now=T0 + 20)
    (last,) = store.events("s1", after_seq=4)
    assert last.type == "resume_reused"


def test_the_reaper_leaves_an_away_session_until_its_handle_expires_then_completes_it(
    store: SqliteSessionStore,
) -> None:
    _away(store)
    # Long past the heartbeat's staleness, but the caller may still come back.
    assert reap_stale(store, me="w9/z", now=T0 + 100, stale_after_s=30) == []
    assert expire_away(store, me="w9/z", now=T0 + 100) == []
    summary = store.get("s1")
    assert summary is not None and summary.terminal_state is None
    assert expire_away(store, me="w9/z", now=T0 + 3 + TTL) == ["s1"]
    summary = store.get("s1")
    assert summary is not None and summary.terminal_state == "completed"
    state = DurableSession.load(store, "s1").state
    assert state.ended is not None and state.ended.reason == "transferred"
    assert expire_away(store, me="w9/z", now=T0 + 4 + TTL) == []  # idempotent
