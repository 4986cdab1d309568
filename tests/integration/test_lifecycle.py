"""Capacity, set-up bursts, shutdown and crash: the process's own lifecycle, with real callers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.harness import Server, ServerFactory, Sipp, free_port, wait_for


def test_calls_beyond_the_ceiling_are_refused_with_486_and_counted(
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    server = server_factory(VOICEGATE_POOL_CALLS_PER_WORKER="2")
    holders = Sipp(
        "uac-speech-dtmf.xml", server.sip_target, tmp_path / "a", calls=2, rate=10, limit=2
    ).start()
    wait_for(lambda: len(server.live_calls()) == 2, 10, "two live calls")
    extra = Sipp("uac-burst.xml", server.sip_target, tmp_path / "b")
    assert extra.run() == 0, extra.errors()
    assert server.metric("voicegate_calls_refused_total", reason="capacity", status="486") == 1
    assert len(server.live_calls()) == 2
    assert holders.wait() == 0, holders.errors()
    wait_for(
        lambda: server.metric("voicegate_calls_total", outcome="completed") == 2,
        5,
        "two completed calls",
    )


def test_a_burst_of_setups_is_refused_in_part_and_never_aborts(
    server: Server, tmp_path: Path
) -> None:
    # 150 set-ups per second is past the ~60/s at which pjsua2's select ioqueue aborts.
    burst = Sipp(
        "uac-burst.xml", server.sip_target, tmp_path, calls=450, rate=150, limit=60, timeout_s=60
    )
    code = burst.run()
    assert server.process is not None and server.process.poll() is None, server.log()[-3000:]
    assert code == 0, burst.errors()[-3000:]
    refused = sum(
        value
        for (name, _), value in server.metrics().items()
        if name == "voicegate_calls_refused_total"
    )
    answered = server.metric("voicegate_calls_total", outcome="completed")
    assert refused > 0
    assert answered > 0
    assert refused + answered == 450
    # Still serving afterwards.
    after = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "after")
    assert after.run() == 0, after.errors()


def test_sigterm_refuses_new_calls_ends_live_ones_and_exits_0(
    server: Server, tmp_path: Path
) -> None:
    live = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path / "live").start()
    wait_for(lambda: [c for c in server.live_calls() if c["state"] == "answered"], 10, "a call")
    server.signal(signal.SIGTERM)
    wait_for(lambda: server.http("/readyz")[0] == 503, 5, "/readyz to say not ready")
    refused = Sipp("uac-refused.xml", server.sip_target, tmp_path / "refused")
    assert refused.run() == 0, refused.errors()
    # The live caller gets a BYE (SIPp's scenario fails without one) and the process exits 0.
    assert live.wait() == 0, live.errors()
    assert server.wait_exit(30) == 0
    (stored,) = server.stored_sessions()
    assert stored["terminal_state"] == "canceled"
    assert stored["status"] == "canceled: server shutting down"


def test_sigterm_drains_live_calls_before_the_deadline_and_refuses_new_ones(
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    server = server_factory(VOICEGATE_SIP_DRAIN_DEADLINE_S="60")
    live = Sipp("uac-speech-dtmf.xml", server.sip_target, tmp_path / "live").start()
    wait_for(lambda: [c for c in server.live_calls() if c["state"] == "answered"], 10, "a call")
    server.signal(signal.SIGTERM)
    wait_for(lambda: server.http("/readyz")[0] == 503, 5, "/readyz to say not ready")
    refused = Sipp("uac-refused.xml", server.sip_target, tmp_path / "refused")
    assert refused.run() == 0, refused.errors()
    # The caller finishes the call (DTMF read back, caller's BYE) and only then the process exits.
    assert live.wait() == 0, live.errors()
    assert server.wait_exit(30) == 0
    (stored,) = server.stored_sessions()
    assert stored["terminal_state"] == "completed"
    assert any(e.get("event") == "drain.begin" for e in server.log_events())


def test_sigint_with_no_calls_exits_0(server: Server) -> None:
    server.signal(signal.SIGINT)
    assert server.wait_exit(30) == 0


def test_usr2_logs_the_tasks_and_usr1_the_threads_of_a_serving_process(server: Server) -> None:
    """What an operator sends a stuck process to see what it waits on; it keeps serving."""
    server.signal(signal.SIGUSR2)
    (dump,) = wait_for(
        lambda: [e for e in server.log_events() if e.get("event") == "debug.tasks"] or None,
        10,
        "the task dump",
    )
    waits = {task["task"]: task["at"] for task in dump["tasks"]}
    # The main task waits in serve() for the stop signal: its chain goes down to the Event's wait.
    assert any(
        at[0].endswith(" serve") and any(a.endswith(" wait") for a in at[1:])
        for at in waits.values()
    ), waits
    before = len(server.log())
    server.signal(signal.SIGUSR1)
    # faulthandler writes thread after thread; the main one, in serve(), is among them.
    wait_for(lambda: "voicegate/cli.py" in server.log()[before:], 10, "the main thread's stack")
    assert "most recent call first" in server.log()[before:]
    assert server.http("/healthz")[0] == 200
    server.signal(signal.SIGTERM)
    assert server.wait_exit(30) == 0


def test_a_call_whose_process_was_killed_is_finalised_at_restart(
    server: Server, tmp_path: Path
) -> None:
    live = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path, timeout_s=20).start()
    wait_for(lambda: [c for c in server.live_calls() if c["state"] == "answered"], 10, "a call")
    server.signal(signal.SIGKILL)
    assert server.wait_exit(10) == -signal.SIGKILL
    (stored,) = server.stored_sessions()
    assert stored["terminal_state"] is None
    server.start()
    (session,) = server.sessions()
    ended = session["ended"]
    assert (ended["terminal_state"], ended["stage"]) == ("failed", "process")
    # It says what was known when the process died.
    assert "exited before the session ended" in ended["reason"]
    assert "last known: signaling up, media flowing" in ended["reason"]
    assert [e["type"] for e in session["events"]][-1] == "session_reaped"
    assert server.metric("voicegate_sessions_reaped_total", why="predecessor") == 1
    assert server.metric("voicegate_sessions_ended_total", terminal_state="failed") == 1
    # Reaping is idempotent: a second restart finds nothing left to finalise.
    assert server.stop() == 0
    server.start()
    assert server.sessions()[0]["events"] == session["events"]
    assert server.metric("voicegate_sessions_reaped_total", why="predecessor") == 0
    live.kill()


def test_bad_config_value_fails_start_with_one_line_naming_the_key(tmp_path: Path) -> None:
    env = Server(tmp_path).env | {"VOICEGATE_SIP_PORT": "abc"}
    result = subprocess.run(
        [sys.executable, "-m", "voicegate", "serve"], env=env, capture_output=True, timeout=30
    )
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1
    assert "sip.port" in lines[0] and "'abc'" in lines[0] and "VOICEGATE_SIP_PORT" in lines[0]


def test_check_config_validates_a_file_without_starting(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[sip]\nport = 5099\n")
    bad = tmp_path / "bad.toml"
    bad.write_text('[media]\ncodecs = ["OPUS"]\n')
    ok = subprocess.run(
        [sys.executable, "-m", "voicegate", "check-config", str(good)],
        capture_output=True,
        timeout=30,
    )
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "voicegate", "check-config", str(bad)],
        capture_output=True,
        timeout=30,
    )
    assert refused.returncode == 2
    assert "media.codecs" in refused.stderr.decode() and "OPUS" in refused.stderr.decode()


def test_sip_port_in_use_fails_start_with_a_clear_message(tmp_path: Path) -> None:
    import socket

    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", port))
        server = Server(tmp_path, sip_port=port)
        server.start(wait_ready=False)
        code = server.wait_exit(30)
    assert code == 3
    assert "cannot start SIP" in server.log()
