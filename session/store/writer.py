"""One writer thread per process: every store write leaves the event loop, in submission order.

A synchronous SQLite commit (``synchronous=FULL`` fsyncs the WAL) on the event loop stalls every
call of the process for as long as the disk takes. The writer owns a connection of its own and runs
jobs one at a time, first in, first out, so the durable path keeps its order: an event, then the
intent row it implies, then the next event. The caller gets a :class:`concurrent.futures.Future`
per job and acts on the world only once it resolves ("persist, then act", session/durable.py).

The queue is bounded: when the disk falls behind by :data:`MAX_PENDING` writes, ``submit`` blocks
its caller (backpressure) rather than letting memory grow without end.

Group commit: jobs that queued up while the last write ran go to a store that can batch
(``batch()``, SQLite) in one transaction, up to :data:`MAX_BATCH` of them, and their futures resolve
only once it committed. Many worker processes share one SQLite file, and every transaction takes
its single write lock and an fsync: under load the queue grows exactly when the lock is scarce
(measured: 200 talking calls on 50 workers timed writes out on "database is locked", and each such
call ended). A job's writes keep their own atomicity inside the batch; a COMMIT that fails fails
every job in it, which is what a write that never happened looks like to its caller.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from session.store import SessionStore, StoreError

log = logging.getLogger("voicegate.store")

T = TypeVar("T")
MAX_PENDING = 1024
MAX_BATCH = 64

_Job = tuple[Callable[[SessionStore], Any], "concurrent.futures.Future[Any]"]


class WriterClosed(StoreError):
    """A write submitted after :meth:`StoreWriter.close`: nothing was written."""


class StoreWriter:
    def __init__(
        self,
        open_store: Callable[[], SessionStore],
        *,
        max_pending: int = MAX_PENDING,
        max_batch: int = MAX_BATCH,
        name: str = "store-writer",
    ) -> None:
        """``max_batch``: the most jobs one transaction takes (1: none shared)."""
        self._max_batch = max_batch
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
        batch: Callable[[], AbstractContextManager[None]] | None = getattr(store, "batch", None)
        try:
            stopping = False
            while not stopping and (item := self._jobs.get()) is not None:
                items = [item]
                while batch is not None and len(items) < self._max_batch:
                    try:
                        more = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stopping = True
                        break
                    items.append(more)
                live = [(job, f) for job, f in items if f.set_running_or_notify_cancel()]
                if batch is not None and len(live) > 1:
                    _run_batch(store, batch, live)
                elif live:
                    job, future = live[0]
                    try:
                        future.set_result(job(store))
                    except BaseException as exc:
                        future.set_exception(exc)
        finally:
            store.close()


def _run_batch(
    store: SessionStore, batch: Callable[[], AbstractContextManager[None]], jobs: list[_Job]
) -> None:
    """Run ``jobs`` in one transaction; resolve their futures once it committed (or failed)."""
    outcomes: list[tuple[concurrent.futures.Future[Any], bool, Any]] = []
    try:
        with batch():
            for job, future in jobs:
                try:
                    outcomes.append((future, True, job(store)))
                except Exception as exc:
                    outcomes.append((future, False, exc))
    except BaseException as exc:
        # Nothing of the batch was written: a job that succeeded inside it did not happen.
        done = {id(f) for f, ok, _ in outcomes if not ok}
        for future, ok, value in outcomes:
            if not ok:
                future.set_exception(value)
        for _, future in jobs:
            if id(future) not in done:
                future.set_exception(exc)
        log.warning("store.batch_failed", extra={"jobs": len(jobs), "why": str(exc)})
        return
    for future, ok, value in outcomes:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
