"""voicegate/control/auth.py: which peer and key may reach which route (docs/api.md
"Authentication"). The peer address is what the test sets; the integration tests
(tests/integration/test_api_keys.py) run the same rules on real servers over loopback."""

from __future__ import annotations

import hashlib
import json
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry, Counter

from config.settings import AgentSettings, OutboundSettings, TransferSettings
from config.tenants import Tenants, TenantSettings
from voicegate.control import auth
from voicegate.control.auth import ACCESS, MISSING_KEY, Access, authenticate, foreign, scope

KEY = "tenant-key-3f9a1c07b2e54d68"
SCRAPE = "scrape-key-0d7e6b5a4c3f2e1d"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def tenant(name: str, keys: tuple[str, ...]) -> TenantSettings:
    return TenantSettings(
        name, (), (), keys, AgentSettings(), TransferSettings(), OutboundSettings()
    )


def access(keys: tuple[str, ...] = (sha(KEY),), metrics: tuple[str, ...] = ()) -> Access:
    refused = Counter("refused", "", ["reason"], registry=CollectorRegistry())
    return Access(Tenants([tenant("acme", keys), tenant("beta", ())]), metrics, refused)


async def ask(
    a: Access, path: str, *, peer: str = "127.0.0.1", key: str | None = None
) -> tuple[int, Any, str | None]:
    """The status, JSON body (or None) and the tenant the handler saw."""
    app = web.Application()
    app[ACCESS] = a
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    request = make_mocked_request("GET", path, headers=headers, app=app, transport=transport)
    seen: list[str | None] = []

    async def handler(req: web.Request) -> web.StreamResponse:
        seen.append(scope(req))
        return web.json_response({"ok": True})

    response = await authenticate(request, handler)
    assert isinstance(response, web.Response)
    body = json.loads(response.text) if response.text else None
    return response.status, body, seen[0] if seen else None


async def test_v1_needs_a_key_once_any_tenant_has_one() -> None:
    a = access()
    assert (await ask(a, "/v1/sessions"))[:2] == (
        401,
        {"error": MISSING_KEY, "reason": "missing_key"},
    )
    status, body, _ = await ask(a, "/v1/sessions", key="nope")
    assert (status, body["reason"]) == (401, "wrong_key")
    assert await ask(a, "/v1/sessions", key=KEY) == (200, {"ok": True}, "acme")
    assert a.refused.labels("missing_key")._value.get() == 1
    assert a.refused.labels("wrong_key")._value.get() == 1


async def test_without_any_key_the_api_is_open_for_every_tenant() -> None:
    assert await ask(access(keys=()), "/v1/sessions") == (200, {"ok": True}, None)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/status"])
async def test_health_and_the_status_page_are_open_from_anywhere(path: str) -> None:
    assert (await ask(access(), path, peer="198.51.100.7"))[0] == 200


async def test_metrics_are_open_on_loopback_and_off_elsewhere_without_a_metrics_key() -> None:
    assert (await ask(access(), "/metrics", peer="::1"))[0] == 200
    status, body, _ = await ask(access(), "/metrics", peer="198.51.100.7", key=KEY)
    assert (status, body["reason"]) == (403, "metrics_off")  # a tenant's key is not a scrape key


async def test_metrics_from_elsewhere_need_a_metrics_key_when_there_are_some() -> None:
    a = access(metrics=(sha(SCRAPE),))
    assert (await ask(a, "/metrics", peer="198.51.100.7"))[1]["reason"] == "missing_key"
    assert (await ask(a, "/metrics", peer="198.51.100.7", key=KEY))[1]["reason"] == "wrong_key"
    assert (await ask(a, "/metrics", peer="198.51.100.7", key=SCRAPE))[0] == 200


async def test_a_tenant_asking_about_anothers_session_is_403_and_counted() -> None:
    a = access()
    app = web.Application()
    app[ACCESS] = a
    request = make_mocked_request("GET", "/v1/sessions/s1", app=app)
    assert foreign(request, "beta") is None  # an open request (no tenant) sees everything
    request[auth._TENANT] = "acme"  # as authenticate() sets it for acme's key
    assert foreign(request, "acme") is None
    refusal = foreign(request, "beta", session_id="s1")
    assert refusal is not None and refusal.status == 403
    assert json.loads(refusal.text) == {
        "error": "this belongs to another tenant: use that tenant's key",
        "reason": "other_tenant",
        "session_id": "s1",
    }
    assert a.refused.labels("other_tenant")._value.get() == 1
