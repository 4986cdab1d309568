"""The fork server: one process that imports voicegate once and forks the pool's workers from it.

An idle worker started as its own interpreter spends about 1.2 s of CPU importing voicegate and
holds about 50 MB of private memory that is nothing but that import (the Python heap of numpy,
aiohttp, pjsua2's bindings, ...). Forked from a parent that imported it all, froze it
(``gc.freeze()``: the collector never writes to those objects' headers, so their pages stay
shared) and started nothing else (no thread, no event loop, no pjsua2 endpoint: each worker
creates its own after the fork), a worker starts at once and shares those pages with every other.

Each worker is still the supervisor's own child: the server forks an intermediate process that
forks the worker and exits at once, and the supervisor is a child subreaper
(``PR_SET_CHILD_SUBREAPER``), so the kernel hands the orphaned worker to it. The supervisor then
waits on the worker as on any child (``ForkedProcess``: its exit status, a signal that killed
it), and a fork server that dies takes no worker with it: the supervisor starts another.

The supervisor talks to the server over its stdin and stdout, one JSON object a line:

    -> {"argv": ["worker", "--index", "3"], "env": {...}, "cwd": "/srv"}
    <- {"pid": 1234}                      or  {"error": "why"}

and the server's first line, once it has imported everything, is ``{"ready": true}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO

import setproctitle

from voicegate.pool.process_tree import die_with_parent

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def become_subreaper() -> None:
    """Make this process the one the kernel gives orphaned descendants to (Linux >= 3.4)."""
    if _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


# --- the server ---------------------------------------------------------------------------------


def preload(config_path: str | None) -> None:
    """Import everything a worker imports, the configured agent's module included."""
    from agents.loading import AgentLoadError
    from agents.speaking_demo import SpeakingDemoAgent, build_speech_before_fork
    from audio.prompts import PromptLibrary, default_prompts_dir
    from config import ConfigError, load_settings
    from telephony.c_media_port import vad_check_signal
    from voicegate import cli  # noqa: F401  (imports the runtime, telephony, audio, session)
    from voicegate.runtime import PROMPT_RATES, agent_factories

    for rate in (8000, 16000):  # the C detector's check at each worker's start
        vad_check_signal(rate)

    # A config error is the worker's to report (it exits 2 naming it); here it only means less
    # is shared.
    try:
        settings = load_settings(config_path)
        factories = agent_factories(settings)
    except (ConfigError, AgentLoadError, OSError):
        return
    if SpeakingDemoAgent in factories.values():
        build_speech_before_fork(settings.pool.calls_per_worker)
    # The rates a worker loads them at (Runtime.start); a broken file is the worker's to report.
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        library = PromptLibrary(settings.agent.prompts_dir or default_prompts_dir())
        for rate in PROMPT_RATES:
            library.load_all(rate)


