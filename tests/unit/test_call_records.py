from __future__ import annotations

from pathlib import Path

import pytest

from session.call_records import TERMINAL_STATES, CallRecordStore, UnknownTerminalState


def _offer(store: CallRecordStore, call_id: str, at: float = 1.0) -> None:
    store.offered(
        call_id=call_id,
        sip_call_id=f"sip-{call_id}",
        remote="<sip:***123@x>",
        called_user="service",
        transport="udp",
        at=at,
    )


def test_a_call_record_survives_reopening(tmp_path: Path) -> None:
    store = CallRecordStore(tmp_path / "db" / "calls.sqlite3")
    _offer(store, "a")
    store.answered("a", 2.0)
    assert store.ended("a", at=3.0, terminal_state="completed", reason="caller hung up")
    store.close()
    record = CallRecordStore(tmp_path / "db" / "calls.sqlite3").get("a")
    assert record is not None
    assert (record.answered_at, record.ended_at, record.terminal_state, record.reason) == (
        2.0,
        3.0,
        "completed",
        "caller hung up",
    )


def test_a_terminal_state_is_never_overwritten(tmp_path: Path) -> None:
    store = CallRecordStore(tmp_path / "calls.sqlite3")
    _offer(store, "a")
    assert store.ended("a", at=2.0, terminal_state="canceled", reason="first")
    assert not store.ended("a", at=3.0, terminal_state="failed", reason="second")
    record = store.get("a")
    assert record is not None and (record.terminal_state, record.reason) == ("canceled", "first")


@pytest.mark.parametrize("state", TERMINAL_STATES)
def test_every_terminal_state_is_accepted(tmp_path: Path, state: str) -> None:
    store = CallRecordStore(tmp_path / "calls.sqlite3")
    _offer(store, "a")
    assert store.ended("a", at=2.0, terminal_state=state, reason="r")


def test_an_unknown_terminal_state_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    store = CallRecordStore(tmp_path / "calls.sqlite3")
    _offer(store, "a")
    with pytest.raises(UnknownTerminalState, match="'connected'"):
        store.ended("a", at=2.0, terminal_state="connected", reason="r")
    record = store.get("a")
    assert record is not None and record.terminal_state is None


def test_orphans_are_finalised_once_as_failed_at_stage_process(tmp_path: Path) -> None:
    store = CallRecordStore(tmp_path / "calls.sqlite3")
    _offer(store, "open1")
    _offer(store, "open2", at=2.0)
    _offer(store, "done")
    store.ended("done", at=2.0, terminal_state="completed", reason="caller hung up")
    assert store.finalize_orphans(at=9.0, reason="process died") == ["open1", "open2"]
    assert store.finalize_orphans(at=10.0, reason="process died") == []
    record = store.get("open2")
    assert record is not None
    assert (record.terminal_state, record.stage, record.ended_at) == ("failed", "process", 9.0)
    done = store.get("done")
    assert done is not None and done.terminal_state == "completed"
    assert [r.call_id for r in store.recent()] == ["open2", "open1", "done"] or len(
        store.recent()
    ) == 3
