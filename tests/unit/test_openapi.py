"""docs/openapi.yaml is valid OpenAPI and lists exactly the routes both control-plane apps serve."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from openapi_spec_validator import validate

from config import load_settings
from session.event_reference import EFFECTS
from session.events import EVENT_TYPES
from session.state import AgentLink, Gate, Media, Signaling
from voicegate.control.http_api import make_app
from voicegate.control.http_rules import QUERY_PARAMETERS
from voicegate.control.pool_api import make_pool_app
from voicegate.pool.supervisor import Supervisor
from voicegate.runtime import Runtime

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _document() -> dict[str, Any]:
    loaded = yaml.safe_load(DOCUMENT.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _documented(app_name: str) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in _document()["paths"].items()
        if app_name in item["x-voicegate-apps"]
        for method in item
        if method in METHODS
    }


def _served(app: web.Application) -> set[tuple[str, str]]:
    return {(route.method, route.resource.canonical) for route in app.router.routes()}


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """A real Runtime, not started: its store and writer exist, no SIP thread."""
    runtime = Runtime(load_settings(environ={"VOICEGATE_STORAGE_DATA_DIR": str(tmp_path)}))
    yield runtime
    runtime.writer.close()
    runtime.reader.close()


def test_the_document_is_valid_openapi() -> None:
    document = _document()
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_the_process_app_serves_what_the_document_says(runtime: Runtime) -> None:
    served = _served(make_app(runtime))
    assert served == _documented("process")
    assert ("GET", "/v1/sessions/{session_id}") in served  # the walk sees templated routes


def test_the_pool_app_serves_what_the_document_says(tmp_path: Path) -> None:
    settings = load_settings(environ={"VOICEGATE_STORAGE_DATA_DIR": str(tmp_path)})
    served = _served(make_pool_app(Supervisor(settings, None)))
    assert served == _documented("pool")
    assert ("GET", "/v1/pool") in served


def test_the_documented_query_parameters_are_the_ones_the_app_takes() -> None:
    documented = {
        path: frozenset(p["name"] for p in operation.get("parameters", []) if p["in"] == "query")
        for path, item in _document()["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    }
    taken = {path: QUERY_PARAMETERS.get(path, frozenset()) for path in documented}
    assert documented == taken
    assert set(QUERY_PARAMETERS) <= set(documented)


def test_the_event_types_and_effect_kinds_are_the_code_s() -> None:
    # GET /v1/sessions/{id}'s log: every type session/events.py may write, every effect kind.
    schemas = _document()["components"]["schemas"]
    assert schemas["EventType"]["enum"] == sorted(EVENT_TYPES), (
        "docs/openapi.yaml's EventType must list session/events.py's EVENT_TYPES, sorted"
    )
    assert schemas["EffectKind"]["enum"] == sorted(e.kind for e in EFFECTS), (
        "docs/openapi.yaml's EffectKind must list session/effects.py's kinds, sorted"
    )
    detail = schemas["SessionDetail"]["allOf"][1]["properties"]
    assert detail["events"]["items"] == {"$ref": "#/components/schemas/Event"}


def test_the_session_dimensions_are_the_state_s() -> None:
    detail = _document()["components"]["schemas"]["SessionDetail"]["allOf"][1]["properties"]
    dimensions = detail["dimensions"]["properties"]
    for name, values in {
        "signaling": Signaling,
        "media": Media,
        "agent_link": AgentLink,
        "gate": Gate,
    }.items():
        assert dimensions[name]["enum"] == [v.value for v in values], name
    assert detail["gate"]["properties"]["state"]["enum"] == [g.value for g in Gate]
