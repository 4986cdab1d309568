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
