"""``EspeakTTSService``: Pipecat text-to-speech with espeak-ng, offline, at the pipeline's rate.

It reuses voicegate's :class:`audio.speech.synth.Synthesizer` rather than a wrapper of its own:
that class already drives ``libespeak-ng`` in process under the one lock espeak-ng's global
state needs, trims the silence espeak-ng pads each sentence with, peaks at -3 dBFS like the
recorded prompts, resamples to any rate, and caches each sentence (the greeting is said once
per call). Synthesis runs on a worker thread (``asyncio.to_thread``); ctypes releases the GIL
while the library runs, so the event loop keeps moving.

Pipecat's :class:`~pipecat.services.tts_service.TTSService` does the turn bookkeeping: with
``push_start_frame`` and ``push_stop_frames`` it opens each turn with ``TTSStartedFrame``,
closes it with ``TTSStoppedFrame`` and queues a ``TTSTextFrame`` of each sentence behind its
audio (what the assistant context aggregator records as said). This class only turns one
sentence into ``TTSAudioRawFrame`` chunks.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService

from audio.speech.synth import MAX_TEXT, SynthesisError, Synthesizer, Voice

CHUNK_MS = 40  # two 20 ms RTP packets: a cut lands within 40 ms of where the caller spoke
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")

# One cache for the process: every call's bot says the same few sentences.
_SYNTHESIZER = Synthesizer()


class EspeakTTSService(TTSService):
    """espeak-ng speech at the pipeline's output rate (8000 or 16000 Hz), in ``CHUNK_MS`` chunks.

    ``voice`` is an espeak-ng voice name (``en-us``, ``en-gb``, ``en-us+f3``) and ``wpm`` its
    speed in words a minute. ``pace``: when set, chunks of one sentence are yielded no faster
    than ``pace`` times real time (0.5: one second of audio takes at least half a second to
    arrive), like a streaming cloud TTS, so a test can cut the bot while chunks are still
    coming; ``None`` yields them as soon as the sentence is synthesised.
    """

    def __init__(
        self,
        *,
        voice: str = "en-us",
        wpm: int = 160,
        pace: float | None = None,
        **kwargs: Any,
    ) -> None:
        if pace is not None and pace <= 0:
            raise ValueError(f"pace must be positive (a fraction of real time), not {pace}")
        # Every settings field set (None: not applicable), or Pipecat logs an error at start.
        kwargs.setdefault("settings", TTSSettings(model="espeak-ng", voice=voice, language=None))
        super().__init__(push_start_frame=True, push_stop_frames=True, **kwargs)
        self._voice = Voice(voice, wpm)
        self._pace = pace

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """The audio of ``text`` (one aggregated sentence, or a whole ``TTSSpeakFrame``)."""
        await self.start_tts_usage_metrics(text)
        rate = self.sample_rate
        chunk = rate * CHUNK_MS // 1000
        loop = asyncio.get_running_loop()
        started = loop.time()
        sent = 0  # samples yielded so far, the audio time the pace is measured against
        try:
            for part in _parts(text):
                audio = await asyncio.to_thread(_SYNTHESIZER.say, part, rate, self._voice)
                await self.stop_ttfb_metrics()
                for start in range(0, len(audio), chunk):
                    if self._pace is not None:
                        due = started + self._pace * sent / rate
                        delay = due - loop.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    piece = audio[start : start + chunk]
                    sent += len(piece)
                    yield TTSAudioRawFrame(
                        audio=piece.tobytes(),
                        sample_rate=rate,
                        num_channels=1,
                        context_id=context_id,
                    )
        except (SynthesisError, ValueError) as exc:
            yield ErrorFrame(error=f"{self}: espeak-ng could not say it: {exc}")
        finally:
            await self.stop_ttfb_metrics()


def _parts(text: str) -> list[str]:
    """``text`` in pieces the synthesizer accepts (at most ``MAX_TEXT`` characters each): a
    ``TTSSpeakFrame`` is not cut into sentences by Pipecat, and a long one must still be said."""
    parts: list[str] = []
    for sentence in _SENTENCE_END.split(" ".join(text.split())):
        while len(sentence) > MAX_TEXT:
            cut = sentence.rfind(" ", 0, MAX_TEXT)
            cut = cut if cut > 0 else MAX_TEXT
            parts.append(sentence[:cut])
            sentence = sentence[cut:].strip()
        if sentence:
            if parts and len(parts[-1]) + 1 + len(sentence) <= MAX_TEXT:
                parts[-1] = f"{parts[-1]} {sentence}"
            else:
                parts.append(sentence)
    return parts


def speech(text: str, rate: int, voice: Voice | None = None) -> NDArray[np.int16]:
    """``text`` as espeak-ng says it at ``rate`` Hz (the service's voice by default): caller
    audio for tests and demos, from the same cache as the service."""
    return _SYNTHESIZER.say(text, rate, voice)
