"""A TCP proxy that makes a server slow, or unreachable, as seen from its clients.

The shared store must keep the event loop free however slow PostgreSQL answers; a database on the
same machine answers in microseconds, which would hide a synchronous call. Put this proxy between
the server under test and PostgreSQL and every chunk waits ``delay_s`` in each direction, so each
round trip costs at least twice that (the default: 5 ms per round trip, a database in another zone
of the same region).

The proxy runs its own event loop in its own thread: on the test's loop, a test that blocked its
loop would also stop the proxy, and the database would look fast exactly when it matters.
:meth:`LatencyProxy.cut` drops every connection and resets new ones until
:meth:`LatencyProxy.restore`: the database unreachable while its server keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_CHUNK = 64 * 1024
# Chunks in flight per direction: bounded so that a slow reader slows its writer (TCP
# backpressure through the proxy) instead of the proxy buffering without limit.
_QUEUED_CHUNKS = 64
_THREAD_TIMEOUT_S = 10.0  # bound on every wait for the proxy's thread
_CONNECT_TIMEOUT_S = 10.0

_Item = tuple[float, bytes | None]  # (when to send, chunk); None: the sender half-closed


class LatencyProxyError(RuntimeError):
    """The proxy could not start, or did not answer in time."""


class LatencyProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host``:``target_port``, adding ``delay_s`` to
    every chunk in each direction and keeping each direction's bytes in order."""

    host = "127.0.0.1"

    def __init__(self, target_host: str, target_port: int, delay_s: float = 0.0025) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, not {delay_s}")
        self.target_host = target_host
        self.target_port = target_port
        self.delay_s = delay_s
        self.port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._cut = False
        # Each proxied connection: its handler task and the two transports it owns.
        self._connections: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}

    # --- control, from the test's thread -------------------------------------------------------

    def start(self) -> LatencyProxy:
        """Listen on a free port of 127.0.0.1 (then in :attr:`port`). Returns self."""
        if self._thread is not None:
            raise LatencyProxyError("the proxy is already started")
        self._thread = threading.Thread(target=self._serve, name="latency-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(_THREAD_TIMEOUT_S):
            raise LatencyProxyError(f"the proxy did not start listening in {_THREAD_TIMEOUT_S} s")
        if self._start_error is not None:
            self._thread.join(_THREAD_TIMEOUT_S)
            self._thread = None
            raise LatencyProxyError(f"the proxy did not start: {self._start_error}")
        return self

    def stop(self) -> None:
        """Close every connection and the listener, and end the proxy's thread and loop."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stopping.set)
        thread.join(_THREAD_TIMEOUT_S)
        if thread.is_alive():
            raise LatencyProxyError(f"the proxy's thread did not end in {_THREAD_TIMEOUT_S} s")
        self._thread = None

    def cut(self) -> None:
        """Drop every current connection and reset new ones, until :meth:`restore`.

        New connections are accepted and reset at once rather than refused: the port stays the
        proxy's, so no other process can take it before :meth:`restore`. Returns once the
        current connections are closed.
        """
        self._call(self._cut_all())

    def restore(self) -> None:
        """Forward new connections again (those :meth:`cut` dropped stay dropped)."""
        self._call(self._set_cut(False))

    def url_for(self, url: str) -> str:
        """``url`` (postgresql://user@host:port/db?...) with the proxy's address instead."""
        if self.port is None:
            raise LatencyProxyError("url_for(): the proxy is not started")
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{self.host}:{self.port}"))

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            coroutine.close()  # never awaited: no "was never awaited" warning
            raise LatencyProxyError("the proxy is not running")
        asyncio.run_coroutine_threadsafe(coroutine, loop).result(_THREAD_TIMEOUT_S)

    # --- the proxy's own thread and loop -------------------------------------------------------

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # reported to start(), which waits for it
            self._start_error = error
        finally:
            self._loop = None
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._accept, self.host, 0)
        try:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stopping.wait()
        finally:
            server.close()
            await self._abort_all()
            await server.wait_closed()

    async def _set_cut(self, cut: bool) -> None:
        self._cut = cut

    async def _cut_all(self) -> None:
        self._cut = True
        await self._abort_all()

    async def _abort_all(self) -> None:
        for writers in self._connections.values():
            for writer in writers:
                writer.transport.abort()
        handlers = list(self._connections)
        if handlers:
            # Within the bound cut() waits for us, so that it reports our timeout, not its own.
            await asyncio.wait(handlers, timeout=_THREAD_TIMEOUT_S / 2)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        writers = [client_w]
        self._connections[task] = writers
        try:
            if self._cut:
                client_w.transport.abort()
                return
            try:
                upstream_r, upstream_w = await asyncio.wait_for(
                    asyncio.open_connection(self.target_host, self.target_port),
                    _CONNECT_TIMEOUT_S,
                )
            except (OSError, TimeoutError):
                # The target is down: its client sees the connection fail, as it would directly.
                client_w.transport.abort()
                return
            writers.append(upstream_w)
            if self._cut:  # cut() came while we connected
                for writer in writers:
                    writer.transport.abort()
                return
            await asyncio.gather(
                self._pipe(client_r, upstream_w, writers),
                self._pipe(upstream_r, client_w, writers),
            )
        finally:
            for writer in writers:
                writer.close()
            for writer in writers:
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            del self._connections[task]

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        both: list[asyncio.StreamWriter],
    ) -> None:
        """One direction: read chunks as they come, send each ``delay_s`` after it arrived."""
        queue: asyncio.Queue[_Item] = asyncio.Queue(_QUEUED_CHUNKS)
        receiving = asyncio.create_task(self._receive(reader, queue, both))
        try:
            await self._send(queue, writer)
        except OSError:
            # One side reset: so does the other, as a direct connection would.
            for each in both:
                each.transport.abort()
        finally:
            receiving.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await receiving

    async def _receive(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[_Item],
        both: list[asyncio.StreamWriter],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while chunk := await reader.read(_CHUNK):
                # delay_s is read per chunk, so a test may change it while connections run.
                await queue.put((loop.time() + self.delay_s, chunk))
        except OSError:
            # A reset: passed on at once, as the peer's kernel would discard unread data anyway.
            for each in both:
                each.transport.abort()
        await queue.put((loop.time() + self.delay_s, None))

    async def _send(self, queue: asyncio.Queue[_Item], writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, chunk = await queue.get()
            # A timer fires at most the clock's resolution early (1 ns here, far below a delay).
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if chunk is None:
                if writer.can_write_eof() and not writer.transport.is_closing():
                    writer.write_eof()  # half-close: the other direction may still carry data
                return
            writer.write(chunk)
            await writer.drain()
