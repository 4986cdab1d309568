"""Suite-wide rules: no test may block its event loop, and nothing voicegate wrote during the
run may hold a secret (the audit of tests/secret_audit.py, checked when the session ends).

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
import logging
import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.secret_audit import (
    AUDIT,
    PRODUCT_LOGGERS,
    Finding,
    RecordingHandler,
    register_scenarios,
)

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


# --- the secret audit (tests/secret_audit.py) -----------------------------------------------------

_audit_handler: RecordingHandler | None = None
_audit_findings: list[Finding] = []


def pytest_configure(config: pytest.Config) -> None:
    global _audit_handler
    register_scenarios(AUDIT)
    _audit_handler = RecordingHandler(AUDIT)
    for name in PRODUCT_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(_audit_handler)
        # Debug records too: a digit logged "only at debug" is still written by whoever runs
        # at debug (the integration servers do). Loggers a test set explicitly keep their level.
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.DEBUG)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _audit_handler is not None:
        _audit_handler.test = item.nodeid


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if anything the tests made voicegate write holds a secret (issue 17)."""
    if _audit_handler is not None:
        for name in PRODUCT_LOGGERS:
            logging.getLogger(name).removeHandler(_audit_handler)
    _audit_findings[:] = AUDIT.scan()
    if _audit_findings:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    audited = len(AUDIT.files) + len(AUDIT.texts) + len(AUDIT.latest)
    if not _audit_findings:
        terminalreporter.write_line(
            f"secret audit: {audited} outputs clean of {len(AUDIT.secrets)} registered secrets"
        )
        return
    terminalreporter.section("secret audit: LEAKS FOUND", sep="=", red=True, bold=True)
    shown = _audit_findings[:50]
    for finding in shown:
        terminalreporter.write_line(str(finding), red=True)
    if len(_audit_findings) > len(shown):
        terminalreporter.write_line(f"... and {len(_audit_findings) - len(shown)} more")
