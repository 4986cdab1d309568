"""deploy/grafana/voicegate.json is a valid dashboard whose every query names metrics a running
pool exposes, and so do the alert rules: neither can rot when a metric is renamed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.integration.harness import ServerFactory, Sipp, wait_for
from tests.operability.peers import (
    DASHBOARD,
    alert_expressions,
    dashboard_expressions,
    exposed_series,
    metric_names,
    start_pool,
)

# What the issue asks the dashboard to show, by a metric each topic needs.
TOPICS = {
    "calls by state": "voicegate_calls_total",
    "set-up rate": "voicegate_calls_offered_total",
    "refusals": "voicegate_calls_refused_total",
    "recoveries": "voicegate_recoveries_total",
    "recovery durations": "voicegate_recovery_duration_seconds_bucket",
    "gate frozen time": "voicegate_gate_frozen_seconds_total",
    "tool calls by outcome": "voicegate_tool_calls_total",
    "stale frames": "voicegate_stale_frames_dropped_total",
    "barge-in latency": "voicegate_barge_in_latency_seconds_bucket",
    "worker health": "voicegate_pool_workers",
    "RTP interval": "voicegate_event_loop_lag_seconds_bucket",
}


def test_the_dashboard_is_a_valid_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${" + variable["name"] + "}"}
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        # Every panel and query reads the chosen data source, never a hard-wired one.
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source and target["expr"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
    ref_ids = [[t["refId"] for t in p["targets"]] for p in panels]
    assert all(len(r) == len(set(r)) for r in ref_ids)
    named = metric_names(dashboard_expressions())
    missing = {topic for topic, metric in TOPICS.items() if metric not in named}
    assert not missing, f"the dashboard shows nothing of {missing}"
    # Rates use Grafana's own interval, so a panel is right at any zoom and scrape interval.
    for expr in dashboard_expressions():
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "24h"), expr


def test_every_metric_the_dashboard_and_the_alerts_name_exists_on_a_running_pool(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    # The product's own gap threshold (1 s): SIPp's silences between steps are media gaps, so
    # this one call also exercises recoveries.
    pool = start_pool(server_factory, VOICEGATE_MEDIA_GAP_THRESHOLD_S="1")
    call = Sipp("uac-speech-dtmf.xml", pool.sip_target, tmp_path / "call")
    assert call.run() == 0, call.errors()
    # Ended one way or another (SIPp may hang up during a recovery: canceled).
    wait_for(
        lambda: sum(
            v for (name, _), v in pool.metrics().items() if name == "voicegate_sessions_ended_total"
        )
        == 1,
        15,
        "the call's session counted as ended",
    )
    exposed = exposed_series(pool)
    for source, expressions in (
        ("deploy/grafana/voicegate.json", dashboard_expressions()),
        ("deploy/prometheus/alerts.yml", alert_expressions()),
    ):
        names = metric_names(expressions)
        assert names, source
        assert names - exposed == set(), f"{source} names metrics the pool does not expose"
