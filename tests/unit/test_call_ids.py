"""Turn and response ids are unique within a session across the dialogs it had (a rejoin or a
callback is a new signaling generation, whose call numbers its own from 1)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from session import events as sev
from session.durable import DurableSession
from session.store.sqlite import SqliteSessionStore
from voicegate.call.call_state import CallState


def test_a_later_dialogs_ids_carry_its_generation(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    try:
        session, _ = DurableSession.create(
            store, "s1", owner="w/1", meta={}, offered=sev.CallOffered(), now=1.0
        )
        call = CallState("s1", session=session)
        assert (call.next_id("r", 1), call.next_id("t", 2)) == ("r1", "t2")
        assert CallState("s2").next_id("r", 3) == "r3"  # before its session exists
        later = CallState("s1", session=session)
        # As after a second rejoin (session/away.py moves the generation on).
        session.state = dataclasses.replace(session.state, signaling_generation=2)
        assert (later.next_id("r", 1), later.next_id("t", 1)) == ("g2.r1", "g2.t1")
    finally:
        store.close()
