"""A real Prometheus scraping a running pool through about half a minute of SIPp calls: what the
dashboard computes from it agrees with what the calls were and with what the API says."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.harness import ServerFactory, Sipp, wait_for
from tests.operability.peers import RULES, Prometheus, start_pool

if shutil.which("prometheus") is None:  # pragma: no cover - scripts/bootstrap installs it
    raise pytest.UsageError("this test needs Prometheus: apt-get install prometheus")

CALLS = 8
# One call every 2 s, 4 at most at once: about half a minute of calls on two workers, scraped
# every second.
RATE, LIMIT = 0.5, 4
WINDOW = "10m"  # longer than the test: increase() over it spans every sample Prometheus has


def test_prometheus_sees_the_calls_the_pool_took(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    pool = start_pool(server_factory)
    prometheus = Prometheus(
        tmp_path / "prometheus", f"127.0.0.1:{pool.http_port}", rule_files=(RULES,)
    ).start()
    try:
        wait_for(
            lambda: prometheus.scalar('up{job="voicegate"}') == 1,
            30,
            "Prometheus scraping the pool",
            interval=0.5,
        )
        # Prometheus holds the counters' starting 0 before any call, so increase() sees it all.
        assert prometheus.scalar("sum(voicegate_calls_offered_total)") == 0
        callers = Sipp(
            "uac-speech-dtmf.xml",
            pool.sip_target,
            tmp_path / "calls",
            calls=CALLS,
            rate=RATE,
            limit=LIMIT,
        )
        assert callers.run() == 0, callers.errors()
        wait_for(lambda: not pool.live_calls(), 15, "every call ended")
        sessions = pool.sessions()
        assert len(sessions) == CALLS
        by_state = Counter(s["ended"]["terminal_state"] for s in sessions)
        wait_for(
            lambda: prometheus.scalar("sum(voicegate_calls_total)") == CALLS,
            15,
            "Prometheus scraping the last call's end",
            interval=0.5,
        )
        # The dashboard's set-up panel: rate() integrated over the window is the calls made.
        offered = prometheus.scalar(f"sum(increase(voicegate_calls_offered_total[{WINDOW}]))")
        assert offered == pytest.approx(CALLS, abs=0.5)
        # Its terminal-state panels, against the API's own sessions.
        ended = {
            r["metric"]["terminal_state"]: r["value"]
            for r in prometheus.query(
                "sum by (terminal_state) "
                f"(increase(voicegate_sessions_ended_total[{WINDOW}])) > 0"
            )
        }
        assert ended.keys() == by_state.keys(), (ended, by_state)
        for state, count in by_state.items():
            assert ended[state] == pytest.approx(count, abs=0.5), (state, ended, by_state)
        calls = {
            r["metric"]["outcome"]: r["value"]
            for r in prometheus.query("sum by (outcome) (voicegate_calls_total) > 0")
        }
        assert calls == {state: float(n) for state, n in by_state.items()}
        assert prometheus.scalar("sum(voicegate_calls_active)") == 0
        assert prometheus.scalar('sum(voicegate_pool_workers{state="ready"})') == 2
        # Media moved, and the tick-lag quantile the dashboard draws is a number, not NaN.
        frames_in = prometheus.scalar('sum(voicegate_media_frames_total{direction="in"})')
        assert frames_in is not None and frames_in > 0
        lag = prometheus.scalar(
            "histogram_quantile(0.99, sum by (le) "
            f"(increase(voicegate_event_loop_lag_seconds_bucket[{WINDOW}])))"
        )
        assert lag is not None and lag == lag
        # Prometheus loaded the alert rules and evaluates them without error; ordinary calls
        # page nobody.
        groups = prometheus.api("rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        assert rules and all(rule["health"] == "ok" for rule in rules), rules
        assert prometheus.query('ALERTS{severity="critical"}') == []
    finally:
        prometheus.stop()
