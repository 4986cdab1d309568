"""``PocketsphinxSTTService``: Pipecat speech recognition with pocketsphinx, offline, on a grammar.

What the caller may say is one JSGF grammar (:data:`GRAMMAR`): "pay [five euros]", "[what is my]
balance", "[talk to] a person", "tell me a story", "goodbye", "yes", "no", or one digit. A
grammar, not the full language model, because that is what makes pocketsphinx usable here
(docs/speech.md: about 4 intents in 10 with the language model). The grammar and its trimmed
pronunciation dictionary come from voicegate's :mod:`audio.speech.grammar`, which checks every
word against the model's dictionary at start-up.

Why not voicegate's streaming :class:`audio.speech.recognizer.Recognizer`: it finds utterances
itself with pocketsphinx's endpointer, while in a Pipecat pipeline the segment is already
decided (by the transport's speech detector, or Pipecat's VAD), and
:class:`~pipecat.services.stt_service.SegmentedSTTService` hands us the whole of it. So each
segment is decoded as one utterance (``full_utt``: the cepstral mean is taken over the whole
segment). Measured on espeak-ng speech at 8 kHz with three voices, whole-segment decoding got
more of the phrases right than the endpointer path did on the same audio ("tell me a story",
"talk to a person"); digit *sequences* in the grammar made silence and short words come out as
digits, hence one digit.

How a segment is delimited in Pipecat 1.14: ``SegmentedSTTService`` buffers audio between
``VADUserStartedSpeakingFrame`` and ``VADUserStoppedSpeakingFrame`` only (the VAD's frames), plus
about a second of audio from before the start. Our transport pushes ``UserStartedSpeakingFrame``
/ ``UserStoppedSpeakingFrame`` from voicegate's own speech detector and there is no Pipecat VAD,
so this service opens and closes segments on those too; a segment opened by one kind is closed by
the first stop of either kind, and a stop with no segment open is ignored.

The decoder: one per process, built on first use (about 0.2 s) and shared by every call under a
lock; recognition runs on a worker thread (``asyncio.to_thread``), never on the event loop. One
decoder is enough: pocketsphinx's Cython code never releases the GIL, so two decoders on two
threads are no faster than one (docs/speech.md), and a decoder is not thread-safe (the lock).
About 0.05 s of CPU per second of speech.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pipecat.frames.frames import (
    Frame,
    TranscriptionFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import STTSettings
from pipecat.services.stt_service import SegmentedSTTService
from pipecat.utils.time import time_now_iso8601
from pocketsphinx import Decoder

from audio.resample import resample
from audio.speech.grammar import Grammar, model_dir, trimmed_dictionary, vocabulary

log = logging.getLogger("example.pipecat_bot.stt")

MODEL_RATE = 16000  # the wheel's only model; 8 kHz calls are upsampled (docs/speech.md)
# The bindings' Hypothesis.score, 0 to 1. Whole-segment decoding of espeak-ng speech at 8 kHz
# (three voices): phrases in the grammar 0.55 to 0.78; speech outside it forced into the grammar
# 0.44 to 0.56, so this stops only part of that: the rules confirm nothing, but a payment is
# still only made on "pay" or the key 1. Below this, nothing is transcribed.
MIN_SCORE = 0.5
DITHER_SIGMA = 30.0  # about -61 dBFS: on digital silence the decoder drops the last word

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
GRAMMAR = Grammar(
    "pipecat_bot",
    f"""
public <pipecat_bot> = <command> | <digit>;
<command> = pay [five euros] | [what is my] balance | [talk to] a person | tell me a story
    | goodbye | yes | no;
