"""One writer thread per process: every store write leaves the event loop, in submission order.

A synchronous SQLite commit (``synchronous=FULL`` fsyncs the WAL) on the event loop stalls every
call of the process for as long as the disk takes. The writer owns a connection of its own and runs
jobs one at a time, first in, first out, so the durable path keeps its order: an event, then the
intent row it implies, then the next event. The caller gets a :class:`concurrent.futures.Future`
per job and acts on the world only once it resolves ("persist, then act", session/durable.py).

The queue is bounded: when the disk falls behind by :data:`MAX_PENDING` writes, ``submit`` blocks
its caller (backpressure) rather than letting memory grow without end.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from session.store import SessionStore, StoreError

log = logging.getLogger("voicegate.store")

T = TypeVar("T")
MAX_PENDING = 1024

_Job = tuple[Callable[[SessionStore], Any], "concurrent.futures.Future[Any]"]


class WriterClosed(StoreError):
    """A write submitted after :meth:`StoreWriter.close`: nothing was written."""


class StoreWriter:
    def __init__(
        self,
        open_store: Callable[[], SessionStore],
        *,
        max_pending: int = MAX_PENDING,
        name: str = "store-writer",
    ) -> None:
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=max_pending)
        self._closed = False
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(open_store,), name=name)
        self._thread.daemon = True  # a crash must not wait for it; close() drains it on shutdown
        self._thread.start()
        self._opened.wait()
        if self._open_error is not None:
            self._thread.join()
            raise self._open_error

    def submit(self, job: Callable[[SessionStore], T]) -> concurrent.futures.Future[T]:
        """Queue ``job(store)``; its result (or the exception it raised) comes in the future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._closed:
            future.set_exception(WriterClosed("the store writer is closed"))
            return future
        self._jobs.put((job, future))
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Block until every job submitted so far has run (for a fault injected after a write)."""
        if not self._closed:
            self.submit(lambda store: None).result(timeout)

    def close(self) -> None:
        """Run what is queued, then stop the thread and close its connection."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._thread.join()

    def _run(self, open_store: Callable[[], SessionStore]) -> None:
        try:
            store = open_store()
        except BaseException as exc:
            self._open_error = exc
            self._opened.set()
            return
        self._opened.set()
        try:
            while (item := self._jobs.get()) is not None:
                job, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(job(store))
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            store.close()
