"""voicegate/call/callback_match.py against the real SQLite store: which dropped session a new call
matches (tenant, caller digest, window), taking it back, ending it; and the reaper's end of a
dropped session once its window passed (session/reaper.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from session import events as ev
from session.deadlines import Timer
from session.durable import DurableSession
from session.reaper import expire_dropped, reap_stale
from session.state import Signaling
from session.store import SessionStore
from session.store.postgres import PostgresSessionStore
from session.store.sqlite import SqliteSessionStore
from voicegate.call.callback_match import CALLER_KEY, end_dropped, find_dropped, take_back

WINDOW = 120.0
T0 = 1_800_000_000.0
DROPPED_AT = T0 + 24.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    """Matching is as atomic on the shared store as on the embedded one."""
    s: SessionStore
    if request.param == "sqlite":
        s = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    else:
        s = PostgresSessionStore(request.getfixturevalue("pg_url"))
    yield s
    s.close()


def _dropped(
    store: SessionStore, sid: str, caller_key: str = "k-caller", tenant: str = "main"
) -> None:
    """A session whose media was lost for good, with a payment under way and a code issued."""
    lease = store.create(sid, owner="w1/a", meta={CALLER_KEY: caller_key}, at=T0, tenant=tenant)
    session = DurableSession(store, DurableSession.load(store, sid).state, lease)
    policy = {"callback_window_s": WINDOW, "recovery_timeout_s": 20.0}
    session.apply(ev.CallOffered("***177", "service", policy), T0)
    session.apply(ev.CallAnswered(), T0 + 1)
    session.apply(ev.ResumeCodeIssued("digest-of-code"), T0 + 2)
    session.apply(ev.MediaLost(), T0 + 4)
    deadline = session.state.deadlines[Timer.RECOVERY]
    session.apply(ev.DeadlineFired(Timer.RECOVERY, deadline.generation), DROPPED_AT)
    assert session.state.signaling is Signaling.DROPPED


def _find(store: SessionStore, now: float, **kw: str) -> str | None:
    args = {"tenant": "main", "caller_key": "k-caller", **kw}
    found = find_dropped(store, now=now, busy=frozenset(), **args)
    return found.session_id if found else None


def test_a_call_matches_only_its_tenants_dropped_session_of_its_caller_within_the_window(
    store: SessionStore,
) -> None:
    _dropped(store, "s1")
    found = find_dropped(
        store, tenant="main", caller_key="k-caller", now=DROPPED_AT + 1, busy=frozenset()
    )
    assert found is not None and found.session_id == "s1"
    assert found.code_digest == "digest-of-code" and "digest" not in repr(found)
    assert _find(store, DROPPED_AT + 1, caller_key="k-stranger") is None
    assert _find(store, DROPPED_AT + 1, tenant="other") is None
    # After the window: a new session, whatever the number.
    assert _find(store, DROPPED_AT + WINDOW) is None
    busy = find_dropped(
        store, tenant="main", caller_key="k-caller", now=DROPPED_AT + 1, busy=frozenset({"s1"})
    )
    assert busy is None


def test_taking_it_back_moves_the_lease_once(store: SessionStore) -> None:
    _dropped(store, "s1")
    assert take_back(store, "s1", owner="w2/b", now=DROPPED_AT + WINDOW) is None  # too late
    verdict = take_back(store, "s1", owner="w2/b", now=DROPPED_AT + 5)
    assert verdict is not None and verdict.session is not None
    assert verdict.session.lease is not None and verdict.session.lease.epoch == 2
    assert verdict.results == ()  # the payment has no receipt: it reconciles after the callback
    verdict.session.apply(ev.CalledBack(1, "***177", with_code=True), DROPPED_AT + 6)
    assert take_back(store, "s1", owner="w3/c", now=DROPPED_AT + 7) is None
    assert _find(store, DROPPED_AT + 7) is None
    assert not end_dropped(store, "s1", "declined", owner="w3/c", now=DROPPED_AT + 7)


def test_a_caller_who_chooses_a_new_session_ends_the_dropped_one_as_it_would_have(
    store: SessionStore,
) -> None:
    _dropped(store, "s1")
    assert end_dropped(store, "s1", "code_refused", owner="w2/b", now=DROPPED_AT + 5)
    summary = store.get("s1")
    assert summary is not None and summary.terminal_state == "timed_out"
    assert summary.status.startswith("timed_out at recovery: ")
    assert not end_dropped(store, "s1", "declined", owner="w2/b", now=DROPPED_AT + 6)


def test_the_reaper_leaves_a_dropped_session_until_its_window_passes(
    store: SessionStore,
) -> None:
    _dropped(store, "s1")
    # Nobody touches it, yet it is not lost: reap_stale leaves it to expire_dropped.
    assert reap_stale(store, me="w9/r", now=DROPPED_AT + 60, stale_after_s=30) == []
    assert expire_dropped(store, me="w9/r", now=DROPPED_AT + WINDOW - 1) == []
    assert expire_dropped(store, me="w9/r", now=DROPPED_AT + WINDOW) == ["s1"]
    state = DurableSession.load(store, "s1").state
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage) == ("timed_out", "recovery")
    assert state.ended.reason == "media not recovered within 20 s"
    assert expire_dropped(store, me="w9/r", now=DROPPED_AT + WINDOW + 1) == []  # idempotent
