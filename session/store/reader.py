"""Store reads off the event loop: a few threads, each with a store object of its own.

A read on the loop stalls every call of the process for a round trip: a millisecond on SQLite, a
network round trip on PostgreSQL, seconds when the database is away. API requests, the duplicate
check of a tool request and every other read go through here; writes go through the writer
(session/store/writer.py), whose single thread keeps their order. A read does not wait behind
the writer's queue, so a caller that must see its own pending write checks what it has in
flight as well (voicegate/tools/call_tools.py does).

A reader's stores do not wait for a database that is away: the read fails with
StoreUnavailable at once, and the API answers 503.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from session.store import SessionStore
from session.store.writer import WriterClosed

T = TypeVar("T")
THREADS = 2

_Job = tuple[Callable[[SessionStore], Any], "concurrent.futures.Future[Any]"]


class StoreReader:
    def __init__(
        self,
        open_store: Callable[[], SessionStore],
        *,
        threads: int = THREADS,
        name: str = "store-reader",
    ) -> None:
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, args=(open_store,), name=f"{name}-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Callable[[SessionStore], T]) -> concurrent.futures.Future[T]:
        """Run ``job(store)`` on a reader thread; its result (or exception) comes in the future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._closed:
            future.set_exception(WriterClosed("the store reader is closed"))
            return future
        self._jobs.put((job, future))
        return future

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()

    def _run(self, open_store: Callable[[], SessionStore]) -> None:
        store: SessionStore | None = None
        try:
            while (item := self._jobs.get()) is not None:
                job, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    # Opened on first use, and again after a failure to open: a database that
                    # was away at start-up is found once it answers.
                    if store is None:
                        store = open_store()
                    future.set_result(job(store))
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            if store is not None:
                store.close()
