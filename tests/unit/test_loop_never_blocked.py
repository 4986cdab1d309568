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
import time


async def test_blocks() -> None:
    time.sleep(0.12)  # a synchronous wait on the loop


async def test_yields() -> None:
    await asyncio.sleep(0.12)


def test_sync_tests_are_not_watched() -> None:
    time.sleep(0.06)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # The blocking test itself passes; the rule fails it at teardown, naming the callback.
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_blocks*",
            "*the event loop was blocked for more than 50 ms*held the loop*blocking waits*",
        ]
    )
