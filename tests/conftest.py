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
_audit_findings: list[str] = []
_audited = [0]  # outputs scanned, over every xdist worker
_secrets = [0]  # secrets registered (the largest count any worker saw)


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
    _audit_findings.extend(str(finding) for finding in AUDIT.scan())
    _audited[0] += len(AUDIT.files) + len(AUDIT.texts) + len(AUDIT.latest)
    _secrets[0] = max(_secrets[0], len(AUDIT.secrets))
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        # An xdist worker: its findings travel to the controller, which fails the run.
        workeroutput["secret_audit"] = (list(_audit_findings), _audited[0], _secrets[0])
    elif _audit_findings:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: gather each worker's audit (the workers scanned what they ran)."""
    findings, audited, secrets = node.workeroutput.get("secret_audit", ([], 0, 0))
    _audit_findings.extend(findings)
    _audited[0] += audited
    _secrets[0] = max(_secrets[0], secrets)
    crash_windows = node.workeroutput.get("crash_windows")
    if crash_windows and crash_windows["windows"]:
        _crash_windows.append(crash_windows)


_crash_windows: list[dict[str, int]] = []  # each xdist worker's crash-window figures


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _crash_windows:
        from tests.integration import test_crash_windows

        for figures in _crash_windows:
            for key, value in figures.items():
                test_crash_windows.SUMMARY[key] += value
        terminalreporter.write_line(test_crash_windows.pytest_report_crash_summary())
    if not _audit_findings:
        terminalreporter.write_line(
            f"secret audit: {_audited[0]} outputs clean of {_secrets[0]} registered secrets"
        )
        return
    terminalreporter.section("secret audit: LEAKS FOUND", sep="=", red=True, bold=True)
    shown = _audit_findings[:50]
    for finding in shown:
        terminalreporter.write_line(finding, red=True)
    if len(_audit_findings) > len(shown):
        terminalreporter.write_line(f"... and {len(_audit_findings) - len(shown)} more")
