"""A remote agent over the WebSocket protocol (agent.kind = "remote", docs/agent-protocol.md).

Real peers: the example agent (examples/remote_agent/) as its own process, a voicegate server
subprocess, SIPp callers, RTP captured on loopback, the reference payment provider. The link is
dropped by the agent's ``POST /admin/drop`` or by killing the agent process.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import (
    LOOPBACK,
    ROOT,
    Provider,
    Server,
    ServerFactory,
    Sipp,
    free_port,
    wait_for,
)
from tests.integration.resume_handles import away_session
from tests.integration.rtp_capture import Capture, RtpPacket
from tests.secret_audit import AUDIT

SECRET = "example-agent-secret-0123456789"


@dataclass
class ExampleAgent:
    """``python -m examples.remote_agent`` on a free loopback port."""

    data_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    tls: tuple[Path, Path] | None = None  # (certificate chain, key): serve wss://

    def start(self) -> ExampleAgent:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(udp_and_tcp=False)
        env = {
            **os.environ,
            "REMOTE_AGENT_SECRET": SECRET,
            "REMOTE_AGENT_URL": self.url,
            "PYTHONPATH": str(ROOT),
        }
        args = [sys.executable, "-m", "examples.remote_agent", "--port", str(self.port)]
        if self.tls is not None:
            args += ["--cert", str(self.tls[0]), "--key", str(self.tls[1])]
        with open(self.data_dir / "agent.log", "ab") as log:
            self.process = subprocess.Popen(
                args,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=ROOT,
                env=env,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        assert "listening on" in line, f"the example agent did not start: {line!r}"
        return self

    @property
    def url(self) -> str:
        return f"{'wss' if self.tls else 'ws'}://{LOOPBACK}:{self.port}/agent"

    def env(self, deadline_s: float = 3.0) -> dict[str, str]:
        return {
            "VOICEGATE_AGENT_KIND": "remote",
            "VOICEGATE_AGENT_URL": self.url,
            "VOICEGATE_AGENT_SECRET": SECRET,
            "VOICEGATE_AGENT_RECONNECT_DEADLINE_S": str(deadline_s),
        }

    def drop(self, keep_streaming: bool = False, down_s: float = 0.0) -> int:
        query = f"?keep_streaming={int(keep_streaming)}&down_s={down_s}"
        request = urllib.request.Request(
            f"http://{LOOPBACK}:{self.port}/admin/drop{query}", data=b"", method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(json.loads(response.read())["dropped"])

    def drop_after_tool_call(self, down_s: float = 0.0) -> None:
        """Arm the agent: its next tool.call is sent and its link dropped at once."""
        request = urllib.request.Request(
            f"http://{LOOPBACK}:{self.port}/admin/drop?after_tool_call=1&down_s={down_s}",
            data=b"",
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.loads(response.read())["armed"] is True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[ExampleAgent]:
    example = ExampleAgent(tmp_path / "agent").start()
    try:
        yield example
    finally:
        example.stop()


def log_events(server: Server, event: str) -> list[dict[str, Any]]:
    return [e for e in server.log_events() if e.get("event") == event]


def ended(server: Server) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: next((e for e in server.ended() if e), None), 15, "the session to end"
    )
    return found


def test_the_example_agent_answers_a_call_and_the_session_completes(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    server = server_factory(**agent.env())
    # The caller presses 9: the agent says goodbye and asks voicegate to hang up.
    sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path)
    assert sipp.run() == 0, sipp.errors()
    end = ended(server)
    assert (end["terminal_state"], end["reason"]) == ("completed", "caller pressed 9")
    assert server.metric("voicegate_agent_protocol_errors_total", kind="schema") == 0
    assert [e["new"] for e in log_events(server, "agent_link.state")][:1] == ["open"]


def agent_log(agent: ExampleAgent) -> str:
    return (agent.data_dir / "agent.log").read_text(errors="replace")


def agent_told(agent: ExampleAgent) -> list[dict[str, Any]]:
    """The call-state messages the example agent received (it logs those whole)."""
    found = []
    for line in agent_log(agent).splitlines():
        _, _, rest = line.partition(" {")
        if rest:
            found.append(json.loads("{" + rest))
    return found


def session_events(server: Server) -> list[dict[str, Any]]:
    sessions = server.sessions()
    assert len(sessions) <= 1
    events: list[dict[str, Any]] = sessions[0]["events"] if sessions else []
    return events


def tone(packet: RtpPacket) -> bool:
    """A frame of the example's 1 kHz tone (speech prompts never concentrate like this)."""
    return packet.rms > 300 and abs(packet.peak_hz - 1000) <= 50 and packet.peak_share > 0.6


