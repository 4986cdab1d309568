"""Seed 000's crash windows: the server dies at each one during a real payment call, restarts,
and the session ends with an outcome that matches the provider's ledger (or needs_human). The
ledger never shows two charges for one intent, and no session is left open.

The run prints one summary line: windows tried, charges, duplicates, sessions left open.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Provider, Server, Sipp
from voicegate.faults import EXIT_CODE

# The digits of uac-payment.xml are 2, 5, 9, #, 1: the fifth turn is the caller's confirmation.
WINDOWS = [
    ("before_turn_commit#5", False),
    ("after_turn_commit#5", False),
    ("before_intent_persist", False),
    ("after_intent_persist", False),
    ("before_request_send", False),
    ("after_request_send", None),  # the provider may or may not have the request yet
    ("after_provider_commit", True),
    ("before_receipt_persist", True),
    ("after_receipt_persist", True),
    ("during_playout", True),
]

SUMMARY: dict[str, Any] = {"windows": 0, "charges": 0, "duplicates": 0, "left_open": 0}


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    p = Provider(tmp_path_factory.mktemp("provider")).start()
    yield p
    p.stop()


def pytest_report_crash_summary() -> str:
    return (
        f"crash windows: {SUMMARY['windows']} tried, {SUMMARY['charges']} charges, "
        f"{SUMMARY['duplicates']} duplicate charges, {SUMMARY['left_open']} sessions left open"
    )


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
@pytest.mark.parametrize(("window", "charged"), WINDOWS, ids=[w for w, _ in WINDOWS])
def test_crash_window(
    window: str,
    charged: bool | None,
    store: str,
    provider: Provider,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    before = {row["key"] for row in provider.ledger()}
    # Callbacks off: the restart then finalises the session at once, as the windows check. With
    # them on, a caller cut off mid-payment is parked for a callback instead (test_cluster.py).
    env = {
        **provider.tool_env(),
        "VOICEGATE_FAULTS_CRASH_AT": window,
        "VOICEGATE_SESSION_CALLBACK_WINDOW_S": "0",
    }
    if store == "postgresql":
        # The same windows on the shared store: its commits are as durable before acting.
        env["VOICEGATE_STORAGE_URL"] = request.getfixturevalue("pg_url")
    server = Server(tmp_path / "server", env_overrides=env).start()
    sipp = Sipp("uac-payment.xml", server.sip_target, tmp_path / "sipp", timeout_s=40).start()
    try:
        code = server.wait_exit(40)
    finally:
        sipp.kill()
    assert code == EXIT_CODE, f"server exited {code}, not at {window}:\n{server.log()[-2000:]}"

    # Restart the same worker without the fault: it settles and finalises what it left open.
    server.env_overrides.pop("VOICEGATE_FAULTS_CRASH_AT")
    server.start()
    try:
        (session,) = server.sessions()
        events = [e["type"] for e in session["events"]]
        ended = session["ended"]
        new_rows = [row for row in provider.ledger() if row["key"] not in before]
        charges = [row for row in new_rows if row["status"] == "committed"]
        keys = [row["key"] for row in charges]
        SUMMARY["windows"] += 1
        SUMMARY["charges"] += len(charges)
        SUMMARY["duplicates"] += len(keys) - len(set(keys))
        SUMMARY["left_open"] += ended is None

        assert ended is not None, session["status"]
        assert len(charges) <= 1, new_rows  # never two charges for one intent
        if charged is not None:
            assert len(charges) == int(charged), (window, new_rows, events)
        receipts = [e["payload"] for e in session["events"] if e["type"] == "tool_receipt"]
        if charges:
            # The session's recorded outcome matches the ledger.
            assert [r["outcome"] for r in receipts] == ["committed"], events
            assert receipts[0]["key"] == charges[0]["key"]
        elif "tool_intent" in events:
            assert [r["outcome"] for r in receipts] in (["not_started"], ["unknown"]), events
        else:
            assert receipts == []
        if any(r["outcome"] == "unknown" for r in receipts):
            assert ended["terminal_state"] == "needs_human"
        else:
            assert (ended["terminal_state"], ended["stage"]) == ("failed", "process"), ended
        # Nothing ran after the restart but reconciliation and the reaper: no response audio.
        after_restart = events[events.index("owner_lost") :] if "owner_lost" in events else []
        assert not {"response_started", "tool_request_sent", "tool_intent"} & set(after_restart)
        # Every intent has its receipt now, unless the outcome is unknown (needs_human).
        if ended["terminal_state"] != "needs_human":
            assert session["outstanding_intents"] == []
    finally:
        assert server.stop() == 0
        assert server.process is not None and server.process.returncode != -signal.SIGKILL
