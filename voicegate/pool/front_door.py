"""Running Kamailio as the pool's front door: start, steer its dispatcher, read its counters, stop.

Kamailio runs in the foreground (``-DD``) as the supervisor's child, logging to its stderr, which
the supervisor relays line by line with callers masked: Kamailio's parser quotes a whole malformed
message in its error lines, From and Contact included (STYLE.md habit 10). The
supervisor steers it over the ctl socket with ``kamcmd``: a worker that died or is draining is
taken out of the dispatcher set at once (OPTIONS probing would notice within two probe
intervals), and put back when it is healthy again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import TextIO

from telephony.sip_message import mask_text
from voicegate.pool.kamailio_config import (
    DISPATCHER_SET,
    STAT_BAD_OFFER,
    STAT_FAILOVERS,
    STAT_MALFORMED,
    STAT_NO_WORKER,
    STAT_SOURCE_RATE,
    FrontDoor,
    render_config,
    render_dispatcher_list,
    render_tls_config,
)
from voicegate.pool.process_tree import die_with_parent

log = logging.getLogger("voicegate.pool.front_door")

INSTALL_HINT = (
    "install Kamailio (Debian/Ubuntu: `apt install kamailio`), or set pool.kamailio to its path"
)
_READY_WAIT_S = 10.0
_STOP_WAIT_S = 5.0
_STAT_LINE = re.compile(r"^\s*script:(\w+)\s*=\s*(\d+)\s*$", re.M)


class FrontDoorError(Exception):
    pass


def find_executable(name: str) -> tuple[str, str]:
    """Paths of ``kamailio`` and ``kamcmd`` (beside it or on PATH); FrontDoorError if missing."""
    # Debian installs it in /usr/sbin, which a non-root PATH often lacks.
    kamailio = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if kamailio is None:
        raise FrontDoorError(
            f"pool.workers > 1 needs Kamailio, and {name!r} is not found: " + INSTALL_HINT
        )
    beside = Path(kamailio).with_name("kamcmd")
    kamcmd = str(beside) if beside.exists() else shutil.which("kamcmd")
    if kamcmd is None:
        raise FrontDoorError(f"kamcmd (Kamailio's control tool) is not found: {INSTALL_HINT}")
    return kamailio, kamcmd


class Kamailio:
    def __init__(self, executable: str, door: FrontDoor, workers: list[tuple[str, str]]) -> None:
        self._kamailio, self._kamcmd = find_executable(executable)
        self.door = door
        self.workers = workers
        self.config_path = door.runtime_dir / "kamailio.cfg"
        self._proc: asyncio.subprocess.Process | None = None
        self._exited: asyncio.Task[int] | None = None
        self._relay: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        door = self.door
        door.runtime_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            door.ctl_socket.unlink()
        door.dispatcher_list.write_text(render_dispatcher_list(self.workers))
        if door.tls_port and door.tls_config is not None:
            door.tls_config.write_text(render_tls_config(door))
        self.config_path.write_text(render_config(door))
        check = await asyncio.create_subprocess_exec(
            self._kamailio,
            "-c",
            "-f",
            str(self.config_path),
            "-Y",
            str(door.runtime_dir),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await check.communicate()
        if check.returncode != 0:
            text = out.decode(errors="replace").strip()
            # Debian ships the tls module in a package of its own.
            hint = (
                " (sip.tls_port needs Kamailio's TLS module: `apt install kamailio-tls-modules`)"
                if door.tls_port and "could not find module <tls>" in text
                else ""
            )
            raise FrontDoorError(
                f"Kamailio refused the generated {self.config_path}{hint}: " + text[-600:]
            )
        self._proc = await asyncio.create_subprocess_exec(
            self._kamailio,
            "-f",
            str(self.config_path),
            "-Y",
            str(door.runtime_dir),
            "-DD",
            "-E",
            "-m",
            "64",
            "-M",
            "8",
            # Its own session, like the workers': a Ctrl-C meant for the supervisor must not
            # stop Kamailio while drained calls still send their BYEs through it.
            start_new_session=True,
            preexec_fn=die_with_parent,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert self._proc.stdout is not None
        self._relay = asyncio.create_task(relay_masked(self._proc.stdout), name="kamailio-log")
        self._exited = asyncio.create_task(self._reap(), name="kamailio")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READY_WAIT_S
        while not door.ctl_socket.exists() or await self._rpc("core.version") is None:
            if self._exited.done():
                tls_free = f", and TLS port {door.tls_port}" if door.tls_port else ""
                raise FrontDoorError(
                    f"Kamailio exited with status {self._exited.result()} at start-up "
                    f"(is {door.address}:{door.port} free{tls_free}?); see its log lines above"
                )
            if loop.time() > deadline:
                raise FrontDoorError(f"Kamailio did not open its ctl socket {door.ctl_socket}")
            await asyncio.sleep(0.1)
        log.info(
            "front_door.started",
            extra={
                "sip": f"{door.address}:{door.port}",
                "pid": self._proc.pid,
                "config": str(self.config_path),
            },
        )

    async def _reap(self) -> int:
        assert self._proc is not None and self._relay is not None
        status = await self._proc.wait()
        # The relay ends at the pipe's EOF; its last lines (why Kamailio exited) come first.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._relay), timeout=2.0)
        return status

    async def wait_exit(self) -> int:
        assert self._exited is not None
        # Shielded: a waiter that is cancelled must not cancel the one task that reaps Kamailio.
        return await asyncio.shield(self._exited)

    async def _rpc(self, *args: str) -> str | None:
        """One kamcmd call; None (and nothing raised) if Kamailio is not answering."""
        try:
            proc = await asyncio.create_subprocess_exec(
                self._kamcmd,
                "-s",
                f"unix:{self.door.ctl_socket}",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), timeout=3.0)
        except (OSError, TimeoutError):
            return None
        if proc.returncode != 0:
            log.debug("front_door.rpc_failed", extra={"args": args, "error": err.decode()})
            return None
        return out.decode(errors="replace")

    async def set_worker(self, uri: str, state: str) -> bool:
        """``state``: "ap" active (probing on), "ip" inactive until probes pass, "d" disabled."""
        return await self._rpc("dispatcher.set_state", state, str(DISPATCHER_SET), uri) is not None

    async def counters(self) -> dict[str, int]:
        out = await self._rpc("stats.get_statistics", "script:")
        found = {name: int(value) for name, value in _STAT_LINE.findall(out or "")}
        names = (STAT_FAILOVERS, STAT_NO_WORKER, STAT_BAD_OFFER, STAT_SOURCE_RATE, STAT_MALFORMED)
        return {name: found[name] for name in names if name in found}

    async def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.wait_exit(), timeout=_STOP_WAIT_S)
        except TimeoutError:
            proc.kill()
            await self.wait_exit()
        log.info("front_door.stopped", extra={"status": proc.returncode})


async def relay_masked(stream: asyncio.StreamReader, out: TextIO | None = None) -> None:
    """Copy Kamailio's log lines to our stderr (or ``out``), callers' numbers masked."""
    target = out if out is not None else sys.stderr
    while line := await stream.readline():
        target.write(mask_text(line.decode(errors="replace")))
        target.flush()


def front_door_for(
    address: str,
    port: int,
    run_dir: Path,
    probe_interval_s: int,
    source_max_rate: float,
    *,
    media_ipv6: bool = False,
    tls_port: int = 0,
    tls_cert_file: Path | None = None,
    tls_key_file: Path | None = None,
) -> FrontDoor:
    """The front door on ``address:port`` (UDP, TCP), and TLS on ``tls_port`` unless 0, its
    files kept in ``run_dir``."""
    return FrontDoor(
        address=address,
        port=port,
        ctl_socket=run_dir / "kamailio-ctl.sock",
        dispatcher_list=run_dir / "dispatcher.list",
        runtime_dir=run_dir,
        probe_interval_s=probe_interval_s,
        source_max_rate=source_max_rate,
        media_ipv6=media_ipv6,
        tls_port=tls_port,
        tls_cert_file=tls_cert_file.resolve() if tls_cert_file else None,
        tls_key_file=tls_key_file.resolve() if tls_key_file else None,
        tls_config=run_dir / "tls.cfg" if tls_port else None,
    )


def unix_socket_path_ok(path: Path) -> bool:
    # sun_path holds 108 bytes on Linux, NUL included.
    return len(os.fsencode(path)) < 108
