from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from session.state import AWAY_STATUS
from tests.integration.harness import Server, ServerFactory

if shutil.which("sipp") is None:  # pragma: no cover - CI installs it
    raise pytest.UsageError("integration tests need SIPp: apt-get install sip-tester")


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start servers on free ports; every one still running is stopped (SIGTERM) at teardown."""
    started: list[Server] = []

    def start(name: str = "server", wait_ready: bool = True, **env: str) -> Server:
        server = Server(tmp_path / name, env_overrides=env)
        started.append(server)
        return server.start(wait_ready=wait_ready)

    yield start
    for server in started:
        server.stop()
    # The product's promise, checked after every test: no session is left without its one
    # terminal state once its server has shut down, but one that is away (transferred out, its
    # caller may come back with the handle: session/away.py), which the next reaper sweep of
    # any process sharing the store ends once the handle has expired.
    for server in started:
        on_postgres = "VOICEGATE_STORAGE_URL" in server.env_overrides
        if on_postgres or (server.data_dir / "voicegate.sqlite3").exists():
            left_open = [
                s
                for s in server.stored_sessions()
                if s["terminal_state"] is None and not s["status"].startswith(AWAY_STATUS)
            ]
            assert not left_open, f"sessions left non-terminal: {left_open}"


@pytest.fixture
def server(server_factory: ServerFactory) -> Server:
    return server_factory()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its crash-window figures to the controller (tests/conftest.py)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from tests.integration import test_crash_windows

        workeroutput["crash_windows"] = dict(test_crash_windows.SUMMARY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the crash-window suite's summary line when it ran in this process."""
    from tests.integration import test_crash_windows

    worker = hasattr(terminalreporter.config, "workerinput")
    if test_crash_windows.SUMMARY["windows"] and not worker:
        terminalreporter.write_line(test_crash_windows.pytest_report_crash_summary())
