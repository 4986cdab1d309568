"""What the operability tests share: a running pool, the metric names a PromQL text uses, and a
real Prometheus server scraping a pool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import LOOPBACK, Server, ServerFactory, free_port, wait_for
from tests.integration.test_pool import pool_env, ready_workers

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "voicegate.json"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
WORKERS = 2

# Our metric names in a PromQL expression; Prometheus's own series (up, ALERTS) are not ours.
_METRIC = re.compile(r"\bvoicegate_[a-z0-9_]+\b")


def start_pool(server_factory: ServerFactory, **extra: str) -> Server:
    server = server_factory("pool", **pool_env(WORKERS, **extra))
    wait_for(lambda: ready_workers(server) == WORKERS, 30, "every worker ready")
    return server


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def alert_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def metric_names(expressions: list[str]) -> set[str]:
    return {name for expr in expressions for name in _METRIC.findall(expr)}


def exposed_series(server: Server) -> set[str]:
    """Names of the samples a running server's /metrics holds (``_bucket`` etc. included)."""
    status, body = server.http("/metrics")
    assert status == 200
    return {
        sample.name
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


@dataclass
class Prometheus:
    """The Debian ``prometheus`` binary on a free loopback port, scraping one target every 1 s."""

    work_dir: Path
    target: str
    rule_files: tuple[Path, ...] = ()
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def start(self) -> Prometheus:
        binary = shutil.which("prometheus")
        assert binary is not None, "apt-get install prometheus"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(udp_and_tcp=False)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {"job_name": "voicegate", "static_configs": [{"targets": [self.target]}]}
            ],
        }
        config_path = self.work_dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.log_path = self.work_dir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.work_dir / 'data'}",
                    f"--web.listen-address={LOOPBACK}:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
            )
        wait_for(self._ready, 30, f"Prometheus ready (log: {self.log_path})", interval=0.2)
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        url = f"http://{LOOPBACK}:{self.port}/api/v1/{path}?{query}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: each element's ``metric`` labels and float ``value``."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        assert len(result) <= 1, result
        return result[0]["value"] if result else None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