def test_a_link_dropped_during_a_response_never_lets_the_old_response_reach_the_caller(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    server = server_factory(**agent.env())
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        sipp = Sipp("uac-remote-tone.xml", server.sip_target, tmp_path).start()
        # The caller pressed 5: the agent streams its tone; a second of it has been sent.
        wait_for(lambda: "a2: 1000 ms sent" in agent_log(agent), 15, "the tone to stream")
        dropped_at = time.time()
        # The agent goes on streaming the cut response after the resume: voicegate drops it.
        assert agent.drop(keep_streaming=True) == 1
        assert sipp.wait() == 0, sipp.errors()
    finally:
        packets = capture.stop()
    end = ended(server)
    assert (end["terminal_state"], end["reason"]) == ("completed", "caller pressed 9")
    ports = range(server.rtp_min, server.rtp_max + 1)
    sent = [p for p in packets if p.src_port in ports and p.payload_type == 8]
    assert [p for p in sent if p.at < dropped_at and tone(p)], "the tone was playing"
    # The cut: the first frame after the drop that is not the tone. None of it after that.
    cut = next(p.at for p in sent if p.at >= dropped_at and not tone(p))
    late = [p for p in sent if p.at > cut and tone(p)]
    assert late == [], f"{len(late)} frames of the cut response after {cut:.3f}"

    types = [e["type"] for e in session_events(server)]
    assert types.count("agent_link_lost") == 1 and types.count("agent_link_restored") == 1
    assert server.metric("voicegate_agent_link_resumes_total", result="resumed") == 1
    # The agent did keep streaming: its chunks were dropped, counted, never played.
    assert server.metric("voicegate_agent_chunks_dropped_total", reason="dead_response") > 0

    # The agent was told what the drop did, once the link was back (replayed): the tone was
    # cleared by the session (not barged into) after what the caller had heard of it, and the
    # gate froze for the link and opened again.
    told = agent_told(agent)
    (cleared,) = [m for m in told if m["type"] == "playback.cleared"]
    assert (cleared["response_id"], cleared["reason"]) == ("a2", "agent_link")
    # heard_ms is what left in RTP: the tone's frames before the cut, 20 ms each.
    heard_on_wire = 20 * len([p for p in sent if p.at < cut and tone(p)])
    assert abs(cleared["heard_ms"] - heard_on_wire) <= 100, (cleared, heard_on_wire)
    assert cleared["generation"] >= 1
    # The key 5 had cut the greeting: that one was the caller's doing.
    interrupted = [m for m in told if m["type"] == "playback.interrupted"]
    assert [(m["response_id"], m["reason"]) for m in interrupted] == [("a1", "barge_in")]
    gates = [(m["previous"], m["state"], m["reason"]) for m in told if m["type"] == "gate"]
    assert gates == [
        ("open", "frozen", "agent_link"),
        ("frozen", "open", "recovered"),
        ("open", "closed", "caller pressed 9"),  # the session ends: nothing runs any more
    ]


def hold(packet: RtpPacket) -> bool:
    """A frame of voicegate's hold pulse (voicegate/call/hold.py): soft, 440 Hz."""
    return 50 < packet.rms < 600 and abs(packet.peak_hz - 440) <= 60 and packet.peak_share > 0.6


def test_a_link_down_for_seconds_gives_silence_then_the_honest_line_then_hold_audio(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    # Seed 004's ladder: under about 2 s nothing; then "one moment, I am reconnecting" and a
    # quiet pulse until the link is back; then the pulse stops and the call goes on.
    server = server_factory(**agent.env(deadline_s=8.0))
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
        wait_for(lambda: log_events(server, "agent_link.state"), 15, "the link to open")
        dropped_at = time.time()
        assert agent.drop(down_s=6.0) == 1  # the agent refuses sockets for 6 s
        wait_for(lambda: log_events(server, "agent_link.resumed"), 10, "the resume")
        resumed_seen = time.time()  # at or after the resume
        time.sleep(1.0)  # the call goes on with its agent for a second (nothing to poll)
        killed_at = time.time()
        agent.kill()  # and now for good: the call ends as configured
        assert sipp.wait() == 0, sipp.errors()
    finally:
        packets = capture.stop()
    end = ended(server)
    assert (end["terminal_state"], end["stage"]) == ("failed", "agent_link")
    assert resumed_seen - dropped_at > 5.5
    ports = range(server.rtp_min, server.rtp_max + 1)
    sent = [p for p in packets if p.src_port in ports and p.payload_type == 8]
    # Under two seconds: silence (session.honesty_after_s = 2 s from the loss); the greeting
    # was cut at the drop.
    quiet = [p for p in sent if dropped_at + 0.15 < p.at < dropped_at + 1.8]
    loud = [(round(p.at - dropped_at, 3), round(p.rms)) for p in quiet if p.rms >= 50]
    assert quiet and not loud, f"heard in the first 2 s (s after the drop, rms): {loud}"
    # Then the honest line (speech: loud, no single tone), then the pulse until the resume.
    line = [
        p for p in sent if dropped_at + 1.8 <= p.at < resumed_seen and p.rms > 300 and not hold(p)
    ]
    assert line, "no honest line"
    pulses = [p for p in sent if line[0].at < p.at < resumed_seen and hold(p)]
    assert len(pulses) >= 10, f"{len(pulses)} frames of hold audio after the line"
    assert pulses[0].at > line[-1].at, "the pulse started before the line ended"
    # Once the link is back the pulse stops (it is fed 200 ms at a time), until the next loss.
    late = [p for p in sent if resumed_seen + 0.5 < p.at < killed_at + 1.8 and hold(p)]
    assert late == [], f"{len(late)} frames of hold audio after the resume"


def test_a_link_dropped_during_a_tool_call_resumes_with_exactly_one_execution(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    provider = Provider(tmp_path / "provider").start()
    try:
        provider.set_faults(charge_delay_s=1.5)  # the charge is in flight for a while
        server = server_factory(
            **agent.env(),
            **provider.tool_env(timeout_s=5.0),
            VOICEGATE_TOOL_CHARGE_APPROVAL="none",
        )
        sipp = Sipp("uac-remote-pay.xml", server.sip_target, tmp_path).start()
        wait_for(
            lambda: "tool_request_sent" in [e["type"] for e in session_events(server)],
            15,
            "the charge request to be on the wire",
        )
        assert agent.drop() == 1
        assert sipp.wait() == 0, sipp.errors()
        end = ended(server)
        assert (end["terminal_state"], end["reason"]) == ("completed", "caller pressed 9")
        # One charge at the provider, whatever the agent asked again after its resume.
        assert len(provider.charges()) == 1
    finally:
        provider.stop()
    events = session_events(server)
    assert [e["type"] for e in events].count("tool_request_sent") == 1
    receipts = [e for e in events if e["type"] == "tool_receipt"]
    assert [r["payload"]["outcome"] for r in receipts] == ["committed"], receipts
    assert server.metric("voicegate_agent_link_resumes_total", result="resumed") == 1
    # After its resume the agent asked again with the same call_id (it had no result yet):
    # answered "pending" from voicegate's record, never sent to the provider again.
    assert server.metric("voicegate_tool_duplicates_prevented_total", tool="charge") == 1
    # pending (the duplicate), then committed
    assert [r["outcome"] for r in _tool_results(agent)] == ["pending", "committed"]


def _tool_results(agent: ExampleAgent) -> list[dict[str, Any]]:
    return [m for m in agent_told(agent) if m.get("type") == "tool.result"]


def test_a_link_dropped_right_after_a_tool_call_holds_it_then_sends_it_once(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    """The tool.call arrives with the gate open; the link drops at once, before the request
    can leave: the intent is held (never sent while the gate is frozen, never asked about), and
    sent once, with its key, when the link is back (docs/agent-protocol.md, "Tool calls")."""
    provider = Provider(tmp_path / "provider").start()
    try:
        server = server_factory(
            **agent.env(deadline_s=10.0),
            **provider.tool_env(timeout_s=5.0),
            VOICEGATE_TOOL_CHARGE_APPROVAL="none",
        )
        agent.drop_after_tool_call()
        sipp = Sipp("uac-remote-pay.xml", server.sip_target, tmp_path).start()
        assert sipp.wait() == 0, sipp.errors()
        end = ended(server)
        assert (end["terminal_state"], end["reason"]) == ("completed", "caller pressed 9")
        assert len(provider.charges()) == 1, provider.ledger()
    finally:
        provider.stop()
    events = session_events(server)
    types = [e["type"] for e in events]
    assert "admin.drop_after_tool_call pay-1" in agent_log(agent)
    # Admitted before the link was lost, sent after it came back, once. (When the loss came
    # after tool_request_sent was logged but before its HTTP began, the log says so with
    # tool_request_withheld: held again, then sent; still one request.)
    assert types.index("tool_intent") < types.index("agent_link_lost")
    last_sent = len(types) - 1 - types[::-1].index("tool_request_sent")
    assert types.index("agent_link_lost") < last_sent
    assert types.count("tool_request_sent") - types.count("tool_request_withheld") == 1
    lost = next(e for e in events if e["type"] == "agent_link_lost")
    assert {"kind": "gate_changed", "old": "open", "new": "frozen", "frozen_s": 0.0} in lost[
        "effects"
    ]
    receipts = [e["payload"] for e in events if e["type"] == "tool_receipt"]
    assert [r["outcome"] for r in receipts] == ["committed"], receipts
    # The agent hears one definitive result (a "pending" for its own re-ask after the resume
    # is not one), committed.
    final = [r for r in _tool_results(agent) if r["outcome"] != "pending"]
    assert [(r["call_id"], r["outcome"]) for r in final] == [("pay-1", "committed")]


def test_a_held_tool_call_whose_approval_lapsed_ends_not_started_and_charges_nothing(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    provider = Provider(tmp_path / "provider").start()
    try:
        server = server_factory(
            **agent.env(deadline_s=10.0),
            **provider.tool_env(timeout_s=5.0),
            VOICEGATE_TOOL_CHARGE_APPROVAL="none",
            VOICEGATE_TOOL_CHARGE_APPROVAL_VALID_S="1",
        )
        # The link is down for 2.5 s: longer than the approval holds.
        agent.drop_after_tool_call(down_s=2.5)
        sipp = Sipp("uac-remote-pay.xml", server.sip_target, tmp_path).start()
        assert sipp.wait() == 0, sipp.errors()
        end = ended(server)
        assert end["terminal_state"] == "completed", end
        assert provider.ledger() == []  # never sent: the provider never saw the key
    finally:
        provider.stop()
    events = session_events(server)
    types = [e["type"] for e in events]
    assert "tool_request_sent" not in types
    receipts = [e["payload"] for e in events if e["type"] == "tool_receipt"]
    expired = "approval expired while the call was interrupted"
    assert [(r["outcome"], r["detail"]) for r in receipts] == [("not_started", expired)]
    final = [r for r in _tool_results(agent) if r["outcome"] != "pending"]
    assert [(r["call_id"], r["outcome"]) for r in final] == [("pay-1", "not_started")]
    assert final[0].get("detail", {}).get("reason") == expired


def test_a_link_that_never_comes_back_ends_the_call_failed_with_the_caller_told(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    server = server_factory(**agent.env(deadline_s=2.0))
    sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    wait_for(lambda: log_events(server, "agent_link.state"), 15, "the link to open")
    agent.kill()
    assert sipp.wait() == 0, sipp.errors()
    end = ended(server)
    assert (end["terminal_state"], end["stage"]) == ("failed", "agent_link")
    assert end["reason"] == "agent link failed: not back within 2 s"
    says = [x["prompt"] for e in session_events(server) for x in e["effects"] if x["kind"] == "say"]
    assert "technical_problem" in says, says
    assert server.metric("voicegate_agent_link_resumes_total", result="failed") == 1


def test_an_agent_asks_for_a_transfer_hears_its_progress_and_then_the_callers_rejoin(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    server = server_factory(
        **agent.env(),
        VOICEGATE_TRANSFER_ALLOWED_TARGETS="sip:*@cc.example.com",
        VOICEGATE_TRANSFER_DEFAULT_TARGET="sip:desk@cc.example.com",
    )
    # The caller presses 0: the agent sends {"type": "transfer"}; the leg accepts the REFER and
    # NOTIFYs 100 then 200, and our BYE follows the final one.
    log = tmp_path / "caller-logs.log"
    sipp = Sipp(
        "uac-transfer-blind.xml",
        server.sip_target,
        tmp_path / "caller",
        extra=("-trace_logs", "-log_file", str(log)),
    )
    assert sipp.run() == 0, sipp.errors()
    # Away, not ended: the caller may come back with the handle (session/away.py).
    away = away_session(server)
    told = agent_told(agent)
    progress = [(m["state"], m["status"]) for m in told if m["type"] == "transfer.progress"]
    assert progress[0] == ("started", 0) and progress[-1] == ("completed", 200), progress
    assert {state for state, _ in progress[1:-1]} <= {"trying"}
    # The transfer froze the gate and cleared the greeting if it still played (by the session).
    gates = [(m["state"], m["reason"]) for m in told if m["type"] == "gate"]
    assert gates[0] == ("frozen", "transfer"), gates
    cleared = [m["reason"] for m in told if m["type"] == "playback.cleared"]
    assert set(cleared) <= {"transfer", "ending"}, cleared
    assert server.metric("voicegate_transfers_total", mode="blind", outcome="completed") == 1

    # The centre sends the caller back with the REFER's handle: the agent hears the rejoin on a
    # new link, session.start for the same session, resumed (no greeting), with what the caller
    # heard last before they left (docs/agent-protocol.md, "rejoined").
    (handle,) = re.findall(r"X-Voicegate-Resume: (\S+)", log.read_text())
    AUDIT.register(handle, "resume handle sent on a REFER", "tests/integration")
    work = tmp_path / "back"
    work.mkdir()
    (work / "handle.csv").write_text(f"SEQUENTIAL\n{handle};\n")
    back = Sipp(
        "uac-rejoin.xml", server.sip_target, work, extra=("-inf", str(work / "handle.csv"))
    )
    assert back.run() == 0, back.errors()
    starts = [m for m in agent_told(agent) if "rejoined" in m]
    assert len(starts) == 1, agent_told(agent)
    assert starts[0]["rejoined"]["heard_last"].startswith(("prompt ", "response ")), starts
    assert starts[0]["rejoined"]["results"] == []

    def ended_session() -> dict[str, Any] | None:
        status, body = server.http(f"/v1/sessions/{away['session_id']}")
        assert status == 200, body
        return dict(body) if body["terminal_state"] else None

    assert wait_for(ended_session, 15, "the end")["terminal_state"] == "completed"
    opened = [e["new"] for e in log_events(server, "agent_link.state")]
    assert opened.count("open") == 2, opened
    assert handle not in server.log()


def test_an_agent_speaks_to_the_person_of_its_attended_transfer_whose_key_hands_over(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    port = free_port()
    # This person listens for 2.5 s, then presses 1 (SIP INFO).
    person = Sipp("uas-consult-accepts.xml", "", tmp_path / "person", port=port).start()
    server = server_factory(
        **agent.env(),
        VOICEGATE_TRANSFER_ALLOWED_TARGETS=f"sip:desk@{LOOPBACK}:*",
        VOICEGATE_TRANSFER_DEFAULT_TARGET=f"sip:desk@{LOOPBACK}:{port}",
        VOICEGATE_TRANSFER_DEFAULT_MODE="attended",
        VOICEGATE_TRANSFER_CONSULT_BRIEF="",
        VOICEGATE_TRANSFER_CONSULT_COMPLETE="person",
    )
    # The caller presses 0: the agent asks for a transfer; once the person answers it sends
    # consult.say (it accepted the feature consult), and the person's key 1 hands over.
    caller = Sipp("uac-transfer-key0-attended.xml", server.sip_target, tmp_path)
    assert caller.run() == 0, caller.errors()  # the REFER with Replaces, then our BYE
    assert person.wait() == 0, person.errors()
    # Away, not ended: the caller may come back with the handle (session/away.py).
    away_session(server)
    told = [m for m in agent_told(agent) if m["type"] == "consult.event"]
    kinds = [(m["kind"], m.get("digit", "")) for m in told]
    decided = [("answered", ""), ("dtmf", "1"), ("accepted", "")]
    assert [k for k in kinds if k[0] != "said"] == decided, kinds
    (said,) = [m for m in told if m["kind"] == "said"]
    assert said["say_id"] == "say-1" and said["outcome"] in ("played", "cleared"), said
    assert server.metric("voicegate_agent_protocol_errors_total", kind="schema") == 0
    assert [e["text_chars"] for e in log_events(server, "transfer.consult_say")] == [34]


def test_an_agent_hears_its_bridge_completed_and_its_link_dying_then_ends_nothing(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    port = free_port()
    # This desk answers, talks for 5 s and hangs up itself.
    desk = Sipp("uas-answer.xml", "", tmp_path / "desk", port=port).start()
    server = server_factory(
        **agent.env(deadline_s=1.0),
        VOICEGATE_TRANSFER_ALLOWED_TARGETS=f"sip:desk@{LOOPBACK}:*",
        VOICEGATE_TRANSFER_DEFAULT_TARGET=f"sip:desk@{LOOPBACK}:{port}",
        VOICEGATE_TRANSFER_DEFAULT_MODE="bridge",
    )
    # The caller presses 0: the agent asks for a transfer, the configured mode bridges it.
    sipp = Sipp("uac-transfer-key0-bridged.xml", server.sip_target, tmp_path).start()

    def progress() -> list[tuple[str, int]]:
        told = agent_told(agent)
        return [(m["state"], m["status"]) for m in told if m["type"] == "transfer.progress"]

    wait_for(lambda: ("completed", 200) in progress(), 15, "the agent to hear the bridge is up")
    assert progress() == [("started", 0), ("completed", 200)]
    # The people are talking: the agent's link dying for good ends nothing.
    agent.kill()
    wait_for(
        lambda: server.metric("voicegate_agent_link_resumes_total", result="failed") == 1,
        10,
        "the link to be given up",
    )
    assert sipp.wait() == 0, sipp.errors()  # our BYE came after the desk's
    assert desk.wait() == 0, desk.errors()
    end = ended(server)
    assert (end["terminal_state"], end["reason"]) == ("completed", "bridged: the target hung up")


def test_an_agent_hears_a_bridge_to_a_busy_target_failed(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    port = free_port()
    desk = Sipp("uas-busy.xml", "", tmp_path / "desk", port=port).start()
    server = server_factory(
        **agent.env(), VOICEGATE_TRANSFER_ALLOWED_TARGETS=f"sip:desk@{LOOPBACK}:*"
    )
    sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path).start()
    (call,) = wait_for(
        lambda: [c for c in server.live_calls() if c["state"] == "answered"], 10, "the call"
    )
    target = f"sip:desk@{LOOPBACK}:{port}"
    status, body = server.post_json(
        f"/v1/calls/{call['call_id']}/transfer", {"target": target, "mode": "bridge"}
    )
    assert status == 202, body
    assert desk.wait() == 0, desk.errors()

    def progress() -> list[tuple[str, int]]:
        told = agent_told(agent)
        return [(m["state"], m["status"]) for m in told if m["type"] == "transfer.progress"]

    wait_for(lambda: len(progress()) == 2, 15, "the agent to hear how the bridge went")
    assert progress() == [("started", 0), ("failed", 486)]
    assert server.post(f"/v1/calls/{call['call_id']}/hangup") == 202
    assert sipp.wait() == 0, sipp.errors()


def make_ca_and_certificate(where: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate it signed for 127.0.0.1: (CA, chain, key), PEM."""
    where.mkdir(parents=True, exist_ok=True)
    ca, ca_key = where / "ca.pem", where / "ca.key"
    cert, key, csr, ext = (where / n for n in ("agent.pem", "agent.key", "agent.csr", "ext"))
    ext.write_text(
        f"subjectAltName=IP:{LOOPBACK}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign"]
    new_key = ["-newkey", "rsa:2048", "-nodes", "-days", "1"]
    sign = ["-out", cert, "-days", "1", "-extfile", ext]
    for command in (
        ["req", "-x509", *new_key, "-keyout", ca_key, "-out", ca, "-subj", "/CN=test CA", *ca_ext],
        ["req", *new_key[:3], "-keyout", key, "-out", csr, "-subj", f"/CN={LOOPBACK}"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", *sign],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return ca, cert, key


def test_a_wss_agent_answers_with_its_ca_trusted_and_is_never_reached_without_it(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    ca, cert, key = make_ca_and_certificate(tmp_path / "tls")
    agent = ExampleAgent(tmp_path / "agent", tls=(cert, key)).start()
    try:
        # agent.ca_file trusts the CA that signed the agent's certificate: the call completes.
        server = server_factory(**agent.env(), VOICEGATE_AGENT_CA_FILE=str(ca))
        sipp = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "trusted")
        assert sipp.run() == 0, sipp.errors()
        end = ended(server)
        assert (end["terminal_state"], end["reason"]) == ("completed", "caller pressed 9")
        assert [e["new"] for e in log_events(server, "agent_link.state")][:1] == ["open"]
        # Without it the certificate is not trusted: no link ever opens, the call ends as a
        # link that never came back (the caller told), and nothing was sent in the clear.
        untrusting = server_factory("untrusting", **agent.env(deadline_s=1.0))
        sipp = Sipp("uac-wait-for-bye.xml", untrusting.sip_target, tmp_path / "untrusted")
        assert sipp.run() == 0, sipp.errors()
        end = ended(untrusting)
        assert (end["terminal_state"], end["stage"]) == ("failed", "agent_link")
        assert "open" not in [e["new"] for e in log_events(untrusting, "agent_link.state")]
        errors = {e["error"] for e in log_events(untrusting, "agent_link.dial_failed")}
        assert errors == {"ClientConnectorCertificateError"}, errors
    finally:
        agent.stop()


def test_an_agent_that_restarted_takes_the_call_up_again_with_what_was_heard(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    server = server_factory(**agent.env(deadline_s=6.0))
    sipp = Sipp("uac-remote-tone.xml", server.sip_target, tmp_path).start()
    wait_for(lambda: "a2: 1000 ms sent" in agent_log(agent), 15, "the tone to stream")
    agent.kill()  # the agent process dies with the call's state
    restarted = ExampleAgent(tmp_path / "restarted", port=agent.port).start()
    try:
        # It refuses the resume (it knows no such session); voicegate starts the session again
        # with resumed: true and what the caller heard; the caller's 9 then reaches it.
        assert sipp.wait() == 0, sipp.errors()
        end = ended(server)
        assert (end["terminal_state"], end["reason"]) == ("completed", "caller pressed 9")
        (line,) = [x for x in agent_log(restarted).splitlines() if "session.start" in x]
        last = json.loads(line.partition("session.start ")[2])["last_heard"]
        assert last["response_id"] == "a2" and last["heard_ms"] >= 500, last
    finally:
        restarted.stop()
    resumes = {
        r: server.metric("voicegate_agent_link_resumes_total", result=r)
        for r in ("resumed", "refused", "restarted", "failed")
    }
    assert resumes == {"resumed": 0, "refused": 1, "restarted": 1, "failed": 0}
    types = [e["type"] for e in session_events(server)]
    assert types.count("agent_link_lost") == 1 and types.count("agent_link_restored") == 1


def test_a_syllable_that_cut_the_greeting_is_told_as_a_false_interruption_and_the_agent_goes_on(
    server_factory: ServerFactory, agent: ExampleAgent, tmp_path: Path
) -> None:
    # The caller says "uh" a second into the greeting and nothing more: a barge-in, no turn.
    server = server_factory(**agent.env(), VOICEGATE_AUDIO_BARGE_IN_FALSE_WINDOW_MS="1000")
    capture = Capture(tmp_path / "rtp.pcap", server.rtp_min, server.rtp_max)
    try:
        sipp = Sipp("uac-false-barge-in.xml", server.sip_target, tmp_path)
        assert sipp.run() == 0, sipp.errors()
    finally:
        packets = capture.stop()
    assert ended(server)["terminal_state"] == "completed"
    events = session_events(server)
    types = [e["type"] for e in events]
    assert "turn_started" not in types and "turn_committed" not in types, types
    (cut,) = [e for e in events if e["type"] == "response_interrupted"]
    (judged,) = [e["payload"] for e in events if e["type"] == "barge_in_judged"]
    assert judged["outcome"] == "false" and judged["heard_ms"] == cut["payload"]["heard_ms"]
    assert server.metric("voicegate_barge_ins_total", reason="speech", outcome="false") == 1

    # On the wire: the cut, then the judgement naming the same response and what was heard.
    told = agent_told(agent)
    kinds = [m["type"] for m in told]
    assert "playback.false_interruption" in kinds, kinds
    interrupted = next(m for m in told if m["type"] == "playback.interrupted")
    false = next(m for m in told if m["type"] == "playback.false_interruption")
    assert kinds.index("playback.interrupted") < kinds.index("playback.false_interruption")
    assert interrupted["reason"] == "barge_in"
    assert (false["response_id"], false["heard_ms"]) == ("a1", judged["heard_ms"])
    assert server.metric("voicegate_agent_protocol_errors_total", kind="schema") == 0

    # The agent picked the greeting up again: the caller heard it after a silence.
    ports = range(server.rtp_min, server.rtp_max + 1)
    loud = [p.at for p in packets if p.src_port in ports and p.payload_type == 8 and p.rms > 300]
    # (The greeting's own pauses are under 0.6 s; the judgement waits 1 s after the cut.)
    gaps = [(a, b) for a, b in itertools.pairwise(loud) if b - a > 0.6]
    assert gaps, "the greeting never stopped"
    assert any(t > gaps[0][1] for t in loud), "nothing was said after the cut"
    responses = [e for e in events if e["type"] == "response_started"]
    assert len(responses) == 2, types
