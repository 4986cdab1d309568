"""Fuzz the control API of a real ``voicegate serve`` with schemathesis, from docs/openapi.yaml.

Every operation the document lists, the hangup POST included (there are no live calls here, so
it ends none), gets 50 derandomized examples, valid and invalid ones; each response must not be
a 5xx, must have a documented status, content type and schema, and, if an error, be the API's
JSON error body (http_rules.json_error).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from tests.integration.harness import LOOPBACK, Server

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
# This server is one process: the paths the pool supervisor alone serves (x-voicegate-apps:
# /v1/pool, /v1/cluster) are unknown here, so any method on them is a 404, not the 405 that
# schemathesis expects for a method a documented path does not take.
POOL_ONLY = [
    path
    for path, item in yaml.safe_load(DOCUMENT.read_text())["paths"].items()
    if "process" not in item["x-voicegate-apps"]
]
schema = schemathesis.openapi.from_path(DOCUMENT).exclude(path=POOL_ONLY)

# pytest runs with -W error. Schemathesis's pytest plugin and hypothesis warn about things that
# are not failures of the API: hypothesis that a test uses a function-scoped fixture (the server
# is started once per operation and shared by its examples, which is what we want; the health
# check is suppressed below too), and schemathesis when it cannot satisfy a schema's example.
pytestmark = [
    pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning"),
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning"),
]


def errors_are_json(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx and 5xx is ``{"error": "...", ...}`` as application/json."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])[0]
    assert content_type.startswith("application/json"), (
        f"{response.status_code} with {content_type!r}: {response.text[:200]!r}"
    )
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
    return True


@schema.parametrize()
@settings(
    max_examples=50,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_api_keeps_its_document(case: schemathesis.Case, server: Server) -> None:
    # Two refusals of GET /v1/sessions no schema can express, both documented 400s: a cursor is
    # opaque and only one this server issued is accepted, and state=open excludes a
    # terminal_state. Schema-valid data may be refused there, and only there.
    excluded = [positive_data_acceptance] if case.operation.label == "GET /v1/sessions" else []
    case.call_and_validate(
        base_url=f"http://{LOOPBACK}:{server.http_port}",
        additional_checks=[errors_are_json],
        excluded_checks=excluded,
    )
