"""Suite-wide rules: no test may block its event loop, and nothing voicegate wrote during the
run may hold a secret (the audit of tests/secret_audit.py, checked when the session ends).

voicegate runs every call of a process on one event loop, so a 50 ms stall there is 50 ms of late
audio decisions for all of them. Every coroutine test is watched: a callback (a task step, a
timer) that holds the loop for more than :data:`BLOCKED_S` fails the test that ran it, naming the
callback. "Holds" means the loop's thread spent that long in it running (CPU time) or waiting
(it blocked: a synchronous fsync, a sleep, a lock, a blocking socket). A callback that only took
long because the machine ran other processes meanwhile (involuntary preemption on a busy CI box)
is not the code's fault and is not counted, nor is a garbage-collection pass (its cost is the
whole test process's heap, hypothesis's included, not the callback's), nor a wait for the GIL
while other threads of the test process ran Python (they used the CPU time the loop's thread
waited; seen in CI: 162 ms, 0 ms of the loop's CPU, 33 waits of one 5 ms switch interval each)
or while one of them, holding the GIL, was preempted by the machine's other work (reproduced
with two busy loops and synchronous disk writes beside test_http_rules.py: 296 ms, 57 waits).
On a machine with no idle CPU (CI runs both xdist workers and their servers on two cores, and
/proc/stat showed 0 idle ticks over seconds of it) every wake-up of the loop's thread also waits
for a CPU; each of its waits is allowed :data:`WAKEUP_LATENCY_S` of that. Many short waits (a
burst of fsyncs, a GIL handed back and forth) are then not counted, while one long wait (a sleep,
a blocking socket, a lock) still is.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import re
import resource
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.pg_cluster import PgCluster, PgClusterError
from tests.secret_audit import (
    AUDIT,
    PRODUCT_LOGGERS,
    RecordingHandler,
    register_scenarios,
)

BLOCKED_S = 0.05
# What one wake-up of the loop's thread may wait for a CPU on a saturated machine: a few scheduler
# slices. Seen under two busy loops and synchronous disk writes: 206 ms over 18 waits, 5 ms of CPU.
WAKEUP_LATENCY_S = 0.012
_CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
try:  # kept open: a pread of it costs every watched callback about 10 us, an open 80
    _PROC_STAT: int | None = os.open("/proc/stat", os.O_RDONLY | os.O_CLOEXEC)
except OSError:
    _PROC_STAT = None


def _machine_idle_s() -> float | None:
    """CPU time all the machine's CPUs spent idle (iowait included: a CPU free to run a woken
    thread) since boot; steal is not idle. None where /proc/stat cannot be read."""
    if _PROC_STAT is None:
        return None
    fields = os.pread(_PROC_STAT, 256, 0).split(maxsplit=6)  # "cpu user nice system idle iowait"
    return (int(fields[4]) + int(fields[5])) * _CLOCK_TICK_S


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
            process0 = time.process_time()
            thread0 = resource.getrusage(resource.RUSAGE_THREAD)
            preempted0 = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
            idle0 = _machine_idle_s()
            try:
                run(handle)
            finally:
                collecting = watch.gc_s - gc0
                wall = time.perf_counter() - wall0 - collecting
                if wall > BLOCKED_S:
                    cpu = time.thread_time() - cpu0 - collecting
                    thread = resource.getrusage(resource.RUSAGE_THREAD)
                    waited = thread.ru_nvcsw - thread0.ru_nvcsw
                    # CPU the process's other threads used meanwhile: time the GIL was theirs.
                    others = time.process_time() - process0 - (cpu + collecting)
                    held_by_others = others >= 0.8 * (wall - cpu)
                    # Or another thread holding the GIL was itself preempted by the machine's
                    # other work: the loop's thread waited for it, using no CPU.
                    preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - preempted0
                    others_preempted = preempted - (thread.ru_nivcsw - thread0.ru_nivcsw) > 0
                    # Or the machine had no CPU free (less than half of one idle on average):
                    # each wake-up of the loop's thread queued for one.
                    idle1 = _machine_idle_s()
                    idle = None if idle0 is None or idle1 is None else idle1 - idle0
                    saturated = idle is not None and idle < 0.5 * wall
                    queued = waited * WAKEUP_LATENCY_S if saturated else 0.0
                    blocked = (
                        waited > 0
                        and not (held_by_others or others_preempted)
                        and wall - queued > BLOCKED_S
                    )
                    if cpu > BLOCKED_S or blocked:
                        machine = "?" if idle is None else f"{idle * 1000:.0f} ms"
                        watch.seen.append(
                            f"{handle!r} held the loop {wall * 1000:.0f} ms"
                            f" ({cpu * 1000:.0f} ms of CPU, {waited} blocking waits;"
                            f" the machine's CPUs idle {machine})"
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


# --- PostgreSQL: throw-away clusters (tests/pg_cluster.py) ----------------------------------------


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One real PostgreSQL server per test process (each xdist worker has its own), removed when
    the session ends. A test that needs it and cannot have it fails with the reason: skipping
    would pass a run that never tested the shared store."""
    cluster = PgCluster()
    failure = None
    try:
        cluster.start()
    except PgClusterError as error:
        failure = str(error)  # failed outside the handler: the reason alone, not two tracebacks
    if failure is not None:
        cluster.remove()
        pytest.fail(f"the throw-away PostgreSQL cluster did not start: {failure}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def pg_url(pg_cluster: PgCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a new, empty database of :func:`pg_cluster`, this test's alone, dropped after
    it (its sessions terminated first). Named after the test, to read the server's log by."""
    test = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    name = f"t_{test}_{uuid.uuid4().hex[:8]}"
    failure = None
    try:
        pg_cluster.create_database(name)
    except PgClusterError as error:
        failure = str(error)
    if failure is not None:
        pytest.fail(f"no database for the test in the PostgreSQL cluster: {failure}", pytrace=False)
    try:
        yield pg_cluster.url(name)
    finally:
        if not pg_cluster.running:
            # The test stopped or killed the shared server (an outage test that failed half-way):
            # bring it back for the tests after it.
            pg_cluster.restart()
        pg_cluster.drop_database(name)


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
    from tests.integration.harness import stop_every_sipp

    stop_every_sipp()  # those a failed test left running (tests/integration/harness.py)
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
