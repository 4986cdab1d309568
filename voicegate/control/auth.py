"""Who may ask the control plane what: API keys, tenants, and /metrics (docs/api.md).

- Every ``/v1`` route needs ``Authorization: Bearer <key>`` (RFC 6750 section 2.1) once any tenant
  has a key: no key or a malformed header is a 401 ``missing_key``, a key no tenant holds a 401
  ``wrong_key``, both with ``WWW-Authenticate: Bearer`` (RFC 6750 section 3). A request that passes
  acts for the key's tenant only: another tenant's call or session is a 403 ``other_tenant``.
- With no key configured anywhere the API is open; config refuses that on any address but
  loopback (config/tenant_loader.py: ``open_api_problems``), so an open API is only ever local.
- ``/healthz``, ``/readyz`` and ``/status`` (a page without data: its script asks the API, with the
  key given in the page's URL fragment) are open. ``/metrics`` is open to loopback peers; another
  peer needs one of ``http.metrics_keys``, and without any it is refused (403 ``metrics_off``).

Keys are compared as SHA-256 digests with ``hmac.compare_digest`` (config/tenants.py). No key, and
no digest, is ever logged or put in an answer; refusals are counted by reason only.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter

from config.tenants import Tenants, key_digest
from voicegate.control.http_rules import Handler, json_error

_OPEN_PATHS = frozenset({"/healthz", "/readyz", "/status"})
# The tenant a request acts for, set once its key is checked; unset: every tenant (an open API).
_TENANT = web.RequestKey("tenant", str)


@dataclass(frozen=True, slots=True)
class Access:
    tenants: Tenants
    metrics_keys: tuple[str, ...]  # SHA-256 hex digests
    refused: Counter  # by reason: voicegate.observe.metrics.API_REFUSAL_REASONS

    @property
    def open(self) -> bool:
        return not self.tenants.keys_configured


ACCESS = web.AppKey("access", Access)


def bearer(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive, RFC 7235
    section 2.1), or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _loopback(request: web.Request) -> bool:
    try:
        return request.remote is not None and ipaddress.ip_address(request.remote).is_loopback
    except ValueError:
        return False  # a Unix socket or something else we did not bind: not loopback


# Worded so that no log line reads as an Authorization header with a value (the secret audit).
MISSING_KEY = "an API key is required: send it as a Bearer token in the Authorization header"


def _refuse(
    access: Access, status: int, reason: str, message: str, **fields: object
) -> web.Response:
    access.refused.labels(reason).inc()
    response = json_error(status, message, reason=reason, **fields)
    if status == 401:
        error = ' error="invalid_token"' if reason == "wrong_key" else ""
        response.headers["WWW-Authenticate"] = f'Bearer realm="voicegate"{error}'
    return response


def _metrics_allowed(access: Access, request: web.Request) -> web.Response | None:
    if _loopback(request):
        return None
    if not access.metrics_keys:
        return _refuse(
            access,
            403,
            "metrics_off",
            "/metrics answers loopback peers only: set http.metrics_keys to scrape it from "
            "elsewhere",
        )
    key = bearer(request)
    if key is None:
        return _refuse(access, 401, "missing_key", MISSING_KEY)
    digest = key_digest(key).encode()
    if not any([hmac.compare_digest(digest, k.encode()) for k in access.metrics_keys]):
        return _refuse(access, 401, "wrong_key", "the key is not a metrics key")
    return None


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse what the caller's key does not allow; record the tenant a request acts for."""
    access = request.app[ACCESS]
    path = request.path
    if path in _OPEN_PATHS:
        return await handler(request)
    if path == "/metrics":
        return _metrics_allowed(access, request) or await handler(request)
    if access.open:
        return await handler(request)
    key = bearer(request)
    if key is None:
        return _refuse(access, 401, "missing_key", MISSING_KEY)
    tenant = access.tenants.by_key(key)
    if tenant is None:
        return _refuse(access, 401, "wrong_key", "the key is not one this server holds")
    request[_TENANT] = tenant.name
    return await handler(request)


def scope(request: web.Request) -> str | None:
    """The tenant whose calls and sessions this request may see; None: every tenant's."""
    return request.get(_TENANT)


def foreign(request: web.Request, owner: str, **fields: object) -> web.Response | None:
    """The 403 for a request about ``owner``'s call or session by another tenant, or None."""
    tenant = scope(request)
    if tenant is None or tenant == owner:
        return None
    return _refuse(
        request.app[ACCESS],
        403,
        "other_tenant",
        "this belongs to another tenant: use that tenant's key",
        **fields,
    )
