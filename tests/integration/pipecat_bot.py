"""The example Pipecat bot (examples/pipecat_bot/) as its own process, for the tests."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integrations.pipecat.server import Bot, VoicegateServer
from tests.integration.harness import LOOPBACK, ROOT, free_port

SECRET = "pipecat-bot-secret-0123456789"


@dataclass
class PipecatBot:
    """``python -m examples.pipecat_bot`` on a free loopback port."""

    data_dir: Path
    tts_pace: float | None = None
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> PipecatBot:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(udp_and_tcp=False)
        env = {**os.environ, "PIPECAT_BOT_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-m", "examples.pipecat_bot", "--port", str(self.port)]
        if self.tts_pace is not None:
            args += ["--tts-pace", str(self.tts_pace)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=log, cwd=ROOT, env=env
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        assert "listening on" in line, f"the bot did not start: {line!r}\n{self.log_tail()}"
        return self

    @property
    def url(self) -> str:
        return f"ws://{LOOPBACK}:{self.port}/agent"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "bot.log"

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def env(self, deadline_s: float = 3.0) -> dict[str, str]:
        return {
            "VOICEGATE_AGENT_KIND": "remote",
            "VOICEGATE_AGENT_URL": self.url,
            "VOICEGATE_AGENT_SECRET": SECRET,
            "VOICEGATE_AGENT_RECONNECT_DEADLINE_S": str(deadline_s),
        }

    def contexts(self) -> list[dict[str, Any]]:
        """The LLM context of each call the bot finished (it logs it as the call ends)."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            _, marker, rest = line.partition("pipecat_bot.context ")
            if marker:
                found.append(json.loads(rest))
        return found

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()


class InProcessServer:
    """A ``VoicegateServer`` for a bot function of the test's own, on a thread of its own."""

    def __init__(self, bot: Bot) -> None:
        self.port = free_port(udp_and_tcp=False)
        self.url = f"ws://{LOOPBACK}:{self.port}/agent"
        self.server = VoicegateServer(bot, secret=SECRET, url=self.url)
        self._loop = asyncio.new_event_loop()
        self._serving: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self._loop.run_forever()

    def start(self) -> InProcessServer:
        self._thread.start()
        ready = threading.Event()

        async def serve() -> None:
            self._serving = asyncio.current_task()
            await self.server.run(LOOPBACK, self.port, ready=ready.set)

        asyncio.run_coroutine_threadsafe(serve(), self._loop)
        assert ready.wait(10), "the bot server did not start"
        return self

    def stop(self) -> None:
        serving = self._serving

        async def wind_down() -> None:
            if serving is not None and not serving.done():
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)  # (its site cleaned up)

        asyncio.run_coroutine_threadsafe(wind_down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def env(self, deadline_s: float = 3.0) -> dict[str, str]:
        return {
            "VOICEGATE_AGENT_KIND": "remote",
            "VOICEGATE_AGENT_URL": self.url,
            "VOICEGATE_AGENT_SECRET": SECRET,
            "VOICEGATE_AGENT_RECONNECT_DEADLINE_S": str(deadline_s),
        }
