"""One call's link to a remote agent: the WebSocket, the handshake, resume, replay and redial.

The link owns at most one socket at a time (one live socket per session) and runs in one task of
its own, which the adapter cancels when the call ends. Sending never waits: a message is stamped
into the :class:`~agents.remote.protocol.Outbox` and queued for the socket's writer if one is up;
a message sent while the link is down waits in the outbox and is replayed after the resume (seed
004: reclaim, don't resend; the peer skips what it already had by seq). Caller audio is not kept:
what the agent missed is reported as one ``audio.gap``.

When the socket drops the link tells its owner (the session freezes side effects and cuts the
response), then redials (agents/remote/dial.py: the signed dial, TLS, the jittered backoff) until
``reconnect_deadline_s`` from the drop; past it, or when the agent refuses the token or the
resume, it gives up and the owner ends the call (seed 001: a deadline, bounded retries with
jitter, one owner of the retry). The resume token is held in memory only and never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from agents.remote.dial import GiveUp, LinkConfig, redial_delay, try_dial, write_frames
from agents.remote.metrics import RemoteAgentMetrics
from agents.remote.owner import LinkOwner
from agents.remote.protocol import (
    LINK_TYPES,
    VERSION,
    Codec,
    ErrorBudget,
    FloodGuard,
    Inbox,
    Outbox,
    ProtocolError,
    ReplayOverflow,
    RoundTrip,
)

log = logging.getLogger("voicegate.agent.remote")

QUEUE_BOUND = 1000  # frames waiting for one socket's writer


class Link:
    def __init__(
        self,
        config: LinkConfig,
        session_id: str,
        owner: LinkOwner,
        metrics: RemoteAgentMetrics,
        now: Callable[[], float] | None = None,
    ) -> None:
        # Time is injected (STYLE.md habit 3): the loop's clock at run time, a fake in tests.
        self._now = now or (lambda: asyncio.get_running_loop().time())
        self.config = config
        self.session_id = session_id
        self.owner = owner
        self.metrics = metrics
        self.outbox = Outbox(config.replay_bound)
        self.inbox = Inbox()
        self.codec = Codec("from_agent")
        self.budget = ErrorBudget(config.max_protocol_errors)
        self.flood = FloodGuard()
        self.state = "connecting"
        self.round_trip = RoundTrip()
        self._resume_token: str | None = None  # the agent's; memory only, never logged
        self._queue: asyncio.Queue[tuple[str, Any]] | None = None  # the live socket's writer
        self._pending: asyncio.Queue[tuple[str, Any]] | None = None  # until session.resumed
        self._handshaken = False
        self._closing = False
        self._restarted = False  # a new session.start after a refused resume (once)
        self._ack_sent = 0  # the ack the last message on the wire carried
        metrics.agent_links.labels("connecting").inc()

    # --- state --------------------------------------------------------------------------------

    def _set_state(self, new: str) -> None:
        if new == self.state:
            return
        if self.state != "closed":
            self.metrics.agent_links.labels(self.state).dec()
        if new != "closed":
            self.metrics.agent_links.labels(new).inc()
        log.info(
            "agent_link.state", extra={"call_id": self.session_id, "old": self.state, "new": new}
        )
        self.state = new

    @property
    def is_open(self) -> bool:
        return self._queue is not None

    # --- sending (never waits) ----------------------------------------------------------------

    def send(self, body: Mapping[str, Any]) -> None:
        """Stamp ``body`` and send it now if the link is up; a sequenced message is kept for
        replay until acked either way."""
        if self.state == "closed":
            return
        try:
            message = self.outbox.stamp(body, self.inbox.seq)
        except ReplayOverflow as exc:
            log.warning("agent_link.replay_overflow", extra={"call_id": self.session_id})
            self._close_and_give_up(f"replay buffer full: {exc}")
            return
        if self._put(self._queue, ("text", json.dumps(message, separators=(",", ":")))):
            self._ack_sent = message["ack"]

    def ack_if_owed(self) -> None:
        """A bare ``ack`` if the peer has not yet been told of everything taken."""
        if self._queue is not None and self.inbox.seq > self._ack_sent:
            self.send({"type": "ack"})

    def send_audio(self, frame: bytes) -> bool:
        """Queue caller audio if the link is up; False if it was not sent (a gap)."""
        return self._queue is not None and self._put(self._queue, ("bytes", frame))

    def _put(self, queue: asyncio.Queue[tuple[str, Any]] | None, item: tuple[str, Any]) -> bool:
        if queue is None:
            return False
        try:
            queue.put_nowait(item)
        except asyncio.QueueFull:
            # The agent does not read: drop the socket; the resume replays what it missed.
            self._drop_socket()
            return False
        return True

    def close(self) -> None:
        """The call is over: flush what is queued, close the socket, stop redialling."""
        self._closing = True
        if self._queue is not None:
            self._put(self._queue, ("close", None))
        self._set_state("closed")

    def _drop_socket(self) -> None:
        self._queue = None
        if self._ws is not None and not self._ws.closed:
            asyncio.get_running_loop().create_task(self._ws.close())

    def _close_and_give_up(self, reason: str) -> None:
        self._give_up_reason = reason
        if self._queue is not None:
            # What is queued, the last (fatal) error first of all, goes out before the close.
            self._put(self._queue, ("close", None))
            self._queue = None
        else:
            self._drop_socket()

    # --- the task -----------------------------------------------------------------------------

    _ws: aiohttp.ClientWebSocketResponse | None = None
    _give_up_reason: str | None = None

    async def run(self) -> None:
        """Dial, serve, redial until the call ends or the link is given up."""
        loop = asyncio.get_running_loop()
        lost_at: float | None = None
        attempt = 0
        try:
            async with aiohttp.ClientSession() as http:
                while not self._closing:
                    if self._give_up_reason is not None:  # decided while the link was down
                        raise GiveUp(self._give_up_reason)
                    elapsed = loop.time() - lost_at if lost_at is not None else 0.0
                    timeout = max(0.2, min(self.config.reconnect_deadline_s - elapsed, 5.0))
                    resuming = self._resume_token is not None
                    ws = await try_dial(
                        http, self.config, self.session_id, timeout, resuming, self.metrics
                    )
                    if ws is not None:
                        await self._serve(ws, handshake_s=timeout)
                        if self._handshaken:
                            lost_at, attempt = None, 0
                    if self._give_up_reason is not None:
                        raise GiveUp(self._give_up_reason)
                    if self._closing:
                        return
                    now = loop.time()
                    if lost_at is None:
                        lost_at = now
                        self._set_state("lost")
                        self.owner.link_down()
                    if now - lost_at >= self.config.reconnect_deadline_s:
                        self.metrics.agent_link_resumes.labels("failed").inc()
                        raise GiveUp(f"not back within {self.config.reconnect_deadline_s:g} s")
                    delay = redial_delay(self.session_id, attempt)
                    attempt += 1
                    await asyncio.sleep(
                        min(delay, lost_at + self.config.reconnect_deadline_s - now)
                    )
        except GiveUp as exc:
            self._set_state("closed")
            log.warning(
                "agent_link.gave_up", extra={"call_id": self.session_id, "reason": str(exc)}
            )
            self.owner.link_gone(str(exc))
        finally:
            self._queue = None
            if self.state != "closed":
                self._set_state("closed")

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse, handshake_s: float) -> None:
        """Handshake, then read until the socket closes."""
        self._ws = ws
        self._handshaken = False
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(QUEUE_BOUND)
        writer = asyncio.create_task(write_frames(ws, queue))
        pinger = asyncio.create_task(self._ping(ws))
        resume = self._resume_token is not None
        try:
            if resume:
                self._pending = queue
                hello = self.outbox.stamp(
                    {
                        "type": "session.resume",
                        "session_id": self.session_id,
                        "resume_token": self._resume_token,
                        **self.owner.resume_fields(),
                    },
                    self.inbox.seq,
                )
                queue.put_nowait(("text", json.dumps(hello)))
            else:
                self._queue = queue
                for message in self.outbox.replay(0, self.inbox.seq):
                    queue.put_nowait(("text", json.dumps(message)))
            loop = asyncio.get_running_loop()
            handshake_by = loop.time() + handshake_s
            silence = 3 * self.config.ping_interval_s
            while True:
                wait = silence if self._handshaken else max(0.05, handshake_by - loop.time())
                try:
                    frame = await ws.receive(timeout=wait)
                except TimeoutError:
                    log.info("agent_link.silent", extra={"call_id": self.session_id})
                    break
                if frame.type is aiohttp.WSMsgType.TEXT:
                    self._on_text(frame.data)
                elif frame.type is aiohttp.WSMsgType.BINARY:
                    self._on_binary(frame.data)
                else:
                    break  # closed, closing or a transport error: the link is down
                if self._give_up_reason is not None or ws.closed:
                    break
        finally:
            self._queue = self._pending = None
            pinger.cancel()
            if self._closing or self._give_up_reason is not None:
                await asyncio.wait({writer}, timeout=2.0)  # flush: session.end, a last error
            writer.cancel()
            if not ws.closed:
                await ws.close()
            self._ws = None

    async def _ping(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            await asyncio.sleep(self.config.ping_interval_s)
            if self._queue is not None:
                self.send(self.round_trip.ping(self._now()))

    # --- receiving ----------------------------------------------------------------------------

    def _on_text(self, text: str) -> None:
        try:
            self.flood.check(self._now())
            message = self.codec.decode_text(text)
            self.outbox.check_ack(message["ack"], message["seq"])
            fresh = self.inbox.take(message)
        except ProtocolError as exc:
            self.refuse(exc)
            return
        self.outbox.acked(message["ack"])
        kind = message["type"]
        if not fresh and kind not in LINK_TYPES and self._handshaken:
            # The agent replayed what we already had (it missed our ack): skip it, count it.
            # (Before the handshake it is the agent's answer to it, read there: a restarted
            # agent refusing a resume numbers its error from scratch.)
            self.metrics.agent_replayed_messages.labels("from_agent").inc()
            return
        try:
            self._dispatch(message)
        except ProtocolError as exc:
            self.refuse(exc)
        self.ack_if_owed()

    def _on_binary(self, data: bytes) -> None:
        try:
            if not self._handshaken:
                raise ProtocolError("handshake", "audio before the handshake")
            self.owner.on_chunk(data)
        except ProtocolError as exc:
            self.refuse(exc)

    def _dispatch(self, message: Mapping[str, Any]) -> None:
        kind = message["type"]
        if not self._handshaken:
            self._handshake(message)
            return
        match kind:
            case "ping":
                self.send(
                    {"type": "pong", "id": message["id"], "buffered_ms": self.owner.buffered_ms()}
                )
            case "pong":
                rtt_ms = self.round_trip.pong(message["id"], self._now())
                if rtt_ms is not None:
                    log.debug("agent_link.rtt", extra={"call_id": self.session_id, "rtt": rtt_ms})
            case "ack":
                pass
            case "error":
                log.warning(
                    "agent_link.peer_error",
                    extra={
                        "call_id": self.session_id,
                        "code": message["code"],
                        "ref_seq": message["ref_seq"],
                        "fatal": message["fatal"],
                    },
                )
            case "session.accept" | "session.resumed" | "session.resume":
                raise ProtocolError("handshake", f"{kind} after the handshake", message["seq"])
            case _:
                self.owner.on_message(message)

    def _handshake(self, message: Mapping[str, Any]) -> None:
        kind = message["type"]
        resuming = self._pending is not None
        if kind == "error" and message["code"] in ("resume_refused", "handshake"):
            if resuming:
                self.metrics.agent_link_resumes.labels("refused").inc()
                if not self._restarted:
                    self._restart()
                    return
            raise_reason = f"the agent refused the {'resume' if resuming else 'session'}"
            self._close_and_give_up(raise_reason)
            return
        if resuming and kind == "session.resumed":
            self._resume_token = message["resume_token"]
            queue, self._pending = self._pending, None
            assert queue is not None
            replay = self.outbox.replay(message["ack"], self.inbox.seq)
            for item in replay:
                queue.put_nowait(("text", json.dumps(item)))
            self.metrics.agent_replayed_messages.labels("to_agent").inc(len(replay))
            self.metrics.agent_link_resumes.labels("resumed").inc()
            self._queue = queue
            self._up(resumed=True)
            log.info(
                "agent_link.resumed", extra={"call_id": self.session_id, "replayed": len(replay)}
            )
            return
        if not resuming and kind == "session.accept":
            try:
                if message["version"] != VERSION:
                    raise ProtocolError(
                        "handshake",
                        f"version {message['version']} not offered",
                        message["seq"],
                        fatal=True,
                    )
                self.owner.check_accept(message)
            except ProtocolError as exc:
                exc.fatal = True
                self.refuse(exc)
                self._close_and_give_up(f"handshake refused: {exc.detail}")
                return
            self._resume_token = message["resume_token"]
            self._up(resumed=False)
            return
        raise ProtocolError("handshake", f"{kind} before the handshake", message["seq"])

    def _restart(self) -> None:
        """The agent has no record of this session (it restarted): start a new one on the next
        socket, ``session.start`` with ``resumed: true`` and what the caller last heard. Its
        seq and acks start again from 1; what the old session had not acked is gone with it.
        Once per link: an agent that refuses again ends the call."""
        self._restarted = True
        self.metrics.agent_link_resumes.labels("restarted").inc()
        log.info("agent_link.restarted", extra={"call_id": self.session_id})
        self._resume_token = None
        self.outbox = Outbox(self.config.replay_bound)
        self.inbox = Inbox()
        self._ack_sent = 0
        self.send(self.owner.restart_message())
        self._drop_socket()

    def _up(self, resumed: bool) -> None:
        self._handshaken = True
        self._set_state("open")
        self.owner.link_up(resumed)

    def refuse(self, exc: ProtocolError) -> None:
        """Tell the agent what was refused (in band), count it; close past the budget."""
        self.metrics.agent_protocol_errors.labels(exc.code).inc()
        log.warning(
            "agent_link.refused",
            extra={
                "call_id": self.session_id,
                "code": exc.code,
                "ref_seq": exc.ref_seq,
                "detail": exc.detail,
                "fatal": exc.fatal,
            },
        )
        exhausted = self.budget.spend()
        if exhausted:
            exc.fatal = True
        if exc.answer or exhausted:
            self.send(exc.message())
        if exhausted:
            self._close_and_give_up(f"{self.budget.count} protocol errors")
        elif exc.fatal:
            # A gap in the agent's seq: drop this socket; the resume replays what was missing.
            self._drop_socket()
