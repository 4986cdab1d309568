"""A noisy line is not a caller talking (issue 21): SIPp says nothing for 20 s over babble 10 dB
under ordinary speech (sipp-scenarios/uac-noisy-caller.xml). The greeting and menu play whole, no
caller turn is started or committed, and nothing is judged a barge-in, false or not."""

from __future__ import annotations

from pathlib import Path

from audio.prompts import PromptLibrary, default_prompts_dir
from tests.fixtures.noise import COMMITTED_PCAP
from tests.integration.harness import ServerFactory, Sipp, wait_for


def test_noise_alone_keeps_the_greeting_whole_and_commits_no_turn(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    assert COMMITTED_PCAP.exists(), "python -m tests.fixtures.noise writes it"
    server = server_factory()
    sipp = Sipp("uac-noisy-caller.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    (session,) = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]] or None, 10, "the session to end"
    )
    assert session["ended"]["terminal_state"] == "completed"
    events = session["events"]
    types = [e["type"] for e in events]
    assert "turn_started" not in types and "turn_committed" not in types, types
    assert "response_interrupted" not in types, types
    assert "barge_in_judged" not in types, types
    # The first response is the greeting, the menu and the speaking demo's hint of what to
    # say (agents/speaking_demo.py), heard to its last frame.
    prompts = PromptLibrary(default_prompts_dir())
    whole_ms = sum(len(prompts.get(name, 8000)) for name in ("greeting", "menu", "speech_hint")) / 8
    finished = [e for e in events if e["type"] == "response_finished"]
    assert finished, types
    assert abs(finished[0]["payload"]["heard_ms"] - whole_ms) <= 40, (finished[0], whole_ms)
    for outcome in ("confirmed", "false"):
        assert server.metric("voicegate_barge_ins_total", reason="speech", outcome=outcome) == 0
