"""What voicegate relies on in pjsua2's threads, each probed in a process of its own (pjsua2's
Endpoint is a singleton):

- the media clock thread keeps one Python thread state (telephony.thread_state): two media ports on
  the null sound device, three times over, the idle device closed in between so that each run has
  a new clock thread;
- the SIP thread's blocking ``libHandleEvents`` returns when SipWaker pokes the UDP transport, and
  PJSIP answers nothing (telephony.sip_wake).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.integration.harness import ROOT, free_port

PROBES = ROOT / "tests" / "integration" / "probes"


def probe(name: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(PROBES / name), *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("{")][-1]
    return dict(json.loads(line))


def test_pinned_callbacks_keep_their_thread_state_and_ended_threads_are_freed() -> None:
    seen = probe("clock_thread_states.py", "pin")
    runs = seen["runs"]
    assert len({run["threads"] for run in runs}) == 3, "each run had a clock thread of its own"
    for run in runs:
        assert run["callbacks"] >= 20
        # Only the first callback of a run, before its pin, finds the thread-local unset.
        assert run["kept"] == run["callbacks"] - 1, run
    assert seen["pinned"] == 1  # the last clock thread's state
    assert seen["freed"] == 2  # the two earlier ones, once their threads had ended


def test_without_pinning_swig_rebuilds_the_state_for_every_callback() -> None:
    # The control: what pinning saves (a new state, and a new frame stack, per callback).
    seen = probe("clock_thread_states.py", "nopin")
    for run in seen["runs"]:
        assert run["callbacks"] >= 20
        assert run["kept"] == 0, run


def test_a_keepalive_wakes_the_sip_thread_and_gets_no_answer() -> None:
    seen = probe("sip_wake.py", str(free_port()))
    # Each wait was cut short by the poke at 0.3 s, far from the 5 s it would otherwise block.
    assert all(wait < 2.5 for wait in seen["waits"]), seen["waits"]
    assert seen["unpoked"] >= 1.0  # without one, the same call blocks
    assert seen["reply"] is None
