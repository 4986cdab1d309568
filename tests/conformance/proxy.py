"""A WebSocket proxy between voicegate and a remote agent that breaks the link on purpose.

voicegate dials the proxy (``agent.url`` is the proxy's URL); the proxy dials the agent under
test with a token re-signed for the agent's own URL (the kit knows the shared secret: it
configured voicegate with it), and forwards every frame both ways, recording what passed. A test
then breaks things at the moment it chooses, from its own thread:

- :meth:`kill` closes both sockets of the live pair (each side sees its link drop);
- :meth:`refuse` answers new sockets with HTTP 503 for a while (the agent is unreachable);
- :meth:`inject` sends a frame to voicegate as if the agent had sent it (bad messages, stale
  chunks, stale acks), never to the agent.

It runs its own event loop in a thread so that a synchronous pytest test (SIPp, RTP capture,
polling) drives it. It interprets nothing but what it needs to record (a text frame's ``type``,
``seq``, ids; a binary frame's response id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from agents.remote import auth
from agents.remote.protocol import SUBPROTOCOL

TO_AGENT = "to_agent"
FROM_AGENT = "from_agent"
KILL_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class Passed:
    """One frame the proxy forwarded (or injected: ``injected``)."""

    at: float  # time.time()
    direction: str  # TO_AGENT or FROM_AGENT
    socket: int  # which voicegate socket (1, 2, ...): a redial opens the next
    text: dict[str, Any] | None = None  # a JSON message
    data: bytes | None = None  # a binary frame
    injected: bool = False

    @property
    def type(self) -> str:
        return str(self.text.get("type")) if self.text else "binary"

    @property
    def response_id(self) -> str | None:
        if self.data is not None and len(self.data) >= 4 and self.data[0] == 2:
            (length,) = struct.unpack_from("!H", self.data, 2)
            return self.data[4 : 4 + length].decode("ascii", "replace")
        return str(self.text["response_id"]) if self.text and "response_id" in self.text else None


@dataclass
class ChaosProxy:
    agent_url: str
    secret: str = field(repr=False)
    port: int
    host: str = "127.0.0.1"
    tls: ssl.SSLContext | bool = True  # for a wss:// agent: the CAs to trust (default: system's)
    lag_s: float = 0.0  # voicegate's frames reach the agent this late (a far-away agent)
    passed: list[Passed] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _pair: tuple[web.WebSocketResponse, aiohttp.ClientWebSocketResponse] | None = None
    _refuse_until: float = 0.0
    _sockets: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/agent"

    # --- the test's side (any thread) ----------------------------------------------------------

    def start(self) -> ChaosProxy:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the conformance proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def kill(self) -> bool:
        """Close the live pair of sockets; False if none was up."""
        return bool(self._call(self._kill))

    def refuse(self, seconds: float) -> None:
        """Refuse voicegate's next sockets (HTTP 503) for ``seconds`` from now."""
        self._refuse_until = time.time() + seconds

    def inject(self, frame: str | bytes | dict[str, Any]) -> None:
        """Send ``frame`` to voicegate as if from the agent (a dict is sent as JSON)."""
        self._call(lambda: self._inject(frame))

    def frames(
        self, direction: str | None = None, kind: str | None = None, since: float = 0.0
    ) -> list[Passed]:
        with self._lock:
            return [
                p
                for p in self.passed
                if (direction is None or p.direction == direction)
                and (kind is None or p.type == kind)
                and p.at >= since
            ]

    def first(self, predicate: Callable[[Passed], bool]) -> Passed | None:
        with self._lock:
            return next((p for p in self.passed if predicate(p)), None)

    @property
    def sockets(self) -> int:
        return self._sockets

    def _call(self, work: Callable[[], Any]) -> Any:
        assert self._loop is not None

        async def run() -> Any:
            result = work()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    # --- the proxy's loop ----------------------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.add_routes([web.get("/agent", self._socket)])
        self._runner = web.AppRunner(app)
        loop.run_until_complete(self._runner.setup())
        loop.run_until_complete(web.TCPSite(self._runner, self.host, self.port).start())
        ready.set()
        loop.run_forever()
        loop.close()

    async def _shutdown(self) -> None:
        await self._kill()
        if self._runner is not None:
            await self._runner.cleanup()

    def _record(self, passed: Passed) -> None:
        with self._lock:
            self.passed.append(passed)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        if time.time() < self._refuse_until:
            return web.Response(status=503, text="the conformance kit keeps the agent away\n")
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        try:
            sid = str(auth.verify_token(self.secret, bearer, self.url, time.time())["sid"])
        except auth.TokenError:
            return web.Response(status=401, text="bad token\n")
        token = auth.make_token(self.secret, sid, self.agent_url, time.time())
        async with aiohttp.ClientSession() as http:
            try:
                upstream = await http.ws_connect(
                    self.agent_url,
                    headers={"Authorization": f"Bearer {token}"},
                    protocols=(SUBPROTOCOL,),
                    max_msg_size=1 << 20,
                    heartbeat=None,
                    ssl=self.tls,
                )
            except aiohttp.WSServerHandshakeError as exc:
                return web.Response(status=exc.status, text="the agent refused\n")
            ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,), max_msg_size=1 << 20)
            await ws.prepare(request)
            self._sockets += 1
            number = self._sockets
            self._pair = (ws, upstream)
            pumps = [
                asyncio.create_task(self._pump(ws, upstream, TO_AGENT, number)),
                asyncio.create_task(self._pump(upstream, ws, FROM_AGENT, number)),
            ]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for pump in pumps:
                pump.cancel()
            if self._pair == (ws, upstream):
                self._pair = None
            await upstream.close()
            await ws.close()
        return ws

    async def _pump(self, source: Any, sink: Any, direction: str, number: int) -> None:
        if direction == TO_AGENT and self.lag_s > 0:
            await self._lagged_pump(source, sink, number)
            return
        async for frame in source:
            if frame.type == aiohttp.WSMsgType.TEXT:
                with contextlib.suppress(ValueError, RecursionError):
                    self._record(
                        Passed(time.time(), direction, number, text=json.loads(frame.data))
                    )
                await sink.send_str(frame.data)
            elif frame.type == aiohttp.WSMsgType.BINARY:
                self._record(Passed(time.time(), direction, number, data=frame.data))
                await sink.send_bytes(frame.data)
            else:
                return

    async def _lagged_pump(self, source: Any, sink: Any, number: int) -> None:
        """voicegate's frames, each delivered ``lag_s`` after it came, in order (recorded as
        they came: ``at`` is when voicegate sent it)."""
        queue: asyncio.Queue[tuple[float, Any] | None] = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                due, frame = item
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if frame.type == aiohttp.WSMsgType.TEXT:
                    await sink.send_str(frame.data)
                else:
                    await sink.send_bytes(frame.data)

        delivering = asyncio.create_task(deliver())
        try:
            async for frame in source:
                if frame.type == aiohttp.WSMsgType.TEXT:
                    with contextlib.suppress(ValueError, RecursionError):
                        self._record(
                            Passed(time.time(), TO_AGENT, number, text=json.loads(frame.data))
                        )
                elif frame.type == aiohttp.WSMsgType.BINARY:
                    self._record(Passed(time.time(), TO_AGENT, number, data=frame.data))
                else:
                    return
                queue.put_nowait((time.monotonic() + self.lag_s, frame))
        finally:
            # The pair is closing: what was still on its way is lost, as on a real link.
            delivering.cancel()
            await asyncio.gather(delivering, return_exceptions=True)

    async def _kill(self) -> bool:
        """Close frames to both sides at once; a side that has not finished the closing
        handshake within ``KILL_GRACE_S`` has its TCP socket shut down. A kill is a broken link,
        so it must not wait on either peer's cooperation (a peer that answers a close late once
        held a kill past the test's 10 s wait on a loaded CI machine)."""
        pair, self._pair = self._pair, None
        if pair is None:
            return False
        voicegate, agent = pair
        closing: dict[asyncio.Task[bool], tuple[str, Any]] = {
            asyncio.create_task(voicegate.close()): ("voicegate's side", voicegate),
            asyncio.create_task(agent.close()): ("the agent's side", agent),
        }
        _, late = await asyncio.wait(closing, timeout=KILL_GRACE_S)
        for task in late:
            side, ws = closing[task]
            sock = ws.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            print(
                f"conformance proxy: {side} did not finish the closing handshake in "
                f"{KILL_GRACE_S} s; its socket was shut down",
                file=sys.stderr,
            )
        if late:
            await asyncio.wait(late, timeout=KILL_GRACE_S)  # a shut-down socket ends close()
        return True

    async def _inject(self, frame: str | bytes | dict[str, Any]) -> None:
        if self._pair is None:
            raise RuntimeError("no live socket to inject into")
        ws = self._pair[0]
        if isinstance(frame, dict):
            frame = json.dumps(frame)
        number = self._sockets
        if isinstance(frame, bytes):
            self._record(Passed(time.time(), FROM_AGENT, number, data=frame, injected=True))
            await ws.send_bytes(frame)
        else:
            with contextlib.suppress(ValueError, RecursionError):
                text = json.loads(frame)
                if isinstance(text, dict):
                    self._record(Passed(time.time(), FROM_AGENT, number, text=text, injected=True))
            await ws.send_str(frame)
