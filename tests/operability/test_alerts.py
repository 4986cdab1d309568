"""deploy/prometheus/alerts.yml: promtool accepts it, its unit tests pass, and every alert has a
case that fires and a case that does not, labels and annotations an on-call person can act on,
and a runbook that exists."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
RUNBOOKS = ROOT / "docs" / "runbooks"
SEVERITIES = {"critical", "info"}

PROMTOOL = shutil.which("promtool")
if PROMTOOL is None:  # pragma: no cover - scripts/bootstrap installs it
    raise pytest.UsageError("the alert tests need promtool: apt-get install prometheus")


def alerts() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_accepts_the_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), "alerts with no firing case"
    assert names - quiet == set(), "alerts with no case where they stay quiet"
    assert (firing | quiet) - names == set(), "cases of alerts that do not exist"


@pytest.mark.parametrize("rule", alerts(), ids=lambda rule: rule["alert"])
def test_every_alert_says_how_bad_it_is_and_where_its_runbook_is(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert annotations["summary"] and annotations["description"]
    assert annotations["runbook_url"] == f"docs/runbooks/{rule['alert']}.md"
    runbook = (ROOT / annotations["runbook_url"]).read_text()
    # What an on-call person needs, in this order: what it means, how to see it, what to do.
    for heading in ("## What it means", "## Confirm it", "## What to do"):
        assert heading in runbook, f"{annotations['runbook_url']} lacks {heading!r}"


def test_no_runbook_is_left_without_its_alert() -> None:
    names = {rule["alert"] for rule in alerts()}
    assert {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"} == names
