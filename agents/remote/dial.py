"""A socket to the remote agent: the link's settings, TLS, the signed dial, the backoff, the writer.

:func:`dial` opens one WebSocket to ``agent.url`` with a fresh bearer token (agents/remote/auth.py)
and the protocol's subprotocol, over TLS for ``wss://`` (the system's trust store, or
``agent.ca_file``'s CA certificates: :func:`tls_context`). An answer that says the agent will not
take this session (401/403: the token) is :class:`GiveUp`, never retried; 409 (a live socket for
the session is still open there) and transport failures are worth another dial after
:func:`redial_delay` (seed 001: bounded, jittered, within the deadline).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from agents.remote.auth import make_token
from agents.remote.metrics import RemoteAgentMetrics
from agents.remote.protocol import MAX_BINARY_BYTES, MAX_TEXT_BYTES, SUBPROTOCOL
from session.backoff import Jitter, backoff_delay

log = logging.getLogger("voicegate.agent.remote")

BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 1.0


@dataclass(frozen=True, slots=True)
class LinkConfig:
    url: str
    secret: str
    reconnect_deadline_s: float = 5.0
    ping_interval_s: float = 5.0
    max_protocol_errors: int = 20
    replay_bound: int = 512
    # For wss://: the CA certificates to trust (agent.ca_file); None = the system's.
    tls: ssl.SSLContext | None = None


class GiveUp(Exception):
    """The link will not come back; ``str()`` is the reason (no token, no agent data)."""


class CaFileError(ValueError):
    """``agent.ca_file`` cannot be used; the message names the key and the fix."""


def tls_context(ca_file: Path | None) -> ssl.SSLContext | None:
    """A client context that trusts only ``ca_file``'s certificates (PEM), host names checked;
    None without one (aiohttp then uses the system's trust store)."""
    if ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise CaFileError(
            f'agent.ca_file = "{ca_file}": not a readable PEM file of CA certificates '
            f"({type(exc).__name__}); give the CA that signed the agent's certificate"
        ) from None


def redial_delay(session_id: str, attempt: int) -> float:
    """Seconds before redial ``attempt`` (0.1 s doubling to 1 s, jittered per session)."""
    return backoff_delay(
        f"{session_id}/agent_link",
        attempt,
        base_s=BACKOFF_BASE_S,
        cap_s=BACKOFF_CAP_S,
        jitter=Jitter.FROM_HALF_BASE,
    )


async def dial(
    http: aiohttp.ClientSession,
    config: LinkConfig,
    session_id: str,
    timeout_s: float,
    *,
    resuming: bool,
    metrics: RemoteAgentMetrics,
) -> aiohttp.ClientWebSocketResponse:
    """One WebSocket to the agent, signed for ``session_id``; :class:`GiveUp` if refused."""
    token = make_token(config.secret, session_id, config.url, time.time())
    try:
        async with asyncio.timeout(timeout_s):
            return await http.ws_connect(
                config.url,
                headers={"Authorization": f"Bearer {token}"},
                protocols=(SUBPROTOCOL,),
                max_msg_size=max(MAX_TEXT_BYTES, MAX_BINARY_BYTES) * 2,
                heartbeat=None,
                ssl=config.tls if config.tls is not None else True,
            )
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status in (401, 403):
            if resuming:
                metrics.agent_link_resumes.labels("refused").inc()
            raise GiveUp(f"the agent refused the token (HTTP {exc.status})") from None
        if exc.status == 409:
            raise aiohttp.ClientError("the agent has a live socket for this session") from None
        raise


async def try_dial(
    http: aiohttp.ClientSession,
    config: LinkConfig,
    session_id: str,
    timeout_s: float,
    resuming: bool,
    metrics: RemoteAgentMetrics,
) -> aiohttp.ClientWebSocketResponse | None:
    """:func:`dial`, or None (logged) when the agent could not be reached this time."""
    try:
        return await dial(http, config, session_id, timeout_s, resuming=resuming, metrics=metrics)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        log.info(
            "agent_link.dial_failed", extra={"call_id": session_id, "error": type(exc).__name__}
        )
        return None


async def write_frames(
    ws: aiohttp.ClientWebSocketResponse, queue: asyncio.Queue[tuple[str, Any]]
) -> None:
    """The socket's one writer: ``("text", str)``, ``("bytes", bytes)``, in order, until
    ``("close", None)`` (sent after everything queued before it) or the socket fails."""
    try:
        while True:
            kind, data = await queue.get()
            if kind == "close":
                await ws.close()
                return
            if kind == "text":
                await ws.send_str(data)
            else:
                await ws.send_bytes(data)
    except (ConnectionError, aiohttp.ClientError):
        return
