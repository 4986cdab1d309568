"""POST /v1/calls/{id}/transfer over the real single-process app (an unstarted Runtime): the only
route that reads a body takes a small JSON object, names the field it refuses, and changes
nothing; the other routes still refuse any body. The Refer-To the SIP thread sends is built by
telephony.transfer, checked here byte for byte."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from config import load_settings
from telephony.transfer import context_headers, refer_to, referred_uri, user_to_user
from tests.unit.control_client import ControlClient
from voicegate.control.http_api import make_app
from voicegate.runtime import Runtime

PATH = "/v1/calls/abc/transfer"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    runtime = Runtime(
        load_settings(
            environ={
                "VOICEGATE_STORAGE_DATA_DIR": str(tmp_path),
                "VOICEGATE_TRANSFER_ALLOWED_TARGETS": "sip:*@cc.example.com",
            }
        )
    )
    yield runtime
    runtime.writer.close()
    runtime.reader.close()


@pytest.fixture
async def client(runtime: Runtime) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with ControlClient(TestServer(make_app(runtime))) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "headers", "field"),
    [
        (b"not json", {"Content-Type": "application/json"}, "body"),
        (b'{"target": "sip:a@cc.example.com"}', {"Content-Type": "text/plain"}, "body"),
        (b'["sip:a@cc.example.com"]', {"Content-Type": "application/json"}, "body"),
        (b"{}", {"Content-Type": "application/json"}, "target"),
        (b'{"target": 5}', {"Content-Type": "application/json"}, "target"),
        (b'{"target": "desk"}', {"Content-Type": "application/json"}, "target"),
        (
            b'{"target": "sip:a@cc.example.com", "x": "1"}',
            {"Content-Type": "application/json"},
            "x",
        ),
    ],
)
async def test_a_bad_body_is_a_400_naming_the_field(
    client: TestClient[Any, Any], body: bytes, headers: dict[str, str], field: str
) -> None:
    response = await client.post(PATH, data=body, headers=headers)
    assert response.status == 400, await response.text()
    assert (await response.json())["field"] == field


async def test_an_unknown_mode_is_refused(client: TestClient[Any, Any]) -> None:
    response = await client.post(PATH, json={"target": "sip:a@cc.example.com", "mode": "warm"})
    assert response.status == 400
    body = await response.json()
    assert body["field"] == "mode" and body["allowed"] == ["blind", "bridge", "attended"]


async def test_an_unknown_completion_is_refused(client: TestClient[Any, Any]) -> None:
    response = await client.post(
        PATH, json={"target": "sip:a@cc.example.com", "mode": "attended", "complete": "later"}
    )
    assert response.status == 400
    body = await response.json()
    assert body["field"] == "complete" and body["allowed"] == ["after_brief", "api", "person"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "text"),
        ({"text": "Hello", "prompt": "menu"}, "text"),
        ({"text": 1}, "text"),
        ({"voice": "en"}, "voice"),
    ],
)
async def test_a_say_with_a_bad_body_is_refused_naming_the_field(
    client: TestClient[Any, Any], body: dict[str, object], field: str
) -> None:
    response = await client.post(f"{PATH}/say", json=body)
    assert response.status == 400
    assert (await response.json())["field"] == field


async def test_a_say_to_an_unknown_call_is_404_and_a_body_that_is_no_json_400(
    client: TestClient[Any, Any],
) -> None:
    response = await client.post(f"{PATH}/say", json={"text": "Hello"})
    assert response.status == 404
    response = await client.post(
        f"{PATH}/say", data=b"text=Hello", headers={"Content-Type": "text/plain"}
    )
    assert (response.status, (await response.json())["field"]) == (400, "body")


async def test_the_consultation_routes_of_an_unknown_call_are_404(
    client: TestClient[Any, Any],
) -> None:
    for action in ("complete", "cancel"):
        response = await client.post(f"{PATH}/{action}")
        assert response.status == 404, action
        assert (await response.json())["call_id"] == "abc"


async def test_a_good_body_for_an_unknown_call_is_404(client: TestClient[Any, Any]) -> None:
    response = await client.post(PATH, json={"target": "sip:a@cc.example.com", "mode": "blind"})
    assert response.status == 404
    assert (await response.json())["call_id"] == "abc"


async def test_other_routes_still_refuse_a_body(client: TestClient[Any, Any]) -> None:
    response = await client.post("/v1/calls/abc/hangup", json={"target": "x"})
    assert response.status == 400
    assert (await response.json())["field"] == "body"


async def test_a_body_above_the_limit_is_413(client: TestClient[Any, Any]) -> None:
    big = {"target": "sip:" + "a" * 5000 + "@cc.example.com"}
    response = await client.post(PATH, json=big)
    assert response.status == 413


async def test_an_unknown_session_has_no_handoff(client: TestClient[Any, Any]) -> None:
    response = await client.get("/v1/sessions/nope/handoff")
    assert response.status == 404
    assert (await response.json())["session_id"] == "nope"


# --- the Refer-To on the wire --------------------------------------------------------------------


def test_the_refer_to_carries_the_uui_and_session_header_escaped() -> None:
    session = "0123abcd"
    assert user_to_user(session) == "3031323361626364;encoding=hex"
    value = refer_to("sip:desk@cc.example.com", context_headers(session))
    assert value == (
        "<sip:desk@cc.example.com?User-to-User=3031323361626364%3Bencoding%3Dhex"
        "&X-Voicegate-Session=0123abcd>"
    )


def test_a_target_with_headers_of_its_own_is_refused() -> None:
    with pytest.raises(ValueError, match="no headers"):
        refer_to("sip:desk@cc.example.com?Replaces=x", ())


@pytest.mark.parametrize(
    ("value", "uri"),
    [
        ("<sip:desk@cc.example.com>", "sip:desk@cc.example.com"),
        (
            '"Desk" <sip:desk@cc.example.com;transport=tcp?X-A=1>',
            "sip:desk@cc.example.com;transport=tcp",
        ),
        ("sip:+1900555@premium.example;user=phone", "sip:+1900555@premium.example"),
    ],
)
def test_an_inbound_refer_to_names_its_bare_uri(value: str, uri: str) -> None:
    assert referred_uri(value) == uri
