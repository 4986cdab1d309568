"""GET /status in a real headless Chromium against a running pool: it renders, shows a live SIPp
call with its dimensions and the pool's workers, and shows the call gone once it has ended; and
against one process, a transfer in progress under "Transfers", never under "Recoveries"."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import LOOPBACK, Server, ServerFactory, Sipp, free_port, wait_for
from tests.operability.peers import WORKERS, start_pool
from voicegate.control.status_page import PAGE

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:  # pragma: no cover - scripts/bootstrap installs it
    raise pytest.UsageError("the status page test needs Chromium: apt-get install chromium")


def chromium(url: str, profile: Path, *args: str) -> str:
    """Load ``url`` headless and return what Chromium printed (with --dump-dom, the DOM).

    The virtual time budget lets the page's fetches and first refresh finish before the dump:
    Chromium advances its clock only when nothing is pending, so the page is the one a person
    would see after it settled, whatever the machine's load.
    """
    assert CHROMIUM is not None
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # the suite may run as root, where the sandbox cannot start
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--window-size=1400,900",
            "--virtual-time-budget=5000",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def table(dom: str, table_id: str) -> list[list[str]]:
    """The rows of one table's body, as the text of each cell."""
    match = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert match, f"no table {table_id} in:\n{dom[:2000]}"
    rows = re.findall(r"<tr>(.*?)</tr>", match.group(1), re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in row] for row in cells]


def status_dom(pool: Server, profile: Path) -> str:
    dom = chromium(f"http://127.0.0.1:{pool.http_port}/status", profile, "--dump-dom")
    assert 'id="updated">updated ' in dom, "the page never completed a refresh"
    assert '<div id="error" hidden' in dom, dom
    return dom


def test_the_page_is_self_contained() -> None:
    # No build step, no CDN: nothing is loaded from anywhere but the page's own origin.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", PAGE)
    assert "http://" not in PAGE and "https://" not in PAGE


def test_the_status_page_shows_a_live_call_and_then_its_end(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    pool = start_pool(server_factory)
    profile = tmp_path / "chromium-profile"
    caller = Sipp("uac-wait-for-bye.xml", pool.sip_target, tmp_path / "held").start()
    try:
        (call,) = wait_for(
            lambda: [c for c in pool.live_calls() if c["state"] == "answered"],
            15,
            "an answered call",
        )
        dom = status_dom(pool, profile)
        rows = table(dom, "calls")
        (row,) = [r for r in rows if r[0] == call["call_id"]]
        assert row[1] == call["worker"] and row[2] == "answered"
        status, session = pool.http(f"/v1/sessions/{call['call_id']}")
        assert status == 200
        # The dimensions shown are the session's (signaling, media, agent link, gate).
        dims = session["dimensions"]
        assert row[6:10] == [dims["signaling"], dims["media"], dims["agent_link"], dims["gate"]]
        assert row[6] == "up"
        workers = table(dom, "workers")
        assert len(workers) == WORKERS and {w[1] for w in workers} == {"ready"}
        assert '<section id="pool">' in dom  # shown: this is a pool
        screenshot = tmp_path / "status.png"
        chromium(
            f"http://127.0.0.1:{pool.http_port}/status",
            profile,
            f"--screenshot={screenshot}",
        )
        assert screenshot.stat().st_size > 0
        print(f"\nstatus page screenshot (a live call): {screenshot}")
        assert pool.post(f"/v1/calls/{call['call_id']}/hangup") == 202
        assert caller.wait() == 0, caller.errors()
    finally:
        caller.kill()
    wait_for(lambda: not pool.live_calls(), 15, "the call gone from /v1/calls")
    rows = table(status_dom(pool, profile), "calls")
    assert rows == [["no live calls"]]


def test_a_transfer_in_progress_is_shown_as_a_transfer_not_a_recovery(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    # A bridge to a desk that rings and never answers: the transfer stays in its first stage
    # while the page is read (its guard is 60 s away).
    port = free_port()
    desk = Sipp("uas-no-answer.xml", "", tmp_path / "desk", port=port).start()
    server = server_factory(VOICEGATE_TRANSFER_ALLOWED_TARGETS="sip:desk@127.0.0.1:*")
    caller = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path / "caller").start()
    try:
        (call,) = wait_for(
            lambda: [c for c in server.live_calls() if c["state"] == "answered"],
            15,
            "an answered call",
        )
        call_id = call["call_id"]
        status, body = server.post_json(
            f"/v1/calls/{call_id}/transfer",
            {"target": f"sip:desk@{LOOPBACK}:{port}", "mode": "bridge"},
        )
        assert status == 202, body
        dom = status_dom(server, tmp_path / "chromium-profile")
        (row,) = table(dom, "transfers")
        assert row[:2] == [call_id, "transferring (bridge, calling)"], row
        assert table(dom, "recoveries") == [["no recovery in progress"]]
        assert pool_hidden(dom)
        # An operator hangs up while the desk rings: the desk's leg is cancelled, and the
        # transfer is timed as one the session's ending cut short.
        assert server.post(f"/v1/calls/{call_id}/hangup") == 202
        assert caller.wait() == 0, caller.errors()
        assert desk.wait() == 0, desk.errors()  # CANCEL, 200, 487, ACK
    finally:
        caller.kill()
        desk.kill()
    timed = server.metric(
        "voicegate_transfer_duration_seconds_count", mode="bridge", outcome="ended"
    )
    assert timed == 1, server.log()[-3000:]


def pool_hidden(dom: str) -> bool:
    return '<section id="pool" hidden' in dom