def serve(requests: IO[str], answers: IO[str], supervisor: int, output: int) -> None:
    """Answer fork requests until the supervisor closes the pipe."""
    for line in requests:
        try:
            request = json.loads(line)
            argv = [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in request["env"].items()}
            cwd = str(request["cwd"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            answer: dict[str, object] = {"error": f"bad request: {exc}"}
        else:
            try:
                answer = {"pid": _fork_worker(argv, env, cwd, supervisor, output)}
            except OSError as exc:
                answer = {"error": f"fork failed: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _fork_worker(
    argv: Sequence[str], env: Mapping[str, str], cwd: str, supervisor: int, output: int
) -> int:
    """Fork the worker through an intermediate that exits, so the supervisor adopts it."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            # Taken before the fork: the worker's own getppid() may already be the supervisor.
            me = os.getpid()
            worker = os.fork()
            if worker == 0:
                os.close(write_end)
                _run_worker(argv, env, cwd, supervisor, output, middle=me)
            os.write(write_end, str(worker).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            text = pipe.read()
    finally:
        os.waitpid(middle, 0)
    if not text:
        raise OSError("the intermediate process died before forking the worker")
    return int(text)


def _run_worker(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    supervisor: int,
    output: int,
    *,
    middle: int,
) -> None:
    """In the worker: become what ``python -m voicegate ARGV`` would be, then run it."""
    code = 1
    try:
        os.setsid()
        # The death signal follows the current parent: ask for it once the supervisor is that
        # parent (the intermediate exits within microseconds), not before, or the
        # intermediate's exit would deliver it.
        deadline = time.monotonic() + 10
        while os.getppid() == middle:
            if time.monotonic() > deadline:
                print("voicegate: the fork server's intermediate never exited", file=sys.stderr)
                os._exit(1)
            time.sleep(0.0005)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != supervisor:
            os._exit(1)  # the supervisor is gone (or is no subreaper): nobody would watch us
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(output, 1)
        # The server's pipes and anything else it held: a worker holds only its own.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own descriptors)
        sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        # SIGPIPE stays ignored, as Python leaves it in every interpreter it starts.
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = ["voicegate", *argv]
        setproctitle.setproctitle(" ".join([sys.executable, "-m", "voicegate", *argv]))
        gc.enable()
        from voicegate.cli import main

        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main() -> None:
    """``python -m voicegate.pool.forkserver SUPERVISOR_PID OUTPUT_FD [CONFIG]``: OUTPUT_FD is
    the supervisor's stdout, the workers' (the server's own stdout is its answer pipe)."""
    gc.disable()  # nothing freed while importing leaves holes in the pages the workers share
    supervisor, output = int(sys.argv[1]), int(sys.argv[2])
    setproctitle.setproctitle(f"{sys.executable} -m voicegate.pool.forkserver (fork server)")
    preload(sys.argv[3] if len(sys.argv) > 3 else None)
    gc.collect()
    gc.freeze()
    # The answers go to the pipe; anything a module prints goes to stderr, never into it.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    serve(sys.stdin, answers, supervisor, output)


# --- the supervisor's side ----------------------------------------------------------------------


class ForkServerError(Exception):
    pass


class ForkedProcess:
    """A worker the fork server forked and the supervisor adopted: waited on through a pidfd.

    The same face as ``asyncio.subprocess.Process`` where the supervisor uses it: ``pid``,
    ``returncode`` (negative: the signal that killed it), ``wait()``, ``kill()``,
    ``send_signal()``.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        # Opened before it can be reaped: it was adopted as a zombie at worst, never reused.
        self._pidfd = os.pidfd_open(pid)
        self._loop.add_reader(self._pidfd, self._on_exit)

    def _on_exit(self) -> None:
        try:
            got, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            got, status = self.pid, 255 << 8  # reaped elsewhere: its status is lost
        if got == 0:
            return  # woken early; the pidfd stays readable until the worker is gone
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = os.waitstatus_to_exitcode(status)
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The supervisor's handle on its fork server: started once, restarted if it dies."""

    def __init__(self, config_path: str | None, env: Mapping[str, str]) -> None:
        self.config_path = config_path
        self.env = dict(env)
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._output: int | None = None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def start(self) -> None:
        if self._output is None:
            self._output = os.dup(1)
        argv = [sys.executable, "-m", "voicegate.pool.forkserver", str(os.getpid())]
        argv.append(str(self._output))
        if self.config_path:
            argv.append(self.config_path)
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self.env,
            pass_fds=(self._output,),
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        first = await self._read()
        if first.get("ready") is not True:
            await self.stop()
            raise ForkServerError(f"the fork server did not start: {first}")

    async def fork(self, argv: Sequence[str], env: Mapping[str, str]) -> ForkedProcess:
        """One worker ``python -m voicegate ARGV`` with ``env``, adopted by this process."""
        async with self._lock:
            if self.pid is None:
                await self.start()
            assert self._proc is not None and self._proc.stdin is not None
            request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd()}
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                await self._proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ForkServerError(f"the fork server is gone: {exc}") from exc
            answer = await self._read()
            pid = answer.get("pid")
            if not isinstance(pid, int):
                raise ForkServerError(str(answer.get("error", answer)))
            return ForkedProcess(pid)

    async def _read(self) -> dict[str, object]:
        assert self._proc is not None and self._proc.stdout is not None
        line = await self._proc.stdout.readline()
        if not line:
            status = await self._proc.wait()
            raise ForkServerError(f"the fork server exited (status {status})")
        try:
            answer = json.loads(line)
        except ValueError as exc:
            raise ForkServerError(f"the fork server said {line[:200]!r}") from exc
        if not isinstance(answer, dict):
            raise ForkServerError(f"the fork server said {line[:200]!r}")
        return answer

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    def close(self) -> None:
        if self._output is not None:
            os.close(self._output)
            self._output = None


def reap_orphans() -> list[int]:
    """Reap zombie children this subreaper adopted from its workers (a speech subprocess of a
    worker killed mid-sentence) or from Kamailio: those not heading a session of their own and
    not in the supervisor's session. Its own children (workers, Kamailio, the fork server) each
    lead their session, and asyncio waits for them; they are left alone."""
    me = os.getpid()
    own_session = os.getsid(0)
    reaped = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        # After the command: state, ppid, pgrp, session.
        state, ppid, session = fields[0], int(fields[1]), int(fields[3])
        pid = int(entry)
        if state == "Z" and ppid == me and session not in (pid, own_session):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
    return reaped


if __name__ == "__main__":
    main()
