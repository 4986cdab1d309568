"""One session's side of the agent link: the bearer token, seq and ack, replay and resume.

docs/agent-protocol.md ("seq and ack", "When the link drops"). A session outlives its sockets:
every sequenced message is kept until voicegate's ``ack`` covers it and is replayed, with its
own ``seq``, on the socket that resumes the session. The pipeline never sees any of this: a
dropped socket only pauses what the link sends.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Any, Protocol

LINK_TYPES = frozenset({"session.resume", "session.resumed", "ping", "pong", "ack"})
SUBPROTOCOL = "voicegate.agent.v1"


class SeqGap(Exception):
    """voicegate's messages skipped a seq: close the socket, the resume replays the gap."""


class Socket(Protocol):
    """What the link needs of a WebSocket (aiohttp's ``WebSocketResponse`` is one)."""

    @property
    def closed(self) -> bool: ...

    async def send_str(self, data: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self) -> Any: ...


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_token(secret: str, header: str, audience: str, now: float | None = None) -> str | None:
    """The session id a valid ``Authorization: Bearer v1.<claims>.<mac>`` is for, else None.

    The MAC is HMAC-SHA256 with the shared secret, compared in constant time; the token must not
    have expired and its audience must be this agent's own URL.
    """
    token = header.removeprefix("Bearer ").strip()
    try:
        prefix, body, mac = token.split(".")
        good = hmac.new(secret.encode(), f"{prefix}.{body}".encode(), hashlib.sha256).digest()
        if prefix != "v1" or not hmac.compare_digest(_b64decode(mac), good):
            return None
        claims = json.loads(_b64decode(body))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(claims, dict):
        return None
    expires, sid = claims.get("exp"), claims.get("sid")
    if not isinstance(expires, int | float) or expires < (time.time() if now is None else now):
        return None
    if claims.get("aud") != audience or not isinstance(sid, str) or not sid:
        return None
    return sid


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Link:
    """Sequencing, acknowledgement and replay for one session, across its sockets."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.sent = 0  # the last sequenced seq this side sent
        self.taken = 0  # the last sequenced seq taken from voicegate
        self._unacked: list[dict[str, Any]] = []
        self._resume_digest = ""  # only the SHA-256 of the resume token is kept
        self._socket: Socket | None = None
        self.up = asyncio.Event()  # a live socket is attached
        self._lock = asyncio.Lock()  # one writer at a time keeps seq order on the wire

    @property
    def socket(self) -> Socket | None:
        return self._socket

    def new_resume_token(self) -> str:
        """A fresh resume token; the one before it is dead from now on."""
        token = secrets.token_urlsafe(32)
        self._resume_digest = _digest(token)
        return token

    def resume_token_matches(self, token: object) -> bool:
        return (
            isinstance(token, str)
            and bool(self._resume_digest)
            and hmac.compare_digest(_digest(token), self._resume_digest)
        )

    async def attach(self, socket: Socket) -> None:
        """Make ``socket`` the session's one live socket (closing the one before, if any)."""
        old, self._socket = self._socket, socket
        if old is not None and old is not socket and not old.closed:
            await old.close()
        self.up.set()

    def detach(self, socket: Socket) -> bool:
        """The socket closed; True if it was the live one (the link is down until a resume)."""
        if self._socket is not socket:
            return False
        self._socket = None
        self.up.clear()
        return True

    async def send(self, body: dict[str, Any]) -> int:
        """Send a sequenced message (kept until acked, replayed on resume); its seq."""
        async with self._lock:
            self.sent += 1
            message = {**body, "seq": self.sent, "ack": self.taken}
            self._unacked.append(message)
            await self._write(json.dumps(message, separators=(",", ":")))
            return self.sent

    async def send_link(self, body: dict[str, Any]) -> None:
        """Send a link message: it carries the last seq without advancing it, never replayed."""
        async with self._lock:
            message = {**body, "seq": self.sent, "ack": self.taken}
            await self._write(json.dumps(message, separators=(",", ":")))

    async def send_audio(self, data: bytes) -> bool:
        """Send a binary frame on the live socket; False if the link is down (never replayed)."""
        socket = self._socket
        if socket is None or socket.closed:
            return False
        try:
            await socket.send_bytes(data)
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def replay(self, acked: int) -> None:
        """On a resumed socket: everything voicegate has not acked, with its own seq."""
        async with self._lock:
            self._drop_acked(acked)
            for message in self._unacked:
                await self._write(json.dumps({**message, "ack": self.taken}))

    def take(self, message: dict[str, Any]) -> bool:
        """Account for a message from voicegate; True if it is new and sequenced (act on it).

        Its ``ack`` releases what voicegate has; a sequenced message at or below the last one
        taken is a duplicate from voicegate's replay, skipped.
        """
        ack = message.get("ack")
        if isinstance(ack, int):
            self._drop_acked(ack)
        if message.get("type") in LINK_TYPES:
            return False
        seq = message.get("seq")
        if not isinstance(seq, int) or seq <= self.taken:
            return False
        if seq > self.taken + 1:
            raise SeqGap(f"expected seq {self.taken + 1}, got {seq}")
        self.taken = seq
        return True

    def _drop_acked(self, acked: int) -> None:
        if self._unacked and self._unacked[0]["seq"] <= acked:
            self._unacked = [m for m in self._unacked if m["seq"] > acked]

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    async def _write(self, text: str) -> None:
        socket = self._socket
        if socket is None or socket.closed:
            return  # kept in _unacked: the resume replays it
        try:
            await socket.send_str(text)
        except (ConnectionError, RuntimeError):
            return  # the socket is going away: the resume replays it
