"""Committed session histories still replay to the final state they were captured with.

STYLE.md habit 6: the event log is the truth, so a change to the machine or to the events that
stops an old log from folding, or folds it to another state, must fail here, naming the history
and the seq. See README.md in this directory for how to capture histories and read a failure.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.replay import capture
from tests.replay.replayer import (
    HISTORIES,
    FinalStateDiffers,
    HistoryUnreadable,
    ReplayDiverged,
    check,
    final_path,
)

COMMITTED = sorted(HISTORIES.glob("*.jsonl"))


def test_there_are_histories_to_replay() -> None:
    assert COMMITTED, f"no *.jsonl in {HISTORIES}"
    for history in COMMITTED:
        assert final_path(history).exists(), f"{history.name} has no final state beside it"


@pytest.mark.parametrize("history", COMMITTED, ids=lambda p: p.name.removesuffix(".jsonl"))
def test_a_committed_history_replays_to_its_final_state(history: Path) -> None:
    check(history)


def test_the_example_generator_still_writes_the_committed_example(tmp_path: Path) -> None:
    assert capture.main(["--example", "media-gap-then-hangup", "--out", str(tmp_path)]) == 0
    for name in ("media-gap-then-hangup.jsonl", "media-gap-then-hangup.final.json"):
        assert (tmp_path / name).read_text() == (HISTORIES / name).read_text(), name


# --- the checker fails loudly ---------------------------------------------------------------------


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the example history to break."""
    for name in ("media-gap-then-hangup.jsonl", "media-gap-then-hangup.final.json"):
        shutil.copy(HISTORIES / name, tmp_path / name)
    return tmp_path / "media-gap-then-hangup.jsonl"


def edit_line(history: Path, seq: int, **changes: object) -> None:
    lines = history.read_text().splitlines()
    record = json.loads(lines[seq - 1])
    record.update(changes)
    lines[seq - 1] = json.dumps(record)
    history.write_text("\n".join(lines) + "\n")


def test_the_copy_replays_before_it_is_broken(copy: Path) -> None:
    check(copy)


def test_an_event_type_that_no_longer_exists_names_the_file_and_seq(copy: Path) -> None:
    edit_line(copy, 7, type="media_vanished")
    with pytest.raises(HistoryUnreadable, match=r"media-gap-then-hangup.jsonl at seq 7: unknown"):
        check(copy)


def test_a_renamed_field_names_the_file_and_seq(copy: Path) -> None:
    edit_line(copy, 10, payload={"gen": 1})
    with pytest.raises(HistoryUnreadable, match=r"at seq 10: bad payload for media_restored"):
        check(copy)


def test_an_event_now_refused_names_the_seq(copy: Path) -> None:
    edit_line(copy, 2, type="call_offered")
    with pytest.raises(ReplayDiverged, match=r"at seq 2: now refused: .*already offered"):
        check(copy)


def test_an_event_now_stale_names_the_seq(copy: Path) -> None:
    edit_line(copy, 10, payload={"generation": 7})
    with pytest.raises(ReplayDiverged, match=r"at seq 10: logged, but now ignored as stale"):
        check(copy)


def test_a_different_final_state_names_the_field(copy: Path) -> None:
    final = final_path(copy)
    data = json.loads(final.read_text())
    data["ended"]["reason"] = "caller hung up politely"
    final.write_text(json.dumps(data))
    with pytest.raises(
        FinalStateDiffers,
        match=r"(?s)at seq 13: .*ended.reason: was 'caller hung up politely', now 'caller hung up'",
    ):
        check(copy)


def test_a_gap_in_the_seqs_is_unreadable(copy: Path) -> None:
    lines = copy.read_text().splitlines()
    copy.write_text("\n".join(lines[:4] + lines[5:]) + "\n")
    with pytest.raises(HistoryUnreadable, match=r"at seq 6: expected seq 5"):
        check(copy)


# --- capturing from a store -------------------------------------------------------------------


def test_a_session_exported_from_a_sqlite_store_replays(tmp_path: Path) -> None:
    from session import events as ev
    from session.durable import DurableSession
    from session.store.sqlite import SqliteSessionStore
    from session.vocabulary import OwnerId

    session_id, records = capture.media_gap_then_hangup()
    db = tmp_path / "voicegate.sqlite3"
    store = SqliteSessionStore(db)
    try:
        first, *rest = records
        offered = ev.event_from_dict(first.type, first.payload)
        assert isinstance(offered, ev.CallOffered)
        session, _ = DurableSession.create(
            store,
            session_id,
            owner=OwnerId("worker-0", "0123456789ab").format(),
            meta={"caller": offered.caller},
            offered=offered,
            now=first.at,
        )
        for record in rest:
            session.apply(ev.event_from_dict(record.type, record.payload), record.at)
    finally:
        store.close()

    out = tmp_path / "histories"
    args = ["--db", str(db), "--session", session_id, "--name", "exported", "--out", str(out)]
    assert capture.main(args) == 0
    state = check(out / "exported.jsonl")
    assert state.ended is not None and state.ended.terminal_state == "completed"
    # The store keeps what the machine produced, so the export is the crafted history itself.
    assert (out / "exported.jsonl").read_text() == (
        HISTORIES / "media-gap-then-hangup.jsonl"
    ).read_text()
