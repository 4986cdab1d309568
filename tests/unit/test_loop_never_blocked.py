"""The suite's blocked-loop rule (tests/conftest.py) fails a test that holds its loop."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parents[1] / "conftest.py").read_text()


def test_a_callback_holding_the_loop_fails_its_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The copied conftest also runs the secret audit, which it imports from this repository.
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    pytester.makepyfile(
        test_inner="""
import asyncio
import os
import subprocess
import sys
import threading
import time


async def test_blocks() -> None:
    time.sleep(0.12)  # a synchronous wait on the loop


async def test_blocks_on_a_saturated_machine() -> None:
    # Twice as many spinning processes as CPUs: no CPU is idle while the loop's thread sleeps.
    spin = [sys.executable, "-c", "while True: pass"]
    hogs = [subprocess.Popen(spin) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        await asyncio.sleep(0.3)
        time.sleep(0.12)  # one long wait: the machine's wake-up latency does not explain it
        await asyncio.sleep(0)  # the hogs are reaped in a step of their own
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


async def test_yields() -> None:
    await asyncio.sleep(0.12)


def test_sync_tests_are_not_watched() -> None:
    time.sleep(0.06)


async def test_waits_for_the_gil_while_another_thread_runs_are_not_counted() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    other = threading.Thread(target=spin)
    other.start()
    try:
        # 40 ms of the loop's own CPU, taking turns with the spinning thread for the GIL:
        # well over 50 ms on the clock, every wait spent in the other thread.
        end = time.thread_time() + 0.04
        while time.thread_time() < end:
            pass
    finally:
        stop.set()
        other.join()
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # The blocking test itself passes; the rule fails it at teardown, naming the callback.
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_blocks *",
            "*the event loop was blocked for more than 50 ms*held the loop*blocking waits*",
            "*ERROR at teardown of test_blocks_on_a_saturated_machine*",
            "*the event loop was blocked for more than 50 ms*held the loop*blocking waits*",
        ]
    )
