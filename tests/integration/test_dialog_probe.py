"""The SIP thread's dialog probe against SIPp: an OPTIONS within the dialog (RFC 3261 section
11) per telephony.events.ProbeDialog, its final answer back as DialogProbed.

Drives telephony.endpoint.SipEndpoint alone (tests/integration/probes/dialog_probe.py, a process
of its own: pjsua2's Endpoint is a singleton), so it holds whatever the session does with the
answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.harness import ROOT, Sipp, free_port, rtp_range, wait_for
from tests.secret_audit import AUDIT


def _probe_run(
    scenario: str, tmp_path: Path, *, first_s: float, every_s: float, count: int
) -> tuple[Sipp, list[dict[str, Any]]]:
    port = free_port()
    rtp_min, rtp_max = rtp_range()
    out_path, err_path = tmp_path / "probe.out", tmp_path / "probe.err"
    AUDIT.keep_file(out_path, "dialog probe events")
    AUDIT.keep_file(err_path, "dialog probe log")
    with out_path.open("w") as out, err_path.open("w") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.probes.dialog_probe", str(port),
             str(rtp_min), str(rtp_max), str(first_s), str(every_s), str(count)],
            cwd=ROOT, stdout=out, stderr=err,
        )  # fmt: skip
    try:
        # TransportsUp: the SIP thread has bound its transports.
        wait_for(lambda: '"TransportsUp"' in out_path.read_text(), 15, "the SIP thread to start")
        sipp = Sipp(scenario, f"127.0.0.1:{port}", tmp_path, timeout_s=60).start()
        sipp.wait()
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, err_path.read_text()[-2000:]
    lines = out_path.read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return sipp, events


def test_a_481_is_reported_and_pjsua_ends_the_dialog_with_one_bye(tmp_path: Path) -> None:
    # RTP stops 7 s in; probes from 8 s, one a second. The scenario answers 481, takes PJSIP's
    # own BYE (Reason cause=481) within 1 s and fails on anything after it.
    sipp, events = _probe_run(
        "uac-media-gap-probe-481.xml", tmp_path, first_s=8, every_s=1, count=5
    )
    assert sipp.process is not None and sipp.process.returncode == 0, sipp.errors()
    probed = [e for e in events if e["type"] == "DialogProbed"]
    assert [(p["attempt"], p["status"], p["reason"]) for p in probed] == [
        (0, 481, "Call/Transaction Does Not Exist")
    ]
    (ended,) = [e for e in events if e["type"] == "CallEnded"]
    # pjsua reports the 481 before the call's end, and ends it itself (not a hang-up of ours).
    assert events.index(probed[0]) < events.index(ended)
    assert (ended["status"], ended["by"], ended["answered"]) == (481, "caller", True)
    # The probes submitted after the end were dropped without an answer.
    assert ended["at"] - probed[0]["at"] < 0.5


def test_probes_during_a_gap_are_answered_200_and_keep_the_dialog(tmp_path: Path) -> None:
    # A probe every 0.7 s through the whole call, pauses and the 5 s gap included: SIPp answers
    # each one 200 wherever its scenario is, and its call still ends with its own BYE.
    sipp, events = _probe_run(
        "uac-media-gap-short.xml", tmp_path, first_s=0.5, every_s=0.7, count=40
    )
    assert sipp.process is not None and sipp.process.returncode == 0, sipp.errors()
    probed = [e for e in events if e["type"] == "DialogProbed"]
    assert len(probed) >= 20
    assert [p["attempt"] for p in probed] == list(range(len(probed)))
    assert {(p["status"], p["reason"]) for p in probed} == {(200, "OK")}
    health = [(e["health"], e["at"]) for e in events if e["type"] == "MediaHealthChanged"]
    assert [h for h, _ in health] == ["interrupted", "flowing"]
    lost, back = health[0][1], health[1][1]
    assert any(lost < p["at"] < back for p in probed), "a probe went out during the gap"
    (ended,) = [e for e in events if e["type"] == "CallEnded"]
    assert (ended["status"], ended["by"]) == (200, "caller")
