"""The token voicegate presents when it dials a remote agent, and resume-token hygiene.

The bearer token (``Authorization: Bearer v1.<claims>.<mac>``) is short-lived and bound to one
session and one agent: claims ``sid`` (the session id), ``exp`` (Unix seconds) and ``aud`` (the
agent URL it was made for), base64url JSON, authenticated by HMAC-SHA256 with the per-agent secret
(``agent.secret``). An agent verifies it with :func:`verify_token` (constant-time compare).

Resume tokens are the agent's: it issues one at ``session.accept`` and a new one at every
``session.resumed`` (the old one dies, seed 000: "short lifetime, scope, rotation"). The agent
keeps only :func:`token_digest` of it; voicegate keeps the current one in memory for the one
redial that will use it. Neither side logs a token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from typing import Any

PREFIX = "v1"
TOKEN_TTL_S = 60


class TokenError(ValueError):
    """The token is malformed, forged, expired or for another audience (HTTP 401)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, body: str) -> str:
    return _b64(hmac.new(secret.encode(), f"{PREFIX}.{body}".encode(), hashlib.sha256).digest())


def make_token(
    secret: str, session_id: str, audience: str, now: float, ttl_s: int = TOKEN_TTL_S
) -> str:
    """A bearer token for ``session_id`` at ``audience``, valid ``ttl_s`` from ``now`` (Unix s)."""
    claims = {"sid": session_id, "exp": int(now) + ttl_s, "aud": audience}
    body = _b64(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode())
    return f"{PREFIX}.{body}.{_mac(secret, body)}"


def verify_token(secret: str, token: str, audience: str, now: float) -> dict[str, Any]:
    """The claims of a valid token; :class:`TokenError` (saying why, never echoing it) else."""
    prefix, _, rest = token.partition(".")
    body, _, mac = rest.partition(".")
    if prefix != PREFIX or not body or not mac:
        raise TokenError("not a v1 token")
    if not hmac.compare_digest(mac, _mac(secret, body)):
        raise TokenError("bad signature")
    try:
        claims = json.loads(_unb64(body))
    except ValueError:
        raise TokenError("unreadable claims") from None
    if not isinstance(claims, dict) or not isinstance(claims.get("exp"), int):
        raise TokenError("unreadable claims")
    if claims["exp"] < now:
        raise TokenError("expired")
    if claims.get("aud") != audience:
        raise TokenError("issued for another agent")
    return claims


def new_resume_token() -> str:
    """A fresh resume token: 256 random bits."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What a verifier stores instead of the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()