<digit> = {" | ".join(DIGITS)};
""",
)


@dataclass(frozen=True, slots=True)
class Recognition:
    """What one segment came to. ``accepted``: the grammar accepts all of ``text`` and its
    ``confidence`` is at least :data:`MIN_SCORE`; otherwise ``reason`` says why not
    (``no_hypothesis``, ``not_in_grammar``, ``low_score``)."""

    text: str
    confidence: float
    accepted: bool
    reason: str = ""


class _SharedDecoder:
    """The process's decoder for :data:`GRAMMAR`; every use under :attr:`_lock`."""

    def __init__(self) -> None:
        self._decoder = Decoder(
            hmm=str(model_dir() / "en-us"),
            dict=str(trimmed_dictionary(vocabulary([GRAMMAR]))),
            lm=None,
            loglevel="FATAL",
        )
        self._decoder.add_jsgf_string(GRAMMAR.name, GRAMMAR.jsgf)
        self._decoder.activate_search(GRAMMAR.name)
        self._lock = threading.Lock()

    def decode(self, samples: NDArray[np.int16], rate: int, seed: int) -> Recognition:
        audio = resample(samples, rate, MODEL_RATE) if rate != MODEL_RATE else samples
        noise = np.random.default_rng(seed).normal(0.0, DITHER_SIGMA, len(audio))
        dithered = np.clip(audio + noise, -32768, 32767).astype(np.int16)
        decoder = self._decoder
        with self._lock:
            # A shared decoder must not carry one caller's voice into the next segment (the
            # front end adapts; audio/speech/recognizer.py measured the damage). 0.06 ms.
            decoder.reinit_feat()
            decoder.start_utt()
            decoder.process_raw(dithered.tobytes(), False, True)
            decoder.end_utt()
            hyp = decoder.hyp()
            text = " ".join(hyp.hypstr.split()) if hyp is not None else ""
            in_grammar = bool(text) and decoder.get_fsg(GRAMMAR.name).accept(text)
        if hyp is None or not text:
            return Recognition("", 0.0, False, "no_hypothesis")
        confidence = round(float(hyp.score), 3)
        if not in_grammar:
            return Recognition(text, confidence, False, "not_in_grammar")
        if confidence < MIN_SCORE:
            return Recognition(text, confidence, False, "low_score")
        return Recognition(text, confidence, True)


@functools.cache
def _shared_decoder() -> _SharedDecoder:
    return _SharedDecoder()


def recognise(samples: NDArray[np.int16], rate: int, *, seed: int = 0) -> Recognition:
    """One whole utterance at ``rate`` Hz against :data:`GRAMMAR`. Blocking (tens of
    milliseconds, the GIL held): call it from a worker thread. Thread-safe."""
    return _shared_decoder().decode(samples, rate, seed)


class PocketsphinxSTTService(SegmentedSTTService):
    """Offline recognition of the bot's phrases; one ``TranscriptionFrame`` per accepted segment.

    ``user_id``: the transcriptions' user (default ``"caller"``). ``trailing_silence_secs``
    (Pipecat's): silence added after each segment so its last word can end. A segment that is
    rejected (see :class:`Recognition`) yields nothing: it is logged, never guessed at.
    """

    def __init__(
        self,
        *,
        user_id: str = "caller",
        trailing_silence_secs: float = 0.3,
        **kwargs: Any,
    ) -> None:
        # Every settings field set (None: not applicable), or Pipecat logs an error at start.
        kwargs.setdefault(
            "settings", STTSettings(model=f"pocketsphinx-{GRAMMAR.name}", language=None)
        )
        # A segment is decoded whole once the turn ends: 8-20 ms for a phrase of the grammar
        # here (measured once decoded; the first build of the decoder takes longer). The
        # turn-stop strategy waits this long for the text: a loaded machine gets a margin.
        kwargs.setdefault("ttfs_p99_latency", 0.3)
        super().__init__(trailing_silence_secs=trailing_silence_secs, **kwargs)
        self._caller = user_id
        self._segment_open = False
        self._segments = 0

    @property
    def wants_wav_segments(self) -> bool:
        return False  # raw 16-bit PCM: the decoder reads samples, not a WAV file

    def can_generate_metrics(self) -> bool:
        return True

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        # The transport's turn frames delimit segments too (see the module docstring). Only
        # downstream ones: the user aggregator broadcasts its own upstream.
        if direction is not FrameDirection.DOWNSTREAM:
            return
        if isinstance(frame, UserStartedSpeakingFrame):
            await self._handle_user_started_speaking(VADUserStartedSpeakingFrame())
        elif isinstance(frame, UserStoppedSpeakingFrame):
            await self._handle_user_stopped_speaking(VADUserStoppedSpeakingFrame())

    async def _handle_user_started_speaking(self, frame: VADUserStartedSpeakingFrame) -> None:
        if not self._segment_open:
            self._segment_open = True
            await super()._handle_user_started_speaking(frame)

    async def _handle_user_stopped_speaking(self, frame: VADUserStoppedSpeakingFrame) -> None:
        if self._segment_open:
            self._segment_open = False
            await super()._handle_user_stopped_speaking(frame)

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        """The transcription of one segment (raw 16-bit PCM at the input rate), if accepted."""
        await self.start_processing_metrics()
        samples = np.frombuffer(audio, dtype=np.int16)
        self._segments += 1
        heard = await asyncio.to_thread(recognise, samples, self.sample_rate, seed=self._segments)
        await self.stop_processing_metrics()
        if not heard.accepted:
            log.info(
                "stt.rejected",
                extra={"reason": heard.reason, "confidence": heard.confidence},
            )
            return
        yield TranscriptionFrame(
            text=heard.text,
            user_id=self._caller,
            timestamp=time_now_iso8601(),
            result=heard,
        )
