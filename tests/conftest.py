"""Suite-wide rules: no test may block its event loop.

voicegate runs every call of a process on one event loop, so a 50 ms stall there is 50 ms of late
audio decisions for all of them. Every coroutine test is watched: a callback (a task step, a
timer) that holds the loop for more than :data:`BLOCKED_S` fails the test that ran it, naming the
callback. "Holds" means the loop's thread spent that long in it running (CPU time) or waiting
(it blocked: a synchronous fsync, a sleep, a lock, a blocking socket). A callback that only took
long because the machine ran other processes meanwhile (involuntary preemption on a busy CI box)
is not the code's fault and is not counted, nor is a garbage-collection pass (its cost is the
whole test process's heap, hypothesis's included, not the callback's).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest

BLOCKED_S = 0.05


class _LoopWatch:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.gc_s = 0.0  # time spent in garbage collection so far
        self._gc_started = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_started

    def timed(self, run: Any) -> Any:
        watch = self

        def _run(handle: asyncio.Handle) -> None:
            wall0, cpu0, gc0 = time.perf_counter(), time.thread_time(), watch.gc_s
            waits0 = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
            try:
                run(handle)
            finally:
                collecting = watch.gc_s - gc0
                wall = time.perf_counter() - wall0 - collecting
                if wall > BLOCKED_S:
                    cpu = time.thread_time() - cpu0 - collecting
                    waited = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - waits0
                    if cpu > BLOCKED_S or waited > 0:
                        watch.seen.append(
                            f"{handle!r} held the loop {wall * 1000:.0f} ms"
                            f" ({cpu * 1000:.0f} ms of CPU, {waited} blocking waits)"
                        )

        return _run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        names = getattr(item, "fixturenames", None)
        if function is not None and inspect.iscoroutinefunction(function) and names is not None:
            # The fixture closure is already computed here: join it directly, first, so that
            # the loop is watched from the test's first step.
            names.insert(0, "loop_never_blocked")


@pytest.fixture
def loop_never_blocked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    watch = _LoopWatch()
    monkeypatch.setattr(asyncio.Handle, "_run", watch.timed(asyncio.Handle._run))
    gc.callbacks.append(watch.on_gc)
    try:
        yield
    finally:
        gc.callbacks.remove(watch.on_gc)
    assert not watch.seen, (
        f"the event loop was blocked for more than {BLOCKED_S * 1000:g} ms: "
        + "; ".join(watch.seen)
    )
