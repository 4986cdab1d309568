"""One node of a cluster: heartbeat it in the store's node registry, watch the other nodes, and
take over the sessions of a node that went silent (docs/cluster.md).

A dead node's sessions are finalised exactly as a restarted worker finalises its predecessor's
(voicegate/tools/startup_reconcile.py, then session/reaper.py): each is taken over at the next
lease epoch, every outstanding tool intent is settled by a status query (never sent again), a
caller cut off with a write under way is parked for a callback, and what is left ends ``failed``
at stage ``process`` with what was last known. Sessions that were already away or dropped when
the node died keep their own end (the sweeps of every node expire them). Of several survivors
one claims the dead incarnation first (``claim_node``, a compare-and-set), so the others leave
it alone; each session's lease is the second guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from config import Settings
from config.tools import ToolSettings
from session.reaper import REASON_NODE, parked, reap_owned
from session.store import SessionStore, StoreError
from session.store.nodes import NodeRecord, NodeState, NodeWorker, owner_prefix
from voicegate.observe.pool_metrics import PoolMetrics
from voicegate.tools.client import ToolClient
from voicegate.tools.startup_reconcile import settle_predecessors

T = TypeVar("T")
Job = Callable[[Callable[[SessionStore], T]], Awaitable[T]]
log = logging.getLogger("voicegate.cluster")


@dataclass
class NodeView:
    """What this node last read of the cluster (for /v1/cluster, the status page, the gauge)."""

    nodes: list[NodeRecord] = field(default_factory=list)
    read_at: float = 0.0

    def states(self, dead_after_s: float) -> dict[str, NodeState]:
        return {n.name: n.state_at(self.read_at, dead_after_s) for n in self.nodes}


class NodeKeeper:
    def __init__(
        self,
        settings: Settings,
        *,
        incarnation: str,
        session_owner: str,
        workers: list[NodeWorker],
        write: Job[Any],
        read: Job[Any],
        http: Callable[[], aiohttp.ClientSession],
        metrics: PoolMetrics,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        node = settings.node
        self.name = node.name
        self.incarnation = incarnation
        self.owner = f"{self.name}/{incarnation}"  # the claim's form of this incarnation
        # Sessions it takes are owned by the supervisor's id ("<node>.supervisor/..."), which a
        # node taking over from this one in turn finds by this node's prefix.
        self.session_owner = session_owner
        self.api_url = node.api_url or f"http://{_host(settings.http.address)}:{settings.http.port}"
        self.heartbeat_s = node.heartbeat_s
        self.dead_after_s = node.dead_after_s
        self.workers = tuple(workers)
        self.state = NodeState.UP
        self.view = NodeView()
        self._write = write
        self._read = read
        self._http = http
        self._metrics = metrics
        self._clock = clock
        self._started_at = clock()
        self._tools: Mapping[str, ToolSettings] = {t.name: t for t in settings.tools}
        self._attempts = settings.session.status_attempts
        self._deadline_s = settings.session.reconcile_timeout_s
        self._task: asyncio.Task[None] | None = None
        # Since when this node's own heartbeats have landed without a break (monotonic). Only
        # a node that could write for dead_after_s judges another dead: after an outage of the
        # store every heartbeat is old, and the live nodes must get the time to write theirs
        # before anyone takes their calls.
        self._monotonic = monotonic
        self._writing_since: float | None = None

    def record(self) -> NodeRecord:
        now = self._clock()
        return NodeRecord(
            self.name, self.incarnation, self.api_url, self.workers, self._started_at, now,
            self.state.value,
        )  # fmt: skip

    async def start(self) -> None:
        """Register this node before it takes calls (a store that refuses it stops the start)."""
        record = self.record()
        await self._write(lambda store: store.node_heartbeat(record))
        self._writing_since = self._monotonic()
        log.info("node.registered", extra={"node": self.name, "api": self.api_url})
        self._task = asyncio.create_task(self._run(), name="node-keeper")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.beat()
            except StoreError as exc:
                # The store's own outage handling says the rest (voicegate_store_up); a node
                # that cannot heartbeat is soon dead to the others, and its fenced writes fail.
                log.warning("node.heartbeat_failed", extra={"node": self.name, "why": str(exc)})
            except Exception:
                # Whatever went wrong with one take-over, the heartbeat must go on: a keeper
                # that stopped would make this live node look dead to the others.
                log.exception("node.keeper_failed", extra={"node": self.name})

    async def beat(self) -> None:
        """One heartbeat: refresh our row, read the others', take over the dead."""
        record = self.record()
        try:
            await self._write(lambda store: store.node_heartbeat(record))
        except StoreError:
            self._writing_since = None
            raise
        if self._writing_since is None:
            self._writing_since = self._monotonic()
        nodes: list[NodeRecord] = await self._read(lambda store: store.nodes())
        now = self._clock()
        self.view = NodeView(nodes, now)
        states = self.view.states(self.dead_after_s)
        for state in NodeState:
            count = sum(1 for s in states.values() if s is state)
            self._metrics.cluster_nodes.labels(state.value).set(count)
        if self._monotonic() - self._writing_since < self.dead_after_s:
            return  # not yet entitled to call anyone dead (see __init__)
        for node in nodes:
            if node.name != self.name and states[node.name] is NodeState.DEAD:
                await self._take_over(node, now)

    async def _take_over(self, node: NodeRecord, now: float) -> None:
        prefix = owner_prefix(node.name)
        left = await self._read(lambda store: _unparked(store, prefix))
        if not left:
            return  # nothing of it is open (what is parked keeps its own end)
        dead_before = now - self.dead_after_s
        claimed = await self._write(
            lambda store: store.claim_node(
                node.name, node.incarnation, by=self.owner, at=now, dead_before=dead_before
            )
        )
        if not claimed:
            return  # another survivor holds it, or it came back
        log.warning(
            "node.taking_over",
            extra={"node": node.name, "incarnation": node.incarnation, "sessions": len(left)},
        )
        parked: list[str] = []
        client = ToolClient(self._http())
        settled = await settle_predecessors(
            self._write,
            client,
            self._tools,
            prefix=prefix,
            me=self.session_owner,
            attempts=self._attempts,
            deadline_s=self._deadline_s,
            record_effects=lambda effects: None,
            on_outcome=lambda tool, outcome: None,
            on_parked=parked.append,
            now=self._clock,
        )
        at = self._clock()
        reaped: list[str] = await self._write(
            lambda store: reap_owned(
                store, prefix=prefix, me=self.session_owner, now=at, reason=REASON_NODE
            )
        )
        taken = len(reaped) + len(parked)
        if taken:
            self._metrics.sessions_taken_over.labels(node.name).inc(taken)
        log.warning(
            "node.taken_over",
            extra={
                "node": node.name,
                "incarnation": node.incarnation,
                "settled": settled,
                "parked": len(parked),
                "failed": len(reaped),
            },
        )

    def is_up(self, name: str) -> bool:
        return self.view.states(self.dead_after_s).get(name) in (NodeState.UP, NodeState.DRAINING)

    def node(self, name: str) -> NodeRecord | None:
        return next((n for n in self.view.nodes if n.name == name), None)

    async def drain(self) -> None:
        self.state = NodeState.DRAINING
        with contextlib.suppress(StoreError):
            await self.beat()

    async def stop(self) -> None:
        """Stopped cleanly: ``left``, so nobody takes over what is not there."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        at = self._clock()
        try:
            await self._write(lambda store: store.leave_node(self.name, self.incarnation, at=at))
        except StoreError as exc:
            log.warning("node.leave_failed", extra={"node": self.name, "why": str(exc)})
        else:
            log.info("node.left", extra={"node": self.name})


def _unparked(store: SessionStore, prefix: str) -> list[str]:
    return [s.session_id for s in store.open_sessions(owner_prefix=prefix) if not parked(s)]


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
