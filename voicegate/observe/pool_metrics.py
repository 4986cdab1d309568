"""The supervisor's own metrics: the pool's workers and its front door.

The workers' metrics come from prometheus-client's multiprocess files (see ``pool_api``); these
live in the supervisor, which alone knows worker states and restarts. Kamailio's counters (calls
failed over to another worker, INVITEs refused because no worker was in the set) are read over
its ctl socket at scrape time and carried across a Kamailio restart, so they never go backwards.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from session.store.nodes import NodeState
from voicegate.observe.metrics import API_REFUSAL_REASONS
from voicegate.pool.kamailio_config import (
    STAT_BAD_OFFER,
    STAT_FAILOVERS,
    STAT_MALFORMED,
    STAT_NO_WORKER,
    STAT_SOURCE_RATE,
)


class PoolMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r, namespace="voicegate_supervisor")
        self.workers = Gauge(
            "voicegate_pool_workers",
            "Workers by state (starting, ready, unhealthy, restarting, draining, stopped)",
            ["state"],
            registry=r,
        )
        self.restarts = Counter(
            "voicegate_pool_worker_restarts_total",
            "Worker restarts by worker and why the last one ended (exited, unresponsive, "
            "start_timeout)",
            ["worker", "reason"],
            registry=r,
        )
        self.health_failures = Counter(
            "voicegate_pool_health_check_failures_total",
            "Failed worker health checks",
            ["worker"],
            registry=r,
        )
        self.sessions_reaped = Counter(
            "voicegate_pool_sessions_reaped_total",
            "Stale sessions the supervisor finalised when they were read (as failed, stage "
            "process); workers count their own in voicegate_sessions_reaped_total",
            registry=r,
        )
        self.api_refused = Counter(
            "voicegate_pool_api_requests_refused_total",
            "Requests the supervisor's API refused (the reasons of "
            "voicegate_api_requests_refused_total, which counts the workers' own)",
            ["reason"],
            registry=r,
        )
        for reason in API_REFUSAL_REASONS:
            self.api_refused.labels(reason)
        self.resume_issued = Counter(
            "voicegate_pool_resume_handles_issued_total",
            "Resume handles the supervisor's API issued (POST /v1/sessions/{id}/resume)",
            registry=r,
        )
        self.cluster_nodes = Gauge(
            "voicegate_cluster_nodes",
            "Nodes of the cluster by state (up, draining, dead, left), as this node last read "
            "the node registry (docs/cluster.md); 0 outside a cluster",
            ["state"],
            registry=r,
        )
        for state in NodeState:
            self.cluster_nodes.labels(state.value)
        self.sessions_taken_over = Counter(
            "voicegate_sessions_taken_over_total",
            "Sessions of a dead node this node took over (settled, then parked for a callback "
            "or finalised), by the dead node",
            ["node"],
            registry=r,
        )
        self.front_door_up = Gauge(
            "voicegate_front_door_up", "1 while Kamailio, the pool's front door, runs", registry=r
        )
        self.front_door_restarts = Counter(
            "voicegate_front_door_restarts_total",
            "Times Kamailio died and was started again",
            registry=r,
        )
        # Last values read from Kamailio, and the totals of its earlier lives.
        self.front_door_counters: dict[str, int] = {}
        self._carried: dict[str, int] = {}
        r.register(_FrontDoorCollector(self))

    def fold_front_door_counters(self) -> None:
        """Kamailio restarted (its counters start again from 0): keep what it had counted."""
        for name, value in self.front_door_counters.items():
            self._carried[name] = self._carried.get(name, 0) + value
        self.front_door_counters = {}

    def front_door_total(self, name: str) -> int:
        return self._carried.get(name, 0) + self.front_door_counters.get(name, 0)


class _FrontDoorCollector(Collector):
    def __init__(self, metrics: PoolMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        failovers = CounterMetricFamily(
            "voicegate_dispatcher_failovers",
            "INVITEs that Kamailio sent on to another worker after a 486, 503 or timeout",
        )
        failovers.add_metric([], self._metrics.front_door_total(STAT_FAILOVERS))
        yield failovers
        refused = CounterMetricFamily(
            "voicegate_front_door_refused",
            "INVITEs the front door answered 503 itself: no worker in the dispatcher set",
        )
        refused.add_metric([], self._metrics.front_door_total(STAT_NO_WORKER))
        yield refused
        bad_offers = CounterMetricFamily(
            "voicegate_front_door_bad_offers",
            "INVITEs the front door answered 488 itself: offers the workers' PJSIP would abort on",
        )
        bad_offers.add_metric([], self._metrics.front_door_total(STAT_BAD_OFFER))
        yield bad_offers
        dropped = CounterMetricFamily(
            "voicegate_front_door_dropped",
            "Requests the front door refused itself, by reason: source_rate (one source above "
            "pool.source_max_rate, 503), malformed (failed Kamailio's sanity checks)",
            labels=["reason"],
        )
        dropped.add_metric(["source_rate"], self._metrics.front_door_total(STAT_SOURCE_RATE))
        dropped.add_metric(["malformed"], self._metrics.front_door_total(STAT_MALFORMED))
        yield dropped
