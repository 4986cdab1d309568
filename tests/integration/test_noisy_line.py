"""A noisy line is not a caller talking (issue 21): SIPp says nothing for 20 s over noise 10 dB
under ordinary speech (sipp-scenarios/uac-noisy-caller.xml). The greeting and menu play whole, no
caller turn is started or committed, nothing is judged a barge-in, false or not, and the speaking
demo acts on nothing its recogniser may have made of the noise.

Two noises: the committed babble capture, and brown noise made here exactly as bench/bargein.py
makes its seed-21 noise-only case, in which pocketsphinx's endpointer heard "hang up" where the
session heard no turn (the call ended 6 s in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from audio.prompts import PromptLibrary, default_prompts_dir
from tests.fixtures.noise import COMMITTED_PCAP, write_rtp_pcap
from tests.fixtures.noisy_caller import Case, build
from tests.integration.harness import SCENARIOS, ServerFactory, Sipp, wait_for

SCENARIO = "uac-noisy-caller.xml"


def _brown_scenario(tmp_path: Path) -> str:
    case = Case("brown", 10, speech=False)
    build(case, 21, 10.0, 0)
    capture = tmp_path / "brown-10db-10s.pcap"
    write_rtp_pcap(capture, case.audio)
    text = (SCENARIOS / SCENARIO).read_text(encoding="iso-8859-1")
    played = f'play_pcap_audio="captures/{COMMITTED_PCAP.name}"'
    assert text.count(played) == 2, "the scenario plays its capture twice"
    scenario = tmp_path / "uac-noisy-caller-brown.xml"
    scenario.write_text(text.replace(played, f'play_pcap_audio="{capture}"'), encoding="iso-8859-1")
    return str(scenario)


@pytest.mark.parametrize("noise", ["babble", "brown"])
def test_noise_alone_keeps_the_greeting_whole_and_commits_no_turn(
    server_factory: ServerFactory, tmp_path: Path, noise: str
) -> None:
    assert COMMITTED_PCAP.exists(), "python -m tests.fixtures.noise writes it"
    scenario = SCENARIO if noise == "babble" else _brown_scenario(tmp_path)
    server = server_factory()
    sipp = Sipp(scenario, server.sip_target, tmp_path)
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
    # Whatever the recogniser made of the noise was logged and not acted on.
    said = [e["payload"] for e in events if e["type"] == "caller_said"]
    assert all(s["decision"] == "rejected" for s in said), said
    assert session["ended"].get("reason") != "caller chose to end the call", session["ended"]
    # The first response is the greeting, the menu and the speaking demo's hint of what to
    # say (agents/speaking_demo.py), heard to its last frame.
    prompts = PromptLibrary(default_prompts_dir())
    whole_ms = sum(len(prompts.get(name, 8000)) for name in ("greeting", "menu", "speech_hint")) / 8
    finished = [e for e in events if e["type"] == "response_finished"]
    assert finished, types
    assert abs(finished[0]["payload"]["heard_ms"] - whole_ms) <= 40, (finished[0], whole_ms)
    for outcome in ("confirmed", "false"):
        assert server.metric("voicegate_barge_ins_total", reason="speech", outcome=outcome) == 0
