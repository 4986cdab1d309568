"""Persist, then act (voicegate/call/acting.py): an effect that leaves the process runs only once
its step is on disk, in log order; in-process effects do not wait for the disk."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from session import events as sev
from session.durable import DurableSession
from session.state import SessionState
from session.store.sqlite import SqliteSessionStore
from session.store.writer import StoreWriter
from voicegate.call.acting import Persisted, SessionSteps
from voicegate.call.call_state import CallState
from voicegate.call.clock import SessionClock
from voicegate.observe.metrics import Metrics


class Services:
    def __init__(self, store: SqliteSessionStore, writer: StoreWriter) -> None:
        self.store, self.writer, self.metrics = store, writer, Metrics()

    def record_effects(self, effects: list[Any]) -> None:
        pass


class Actions:
    """Records which effect actions ran, and what the store held when each ran."""

    def __init__(self, path: Path) -> None:
        self.ran: list[tuple[str, int]] = []
        self._reader = SqliteSessionStore(path)

    def __getattr__(self, name: str) -> Any:
        def action(*args: Any, **kwargs: Any) -> None:
            self.ran.append((name, len(self._reader.events("c1"))))

        return action


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteSessionStore]:
    s = SqliteSessionStore(tmp_path / "s.sqlite3")
    yield s
    s.close()


async def test_effects_that_leave_the_process_wait_for_their_write(
    store: SqliteSessionStore, tmp_path: Path
) -> None:
    writer = StoreWriter(lambda: SqliteSessionStore(store.path))
    try:
        lease = store.create("c1", owner="w/1", meta={}, at=1.0)
        state = CallState("c1", session=DurableSession(store, SessionState("c1"), lease))
        queue: asyncio.Queue[object] = asyncio.Queue()
        steps = SessionSteps(
            state,
            Services(store, writer),  # type: ignore[arg-type]
            SessionClock(),
            post=queue.put_nowait,
            on_halt=lambda: None,
        )
        actions = Actions(store.path)
        steps.attach(actions)  # type: ignore[arg-type]
        steps.apply(sev.CallOffered(policy={"max_duration_s": 60.0}))
        await steps.settled()

        disk = threading.Event()  # the disk is slow: the writer waits for this
        writer.submit(lambda _: disk.wait(5))
        steps.apply(sev.CallAnswered())  # arms timers: in-process, at once
        steps.apply(sev.ServerHangup("completed", "done"))  # a BYE: waits for the disk
        names = [name for name, _ in actions.ran]
        assert "schedule_timer" in names
        assert "hang_up" not in names and "release_media" not in names

        disk.set()
        while "hang_up" not in [name for name, _ in actions.ran]:
            item = await asyncio.wait_for(queue.get(), 5)
            assert isinstance(item, Persisted)
            item.then(item.done)
        # When the BYE went, the step that asked for it (seq 3) was already on disk.
        (on_disk,) = [count for name, count in actions.ran if name == "hang_up"]
        assert on_disk == 3
        assert [e.type for e in store.events("c1")] == [
            "call_offered",
            "call_answered",
            "server_hangup",
        ]
    finally:
        await asyncio.to_thread(writer.close)
