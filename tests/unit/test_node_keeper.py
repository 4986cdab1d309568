"""The node keeper (voicegate/pool/cluster.py) on a real store with a fake clock: a node silent
past dead_after_s has its sessions taken over by one survivor, a live one never does, and after
an outage of the store nobody is judged dead before the live nodes could heartbeat again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from config.settings import NodeSettings, Settings
from session import events as sev
from session.durable import DurableSession
from session.store import SessionStore, StoreUnavailable
from session.store.nodes import NodeRecord, NodeWorker
from session.store.sqlite import SqliteSessionStore
from session.store.writer import StoreWriter
from voicegate.observe.pool_metrics import PoolMetrics
from voicegate.pool.cluster import NodeKeeper

DEAD_AFTER_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteSessionStore]:
    s = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    yield s
    s.close()


_writers: list[StoreWriter] = []


@pytest.fixture(autouse=True)
def _close_writers() -> Iterator[None]:
    yield
    while _writers:
        _writers.pop().close()


class Keeper:
    """A keeper of node ``me`` on its own connection, on a writer thread as a supervisor's is,
    whose store can be made to fail."""

    def __init__(self, store: SqliteSessionStore, clock: Clock, me: str = "b") -> None:
        self.down = False
        path = store.path
        self.writer = StoreWriter(lambda: SqliteSessionStore(path), name=f"keeper-{me}")
        _writers.append(self.writer)

        async def job(work: Callable[[SessionStore], Any]) -> Any:
            if self.down:
                raise StoreUnavailable("the test's database is away")
            return await asyncio.wrap_future(self.writer.submit(work))

        settings = Settings(node=NodeSettings(name=me, heartbeat_s=1.0, dead_after_s=DEAD_AFTER_S))
        self.metrics = PoolMetrics()
        self.keeper = NodeKeeper(
            settings,
            incarnation="inc-b",
            session_owner=f"{me}.supervisor/inc-b",
            workers=[NodeWorker(f"{me}.0", "sip:10.0.0.3:5100")],
            write=job,
            read=job,
            http=lambda: cast(aiohttp.ClientSession, None),
            metrics=self.metrics,
            clock=clock,
            monotonic=clock,
        )


def _node_a(store: SessionStore, at: float) -> None:
    store.node_heartbeat(NodeRecord("a", "inc-a", "http://a", (), at, at, "up"))


def _live_call_of_a(store: SessionStore, at: float) -> None:
    session, _ = DurableSession.create(
        store, "s1", owner="a.0/inc-a", meta={}, offered=sev.CallOffered(), now=at
    )
    session.apply(sev.CallAnswered(), at)


async def test_a_silent_node_is_taken_over_once_and_its_call_ends_failed_at_process(
    store: SqliteSessionStore,
) -> None:
    clock = Clock()
    _node_a(store, clock.now)
    _live_call_of_a(store, clock.now)
    b = Keeper(store, clock)
    await b.keeper.start()
    clock.now += DEAD_AFTER_S - 1
    await b.keeper.beat()
    assert store.get("s1").terminal_state is None  # type: ignore[union-attr]  # not yet dead
    clock.now += 2
    await b.keeper.beat()
    summary = store.get("s1")
    assert summary is not None and summary.terminal_state == "failed"
    assert summary.owner == "b.supervisor/inc-b" and summary.lease_epoch == 2
    reaped = store.events("s1")[-1]
    assert reaped.type == "session_reaped"
    assert reaped.payload["reason"] == "the node serving the session died"
    (a,) = [n for n in store.nodes() if n.name == "a"]
    assert a.taken_over_by == "b/inc-b"
    assert b.metrics.sessions_taken_over.labels("a")._value.get() == 1
    # A second survivor finds nothing left, and claims nothing.
    c = Keeper(store, clock, me="c")
    await c.keeper.start()
    clock.now += DEAD_AFTER_S + 1
    await b.keeper.beat()
    await c.keeper.beat()
    (a,) = [n for n in store.nodes() if n.name == "a"]
    assert a.taken_over_by == "b/inc-b"


async def test_a_node_that_heartbeats_keeps_its_calls(store: SqliteSessionStore) -> None:
    clock = Clock()
    _node_a(store, clock.now)
    _live_call_of_a(store, clock.now)
    b = Keeper(store, clock)
    await b.keeper.start()
    for _ in range(30):
        clock.now += 1
        _node_a(store, clock.now)
        await b.keeper.beat()
    assert store.get("s1").terminal_state is None  # type: ignore[union-attr]
    assert b.metrics.cluster_nodes.labels("up")._value.get() == 2


async def test_after_an_outage_of_the_store_nobody_is_judged_dead_too_soon(
    store: SqliteSessionStore,
) -> None:
    clock = Clock()
    _node_a(store, clock.now)
    _live_call_of_a(store, clock.now)
    b = Keeper(store, clock)
    await b.keeper.start()
    b.down = True
    with pytest.raises(StoreUnavailable):
        await b.keeper.beat()
    clock.now += 60  # the database was away a minute: every heartbeat is old
    b.down = False
    await b.keeper.beat()  # b writes again, but a has had no chance yet
    assert store.get("s1").terminal_state is None  # type: ignore[union-attr]
    clock.now += 1
    _node_a(store, clock.now)  # a heartbeats again as soon as it can
    clock.now += DEAD_AFTER_S - 1  # b has written for dead_after_s now: entitled, and a is alive
    await b.keeper.beat()
    assert store.get("s1").terminal_state is None  # type: ignore[union-attr]
