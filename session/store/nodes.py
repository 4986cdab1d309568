"""The node registry: which nodes of a cluster are alive, and who took over a dead one's sessions.

A node is a pool (a supervisor and its workers) that shares the store with other nodes
(docs/cluster.md). Its supervisor heartbeats its row every ``node.heartbeat_s``; a row whose
heartbeat is older than ``node.dead_after_s`` is a dead node. One survivor claims a dead node's
incarnation by compare-and-set (:data:`CLAIM`) before it settles and finalises that node's open
sessions, so two survivors never both do; each session's own lease (its fencing epoch) is the
second guard. A claim held by a node that died in turn may be claimed again.

Times are epoch seconds of the writers' clocks, as every other row's: the nodes of a cluster keep
their clocks in step (NTP), and ``dead_after_s`` must be well above their skew.

SQL here is shared by both stores; only the placeholder differs (``?`` or ``%s``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final


class NodeState(enum.StrEnum):
    UP = "up"  # serving, heartbeating
    DRAINING = "draining"  # SIGTERM: finishing its calls, taking no new ones
    LEFT = "left"  # stopped cleanly: nothing of it is left to take over
    DEAD = "dead"  # derived, never stored: silent past dead_after_s


STORED_STATES: Final = (NodeState.UP, NodeState.DRAINING, NodeState.LEFT)
NODE_STATES: Final = tuple(s.value for s in STORED_STATES)


@dataclass(frozen=True, slots=True)
class NodeWorker:
    name: str  # the worker's name, which its owner ids start with (<node>.<i>)
    sip: str  # the SIP URI Kamailio's dispatcher lists


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    incarnation: str  # a new one at each start of the node's supervisor
    api_url: str  # where the node's control API answers, for people and other nodes
    workers: tuple[NodeWorker, ...]
    started_at: float
    heartbeat_at: float
    state: str  # one of NODE_STATES
    taken_over_by: str | None = None  # "<node>/<incarnation>" of the survivor that claimed it
    taken_over_at: float | None = None

    @property
    def owner(self) -> str:
        """The claim's form of this node's incarnation."""
        return f"{self.name}/{self.incarnation}"

    def state_at(self, now: float, dead_after_s: float) -> NodeState:
        """Its state as of ``now``: a node that stopped heartbeating without leaving is dead."""
        if self.state == NodeState.LEFT:
            return NodeState.LEFT
        if now - self.heartbeat_at > dead_after_s:
            return NodeState.DEAD
        return NodeState(self.state)

    def workers_json(self) -> list[dict[str, str]]:
        return [{"name": w.name, "sip": w.sip} for w in self.workers]

    @staticmethod
    def workers_from(value: object) -> tuple[NodeWorker, ...]:
        if not isinstance(value, list):
            return ()
        return tuple(
            NodeWorker(str(w.get("name", "")), str(w.get("sip", "")))
            for w in value
            if isinstance(w, dict)
        )


def owner_prefix(node: str) -> str:
    """What every owner id of ``node``'s processes starts with: its workers are ``<node>.<i>``
    and its supervisor ``<node>.supervisor`` (config/workers.py)."""
    return f"{node}."


COLUMNS: Final = (
    "name",
    "incarnation",
    "api_url",
    "workers",
    "started_at",
    "heartbeat_at",
    "state",
    "taken_over_by",
    "taken_over_at",
)


def heartbeat_sql(mark: str) -> str:
    """Upsert a node's row. A new incarnation replaces the row whole (the node restarted: its
    last life's claim is history); the same one refreshes it and clears a claim (a node that was
    only stalled is alive again; what was taken from it stays taken, by the sessions' leases)."""
    marks = ", ".join([mark] * 7)
    return (
        f"INSERT INTO nodes ({', '.join(COLUMNS[:7])}) VALUES ({marks})"
        " ON CONFLICT (name) DO UPDATE SET incarnation = excluded.incarnation,"
        " api_url = excluded.api_url, workers = excluded.workers,"
        " started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,"
        " state = excluded.state, taken_over_by = NULL, taken_over_at = NULL"
    )


def heartbeat_params(record: NodeRecord, workers: object) -> Sequence[object]:
    return (
        record.name,
        record.incarnation,
        record.api_url,
        workers,
        record.started_at,
        record.heartbeat_at,
        record.state,
    )


def select_sql() -> str:
    return f"SELECT {', '.join(COLUMNS)} FROM nodes ORDER BY name"


def claim_sql(mark: str) -> str:
    """Claim ``name`` at ``incarnation`` for ``by`` if it is still that incarnation, silent since
    before ``dead_before``, not left, and unclaimed, claimed by ``by`` already (a retried claim),
    or claimed by a node that is itself silent since then."""
    return (
        f"UPDATE nodes SET taken_over_by = {mark}, taken_over_at = {mark}"
        f" WHERE name = {mark} AND incarnation = {mark} AND heartbeat_at < {mark}"
        f" AND state <> '{NodeState.LEFT.value}'"
        f" AND (taken_over_by IS NULL OR taken_over_by = {mark} OR NOT EXISTS ("
        "SELECT 1 FROM nodes AS t WHERE t.name || '/' || t.incarnation = nodes.taken_over_by"
        f" AND t.heartbeat_at >= {mark} AND t.state <> '{NodeState.LEFT.value}'))"
    )


def claim_params(
    name: str, incarnation: str, *, by: str, at: float, dead_before: float
) -> Sequence[object]:
    return (by, at, name, incarnation, dead_before, by, dead_before)


def leave_sql(mark: str) -> str:
    return (
        f"UPDATE nodes SET state = '{NodeState.LEFT.value}', heartbeat_at = {mark}"
        f" WHERE name = {mark} AND incarnation = {mark}"
    )
