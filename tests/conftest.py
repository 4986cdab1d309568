"""Suite-wide rules: no test may block its event loop.

Every coroutine test runs with asyncio's debug mode and ``slow_callback_duration`` at
:data:`BLOCKED_S`; a callback that holds the loop longer (a synchronous fsync, a spin, a blocking
socket) fails the test that ran it, naming the callback. voicegate runs every call of a process
on one loop, so a 50 ms stall there is 50 ms of late audio decisions for all of them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator

import pytest

BLOCKED_S = 0.05


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # asyncio's debug mode: "Executing <Handle ...> took 0.123 seconds".
        if record.msg.startswith("Executing") if isinstance(record.msg, str) else False:
            self.seen.append(record.getMessage())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        names = getattr(item, "fixturenames", None)
        if function is not None and inspect.iscoroutinefunction(function) and names is not None:
            # The fixture closure is already computed here: join it directly, first, so that
            # the loop is watched from the test's first step.
            names.insert(0, "loop_never_blocked")


@pytest.fixture
async def loop_never_blocked() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = BLOCKED_S
    watcher = _SlowCallbacks()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(watcher)
    try:
        yield
    finally:
        asyncio_log.removeHandler(watcher)
    assert not watcher.seen, (
        f"the event loop was blocked for more than {BLOCKED_S * 1000:g} ms: "
        + ("; ".join(watcher.seen))
    )
