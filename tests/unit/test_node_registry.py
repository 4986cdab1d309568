"""The node registry's contract (session/store/nodes.py), on both stores: heartbeats, death by
silence, one claimant per dead incarnation, a claim held by a dead claimant taken again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from session.store import SessionStore
from session.store.nodes import NodeRecord, NodeState, NodeWorker, owner_prefix
from session.store.postgres import PostgresSessionStore
from session.store.sqlite import SqliteSessionStore

DEAD_AFTER_S = 10.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    opened: SessionStore
    if request.param == "sqlite":
        opened = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    else:
        opened = PostgresSessionStore(request.getfixturevalue("pg_url"))
    yield opened
    opened.close()


def node(name: str, incarnation: str, at: float, state: str = "up") -> NodeRecord:
    workers = (NodeWorker(f"{name}.0", "sip:10.0.0.2:5100"), NodeWorker(f"{name}.1", "sip:x:5101"))
    return NodeRecord(name, incarnation, f"http://{name}:8080", workers, at, at, state)


def by_name(store: SessionStore) -> dict[str, NodeRecord]:
    return {n.name: n for n in store.nodes()}


def test_a_heartbeat_keeps_the_row_and_a_new_incarnation_replaces_it(store: SessionStore) -> None:
    store.node_heartbeat(node("a", "i1", 100.0))
    store.node_heartbeat(node("b", "j1", 100.0))
    store.node_heartbeat(NodeRecord("a", "i1", "http://a:8080", (), 100.0, 103.0, "draining"))
    a = by_name(store)["a"]
    assert (a.incarnation, a.heartbeat_at, a.state, a.workers) == ("i1", 103.0, "draining", ())
    store.node_heartbeat(node("a", "i2", 200.0))
    a = by_name(store)["a"]
    assert (a.incarnation, a.started_at, a.state) == ("i2", 200.0, "up")
    assert a.workers[0] == NodeWorker("a.0", "sip:10.0.0.2:5100")
    assert [n.name for n in store.nodes()] == ["a", "b"]


def test_a_node_is_dead_once_silent_past_dead_after_and_left_once_it_says_so(
    store: SessionStore,
) -> None:
    store.node_heartbeat(node("a", "i1", 100.0))
    a = by_name(store)["a"]
    assert a.state_at(110.0, DEAD_AFTER_S) is NodeState.UP
    assert a.state_at(110.5, DEAD_AFTER_S) is NodeState.DEAD
    store.leave_node("a", "other", at=111.0)  # another incarnation's leave changes nothing
    assert by_name(store)["a"].state_at(111.0, DEAD_AFTER_S) is NodeState.DEAD
    store.leave_node("a", "i1", at=111.0)
    assert by_name(store)["a"].state_at(500.0, DEAD_AFTER_S) is NodeState.LEFT


def test_one_survivor_claims_a_dead_node_and_a_retried_claim_holds(store: SessionStore) -> None:
    store.node_heartbeat(node("a", "i1", 100.0))
    store.node_heartbeat(node("b", "j1", 115.0))
    store.node_heartbeat(node("c", "k1", 115.0))
    dead_before = 115.0 - DEAD_AFTER_S
    assert store.claim_node("a", "i1", by="b/j1", at=115.0, dead_before=dead_before)
    assert not store.claim_node("a", "i1", by="c/k1", at=115.0, dead_before=dead_before)
    assert store.claim_node("a", "i1", by="b/j1", at=115.5, dead_before=dead_before)
    a = by_name(store)["a"]
    assert (a.taken_over_by, a.taken_over_at) == ("b/j1", 115.5)


def test_a_live_left_or_restarted_node_is_not_claimed(store: SessionStore) -> None:
    store.node_heartbeat(node("a", "i1", 100.0))
    store.node_heartbeat(node("b", "j1", 100.0))
    assert not store.claim_node("a", "i1", by="b/j1", at=105.0, dead_before=95.0)  # alive
    store.node_heartbeat(node("a", "i2", 100.0))
    assert not store.claim_node("a", "i1", by="b/j1", at=200.0, dead_before=190.0)  # restarted
    store.leave_node("a", "i2", at=100.0)
    assert not store.claim_node("a", "i2", by="b/j1", at=200.0, dead_before=190.0)  # left


def test_a_claim_whose_claimant_died_too_is_taken_by_the_next_survivor(
    store: SessionStore,
) -> None:
    store.node_heartbeat(node("a", "i1", 100.0))
    store.node_heartbeat(node("b", "j1", 115.0))
    assert store.claim_node("a", "i1", by="b/j1", at=115.0, dead_before=105.0)
    store.node_heartbeat(node("c", "k1", 140.0))
    # b still beats at 130 - 10: its claim holds; silent since 115, and c may take it.
    assert not store.claim_node("a", "i1", by="c/k1", at=124.0, dead_before=114.0)
    assert store.claim_node("a", "i1", by="c/k1", at=140.0, dead_before=130.0)
    assert by_name(store)["a"].taken_over_by == "c/k1"


def test_a_new_incarnations_heartbeat_clears_the_claim(store: SessionStore) -> None:
    store.node_heartbeat(node("a", "i1", 100.0))
    store.node_heartbeat(node("b", "j1", 115.0))
    assert store.claim_node("a", "i1", by="b/j1", at=115.0, dead_before=105.0)
    store.node_heartbeat(node("a", "i2", 120.0))
    assert by_name(store)["a"].taken_over_by is None


def test_a_bad_state_is_refused_and_writes_nothing(store: SessionStore) -> None:
    with pytest.raises(ValueError, match="node state 'dead'"):
        store.node_heartbeat(node("a", "i1", 100.0, state="dead"))
    assert store.nodes() == []


def test_owner_ids_of_a_node_share_its_prefix_and_no_other_nodes() -> None:
    assert "a.0/x".startswith(owner_prefix("a")) and "a.supervisor/y".startswith(owner_prefix("a"))
    assert not "ab.0/x".startswith(owner_prefix("a"))
