"""The WebSocket server voicegate dials: one Pipecat pipeline per call, sockets come and go.

voicegate opens one socket per call to ``agent.url``; when a socket drops it redials with
``session.resume`` and the resume token this side gave it. ``VoicegateServer`` checks the
bearer token, answers ``session.start`` (then runs the bot's coroutine with the call's
``VoicegateTransport``), and re-attaches a resumed socket to the same transport, replaying what
voicegate had not acked; the bot's pipeline keeps running through all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web
from yarl import URL

from integrations.pipecat.link import SUBPROTOCOL, Link, SeqGap, verify_token
from integrations.pipecat.serializer import ProtocolError
from integrations.pipecat.transport import CallInfo, VoicegateParams, VoicegateTransport

log = logging.getLogger("voicegate.pipecat")

Bot = Callable[[VoicegateTransport], Awaitable[None]]
FEATURES = ("marks", "tools", "resume", "dtmf", "speech_events")
MAX_FRAME = 1 << 17


class VoicegateServer:
    """Serves ``bot`` to voicegate at ``url`` (the URL voicegate dials: the token's audience).

    ``bot(transport)`` is the bot's own code: build the pipeline around ``transport.input()``
    and ``transport.output()`` and run it; it is called once per call, in a task of its own.
    """

    def __init__(
        self,
        bot: Bot,
        *,
        secret: str,
        url: str,
        params: Callable[[], VoicegateParams] = VoicegateParams,
        rate: int | None = None,
    ) -> None:
        if len(secret) < 16:
            raise ValueError("the shared secret must be at least 16 characters")
        self._bot = bot
        self._secret = secret
        self.url = url
        self._params = params
        self._rate = rate  # the rate to accept when voicegate offers several (default: first)
        self.sessions: dict[str, VoicegateTransport] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.get(URL(self.url).path or "/", self.socket)])
        app.on_shutdown.append(self._shutdown)
        return app

    async def run(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
        ready: Callable[[], None] | None = None,
    ) -> None:
        """Serve until cancelled; ``ready`` is called once the port is listening."""
        runner = web.AppRunner(self.app())
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        await site.start()
        if ready is not None:
            ready()
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    async def _shutdown(self, _: web.Application) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def socket(self, request: web.Request) -> web.StreamResponse:
        sid = verify_token(self._secret, request.headers.get("Authorization", ""), self.url)
        if sid is None:
            return web.Response(status=401, text="bad token\n")
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,), max_msg_size=MAX_FRAME)
        await ws.prepare(request)
        transport: VoicegateTransport | None = None
        try:
            async for frame in ws:
                if frame.type is WSMsgType.BINARY:
                    if transport is not None:
                        await transport.receive_audio(frame.data)
                    continue
                if frame.type is not WSMsgType.TEXT:
                    continue
                message = json.loads(frame.data)
                if transport is None:
                    transport = await self._hello(ws, sid, message)
                    if transport is None:
                        break
                    continue
                await self._take(transport, message)
        except (ProtocolError, SeqGap, ValueError, KeyError, TypeError) as exc:
            # Whatever voicegate sent that this side cannot read: say so and close; voicegate
            # resumes and replays, so nothing is lost.
            log.warning("pipecat.link_error: %s", type(exc).__name__)
            code = "seq_gap" if isinstance(exc, SeqGap) else "schema"
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_str(_error(code, str(exc)))
        finally:
            lost = transport is not None and transport.link.detach(ws)
            if transport is not None and lost and transport.ended is None:
                await transport.link_lost()
        return ws

    async def _take(self, transport: VoicegateTransport, message: dict[str, Any]) -> None:
        link = transport.link
        before = link.sent
        if not link.take(message):
            if message.get("type") == "ping":
                await link.send_link({"type": "pong", "id": message.get("id")})
            return
        await transport.receive(message)
        if message["type"] == "session.end":
            self.sessions.pop(link.session_id, None)
        elif link.sent == before:
            await link.send_link({"type": "ack"})  # nothing else carried our ack

    async def _hello(
        self, ws: web.WebSocketResponse, sid: str, message: dict[str, Any]
    ) -> VoicegateTransport | None:
        kind = message.get("type")
        known = self.sessions.get(sid)
        if kind == "session.start" and message.get("session_id") == sid and known is None:
            return await self._start(ws, sid, message)
        if (
            kind == "session.resume"
            and known is not None
            and known.link.resume_token_matches(message.get("resume_token"))
        ):
            link = known.link
            await link.attach(ws)
            await link.send_link(
                {"type": "session.resumed", "resume_token": link.new_resume_token()}
            )
            await link.replay(int(message.get("ack", 0)))
            await known.link_resumed()
            return known
        code = "resume_refused" if kind == "session.resume" else "handshake"
        await ws.send_str(_error(code, "unknown session or token"))
        return None

    async def _start(
        self, ws: web.WebSocketResponse, sid: str, start: dict[str, Any]
    ) -> VoicegateTransport | None:
        rates = [int(r) for r in start.get("audio", {}).get("rates", [])] or [8000]
        rate = self._rate if self._rate in rates else rates[0]
        link = Link(sid)
        link.taken = int(start["seq"])
        await link.attach(ws)
        transport = VoicegateTransport(link, CallInfo.from_start(start, rate), self._params())
        self.sessions[sid] = transport
        await link.send(
            {
                "type": "session.accept",
                "version": 1,
                "audio": {
                    "encoding": "pcm16",
                    "rate": rate,
                    "frame_ms": 20,
                    "frame_bytes": rate // 50 * 2,
                },
                "features": list(FEATURES),
                "resume_token": link.new_resume_token(),
            }
        )
        task = asyncio.create_task(self._run_bot(transport), name=f"bot-{sid[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return transport

    async def _run_bot(self, transport: VoicegateTransport) -> None:
        link = transport.link
        try:
            await self._bot(transport)
        except Exception:
            # The bot's pipeline is gone, not the call: refuse this session so that voicegate
            # starts it afresh on a new pipeline (session.start, resumed: pick the call up). A
            # bot that fails again is refused again, and voicegate ends the call failed.
            log.exception("pipecat.bot_failed session=%s", link.session_id)
            if self.sessions.get(link.session_id) is transport:
                del self.sessions[link.session_id]
            socket = link.socket
            if socket is not None and not socket.closed:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await socket.send_str(_error("internal", "the bot failed"))
                await socket.close()
            return
        if transport.ended is None:
            await transport.hang_up("the bot finished")


def _error(code: str, detail: str) -> str:
    """A fatal link error (a link message: it carries no seq of its own)."""
    body = {"type": "error", "seq": 0, "ack": 0, "code": code, "ref_seq": None, "fatal": True}
    return json.dumps({**body, "detail": detail[:200]})
