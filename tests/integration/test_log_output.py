"""What a person or a log shipper sees of a real ``voicegate serve``: text on a terminal, JSON
lines otherwise, PJSIP's own lines among them (from its first one, printed before pjsua2's
writer exists) and nothing at all on stdout."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.integration.harness import Server, ServerFactory, wait_for
from tests.secret_audit import AUDIT

# A line as PJSIP's default writer prints it: "02:43:18.503  os_core_unix.c !pjlib 2.15.1 ...".
RAW_PJSIP = re.compile(r"^\d\d:\d\d:\d\d\.\d{3}\s+\S+\s+[.!]*\S")


class _Drain(threading.Thread):
    """Reads ``fd`` to its end as the server writes (a full pty or pipe would stall it)."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.chunks: list[bytes] = []

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: a pty whose other end closed
                break
            if not chunk:
                break
            self.chunks.append(chunk)

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace").replace("\r\n", "\n")


def _serve(
    tmp_path: Path, name: str, stderr_fd: int, **env: str
) -> tuple[Server, subprocess.Popen[bytes], Path]:
    """A ``voicegate serve`` on the harness's ports whose stderr is ``stderr_fd`` and whose
    stdout is a file of its own (the harness merges the two)."""
    server = Server(tmp_path / name, env_overrides=env)
    server.data_dir.mkdir(parents=True)
    stdout_path = server.data_dir / "stdout.txt"
    with open(stdout_path, "wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "voicegate", "serve"],
            env=server.env,
            stdout=stdout,
            stderr=stderr_fd,
            cwd=server.data_dir,
        )
    server.process = process
    return server, process, stdout_path


def _run_until_ready_then_stop(
    server: Server, process: subprocess.Popen[bytes], drain: _Drain
) -> str:
    try:
        wait_for(
            lambda: process.poll() is not None or server.http("/readyz")[0] == 200,
            30,
            "/readyz",
        )
        assert process.poll() is None, f"server exited {process.returncode}:\n{drain.text()}"
    finally:
        assert server.stop() == 0, drain.text()[-3000:]
        drain.join(10)
    text = drain.text()
    AUDIT.record(f"stderr of {server.data_dir}", text)
    return text


def _stdout(path: Path) -> str:
    text = path.read_text(errors="replace")
    AUDIT.record(f"stdout of {path.parent}", text)
    return text


def test_on_a_terminal_the_log_is_text_with_its_facts(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    try:
        server, process, stdout = _serve(
            tmp_path, "tty", follower, VOICEGATE_LOG_LEVEL="info", VOICEGATE_LOG_PJSIP_LEVEL="3"
        )
    finally:
        os.close(follower)
    drain = _Drain(leader)
    drain.start()
    try:
        text = _run_until_ready_then_stop(server, process, drain)
    finally:
        os.close(leader)
    lines = text.splitlines()
    started = [line for line in lines if " serve.started " in line]
    assert len(started) == 1, text
    assert re.match(
        rf"\d\d:\d\d:\d\d\.\d{{3}} INFO  serve\.started sip=127\.0\.0\.1:{server.sip_port} "
        rf"http=127\.0\.0\.1:{server.http_port} ",
        started[0],
    ), started[0]
    assert any(re.search(r" INFO  pjsip: pjsua version \S+ for ", line) for line in lines), text
    json_lines = [line for line in lines if line.startswith("{")]
    assert not json_lines, f"JSON on a terminal: {json_lines[:3]}"
    assert _stdout(stdout) == ""


def _json_lines(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return records


def test_on_a_pipe_the_log_is_json_with_pjsips_lines_and_stdout_is_empty(tmp_path: Path) -> None:
    reader, writer = os.pipe()
    try:
        server, process, stdout = _serve(
            tmp_path, "pipe", writer, VOICEGATE_LOG_LEVEL="debug", VOICEGATE_LOG_PJSIP_LEVEL="5"
        )
    finally:
        os.close(writer)
    drain = _Drain(reader)
    drain.start()
    try:
        records = _json_lines(_run_until_ready_then_stop(server, process, drain))
    finally:
        os.close(reader)
    pjsip = [(r["level"], r["event"]) for r in records if r["logger"] == "pjsip"]
    # libInit's line, through pjsua2's writer; and libCreate's first, from before it existed.
    assert any(level == "info" and e.startswith("pjsua version ") for level, e in pjsip), pjsip
    assert ("debug", "pjlib 2.15.1 for POSIX initialized") in pjsip, pjsip
    # The library's last line, after voicegate's SIP thread shut it down.
    assert ("debug", "PJSUA destroyed...") in pjsip, pjsip[-5:]
    assert "serve.started" in [r["event"] for r in records]
    out = _stdout(stdout)
    assert not [line for line in out.splitlines() if RAW_PJSIP.match(line)], out[:2000]
    assert out == ""


def test_the_harness_servers_log_json_pjsip_included(server_factory: ServerFactory) -> None:
    # The suite reads every server's log as JSON lines (Server.log_events): its log file is no
    # terminal, so log.format's default, auto, must give JSON there, and stdout (which the
    # harness writes to the same file) must hold no raw PJSIP line.
    server = server_factory(VOICEGATE_LOG_PJSIP_LEVEL="3")
    wait_for(lambda: "serve.started" in server.log(), 10, "serve.started in the log")
    server.stop()
    records = _json_lines(server.log())
    assert any(
        r["logger"] == "pjsip" and r["event"].startswith("pjsua version ") for r in records
    ), records[:10]
