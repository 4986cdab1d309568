"""tests/contract.py can fail: an answer docs/openapi.yaml does not allow is named, with its field.

Each drift is made in a scratch copy of the document, so that a real-looking answer of the server
is what is off; the harness's hook (``Server.request``) raises the same ContractError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.contract import DOCUMENT, Contract, ContractError

CALL = {
    "call_id": "c0ffee",
    "live": {
        "call_id": "c0ffee",
        "state": "answered",
        "caller": "sip:***0100@127.0.0.1",
        "started_at": 1700000000.0,
        "answered_at": 1700000000.5,
        "duration_s": 3.2,
        "consult": None,
    },
    "session": "/v1/sessions/c0ffee",
}
READY = {
    "ready": True,
    "sip_transports_up": True,
    "draining": False,
    "store_unavailable_s": None,
    "owner": "worker-0/1",
}


def _document() -> dict[str, Any]:
    loaded = yaml.safe_load(DOCUMENT.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _scratch(tmp_path: Path, document: dict[str, Any]) -> Contract:
    path = tmp_path / "openapi.yaml"
    path.write_text(yaml.safe_dump(document))
    return Contract.load(path)


def _json(body: object) -> bytes:
    return json.dumps(body).encode()


def test_the_real_document_allows_real_answers() -> None:
    contract = Contract.load(DOCUMENT)
    contract.check("GET", "/v1/calls/c0ffee", 200, "application/json; charset=utf-8", _json(CALL))
    contract.check("GET", "/readyz", 503, "application/json", _json({**READY, "ready": False}))
    contract.check("GET", "/metrics", 200, "text/plain; version=0.0.4", b"up 1\n")
    contract.check("GET", "/v1/nowhere", 404, "application/json", _json({"error": "not found"}))


def test_a_value_outside_the_documented_enum_names_the_field(tmp_path: Path) -> None:
    document = _document()
    live = document["components"]["schemas"]["LiveCall"]["properties"]["state"]
    live["enum"] = [s for s in live["enum"] if s != "answered"]
    contract = _scratch(tmp_path, document)
    with pytest.raises(ContractError) as failed:
        contract.check("GET", "/v1/calls/c0ffee", 200, "application/json", _json(CALL))
    message = str(failed.value)
    assert message.startswith("GET /v1/calls/c0ffee -> 200:"), message
    assert "$.live.state: 'answered' is not one of" in message, message
    assert "#/components/schemas/CallView/properties/live/oneOf/0/properties/state/enum" in message


def test_a_missing_required_field_is_named(tmp_path: Path) -> None:
    document = _document()
    one_process = document["components"]["schemas"]["Readiness"]["oneOf"][0]
    one_process["required"].append("uptime_s")
    contract = _scratch(tmp_path, document)
    with pytest.raises(ContractError, match=r"(?s)GET /readyz -> 200:.*'uptime_s' is a required"):
        contract.check("GET", "/readyz", 200, "application/json", _json(READY))


def test_an_undocumented_status_content_type_or_path_is_refused(tmp_path: Path) -> None:
    document = _document()
    # Every operation has a default (any error); without it, only the listed statuses pass.
    del document["paths"]["/v1/sessions/{session_id}/resume"]["post"]["responses"]["default"]
    contract = _scratch(tmp_path, document)
    assert contract.problems("POST", "/v1/sessions/x/resume", 418, "application/json", b"{}") == [
        "status 418 is not documented (only 201, 404, 409)"
    ]
    assert contract.problems("GET", "/status", 200, "application/json", b"{}") == [
        "content type 'application/json' is not one of ['text/html']"
    ]
    assert contract.problems("GET", "/v1/nowhere", 200, "application/json", b"{}") == [
        "the document has no path, yet the answer is 200, not 404 or 405"
    ]


def test_an_error_body_must_be_the_error_schema() -> None:
    contract = Contract.load(DOCUMENT)
    problems = contract.problems(
        "GET", "/v1/calls/x/hangup", 404, "application/json", _json({"message": "no such call"})
    )
    assert problems == [
        "$: 'error' is a required property (schema: #/components/schemas/Error/required)"
    ]
