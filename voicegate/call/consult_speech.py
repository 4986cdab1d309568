"""The text a consultation says to the person on the consult leg, synthesised off the call's
task (audio/espeak.py): one tracked task per text, its result handed back to the call's task
through the call's queue (STYLE.md habit 5), every task cancelled when the call ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from audio.espeak import SynthesisError, speak
from voicegate.call.consult import Synthesized
from voicegate.call.control import AgentWork

log = logging.getLogger("voicegate.call")


class ConsultSpeech:
    def __init__(self, post: Callable[[object], None]) -> None:
        self._post = post
        self._tasks: set[asyncio.Task[None]] = set()

    def synthesize(self, text: str, rate: int, done: Synthesized) -> Callable[[], None]:
        """Start speaking ``text`` at ``rate``; ``done`` runs on the call's task with the
        samples (or None and why not). The function returned stops it (``done`` never runs)."""
        task = asyncio.get_running_loop().create_task(self._run(text, rate, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        def stop() -> None:
            task.cancel()

        return stop

    async def _run(self, text: str, rate: int, done: Synthesized) -> None:
        try:
            samples = await speak(text, rate)
        except SynthesisError as exc:
            why = str(exc)
            self._post(AgentWork(lambda: done(None, why)))
        else:
            self._post(AgentWork(lambda: done(samples, "")))

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
