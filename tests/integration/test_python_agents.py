"""Your own agent, loaded by import path (agent.kind = "python"): real SIPp callers, real RTP.

An agent that keeps streaming after the caller barged in writes to a dead response: nothing of
it reaches the caller (RTP captured), the chunks are counted, and every mark it placed ends
played or cleared. An agent that raises ends its call failed at stage agent, with the caller
told, and the server goes on.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.integration.harness import ROOT, Server, ServerFactory, Sipp, wait_for
from tests.integration.rtp_capture import Capture, barge_in

LOUD = 300.0  # RMS of a 20 ms A-law frame of agent audio (silence decodes to +-8)
VOICE = 60.0  # RMS from which the caller's capture counts as speech


def python_agent(factory: str) -> dict[str, str]:
    # The server runs from its data directory; the test agents live in this repository.
    return {
        "VOICEGATE_AGENT_KIND": "python",
        "VOICEGATE_AGENT_FACTORY": factory,
        "PYTHONPATH": str(ROOT),
    }


def agent_events(server: Server, event: str) -> list[dict[str, object]]:
    return [e for e in server.log_events() if e.get("event") == event]


def test_a_stream_that_goes_on_after_a_barge_in_never_reaches_the_caller(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**python_agent("tests.fixtures.agents:StreamingAgent"))
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        sipp = Sipp("uac-barge-in.xml", server.sip_target, tmp_path)
        assert sipp.run() == 0, sipp.errors()
    finally:
        packets = capture.stop()
    (session,) = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]] or None, 10, "the session to end"
    )
    captured = barge_in(packets, range(server.rtp_min, server.rtp_max + 1), loud=LOUD, voice=VOICE)
    sent, onset, cut = captured.sent, captured.onset, captured.cut
    assert [p for p in sent if p.at < onset and p.rms > LOUD], "the agent was streaming"
    # The agent's task kept sending for the rest of the call: none of it was ever heard.
    late = [p for p in sent if p.at > cut and p.rms > LOUD]
    assert late == [], f"{len(late)} loud frames after the cut at {cut:.3f}"

    cuts = [e for e in session["events"] if e["type"] == "response_interrupted"]
    assert len(cuts) == 1
    assert server.metric("voicegate_dead_response_frames_dropped_total", reason="interrupted") > 0
    (first_drop,) = agent_events(server, "test_agent.first_drop")
    assert first_drop["why"] == "interrupted"
    # Every mark it placed has exactly one outcome: played before the cut, cleared after.
    marks = agent_events(server, "test_agent.mark")
    assert Counter(str(m["mark"]) for m in marks).most_common(1)[0][1] == 1
    outcomes = [m["outcome"] for m in marks]
    assert "played" in outcomes and "cleared" in outcomes
    assert outcomes.index("cleared") > max(i for i, o in enumerate(outcomes) if o == "played")


def test_an_agent_that_raises_ends_its_call_failed_and_the_server_goes_on(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**python_agent("tests.fixtures.agents:FailingAgent"))
    # The caller presses 9; the agent raises; the server says so and sends the BYE.
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "first")
    assert sipp.run() == 0, sipp.errors()
    (ended,) = wait_for(lambda: [e for e in server.ended() if e] or None, 10, "the session to end")
    assert ended["terminal_state"] == "failed"
    assert ended["stage"] == "agent"
    assert ended["reason"] == "agent failed: on_dtmf raised RuntimeError"
    assert server.metric("voicegate_agent_failures_total", method="on_dtmf") == 1
    (session,) = server.sessions()
    says = [x for e in session["events"] for x in e["effects"] if x["kind"] == "say"]
    assert says and says[0]["prompt"] == "technical_problem", says
    # Only that call: the process takes the next one.
    again = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "second")
    assert again.run() == 0, again.errors()
    assert server.process is not None and server.process.poll() is None


def test_the_example_agent_in_the_readme_answers_a_call(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(**python_agent("examples.python_agent.keypad_agent:KeypadAgent"))
    # The caller presses 9: the example says goodbye and hangs up.
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    (ended,) = wait_for(lambda: [e for e in server.ended() if e] or None, 10, "the session to end")
    assert (ended["terminal_state"], ended["reason"]) == ("completed", "caller pressed 9")
    # Its one mark got one outcome: cleared if the caller's key cut the greeting, else played.
    (mark,) = agent_events(server, "example.mark")
    assert mark["outcome"] in ("played", "cleared")
