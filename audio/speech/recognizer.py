"""One caller's speech recognition: 20 ms frames in, utterances out, against the active grammar.

pocketsphinx's endpointer finds where speech starts and ends on 20 ms frames; the frames inside
go to a decoder whose search is the grammar of the dialog state. Calls at 8 kHz are upsampled
to 16 kHz (the only model in the wheel is 16 kHz, and its feat.params refuses 8 kHz). A little
seeded noise is added: on digital silence the decoder drops the last word. After the endpointer
says speech ended, a few more frames go to the decoder so the last word can end in silence
(measured: without them "talk to a person" came out "talk to a").

An utterance is *accepted* only if there is a hypothesis, the grammar accepts the whole of it
(the grammar search returns its best partial path when it cannot finish) and its score is not
below :data:`MIN_SCORE`; anything else is *rejected*, never guessed at. Out-of-grammar speech can
still be forced into the grammar: callers of this module confirm before acting on it.

Not thread-safe: a decoder belongs to one thread (cmusphinx/pocketsphinx issue 364).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from pocketsphinx import Decoder, Endpointer

from audio.frame import samples_per_frame
from audio.resample import StreamResampler
from audio.speech.grammar import Grammar, GrammarError, model_dir, trimmed_dictionary, vocabulary

MODEL_RATE = 16000
# The bindings' Hypothesis.score, 0 to 1: espeak-ng speech that was in the grammar scored 0.48
# to 0.90, sentences forced into the grammar 0.41 to 0.53 (docs/speech.md). Below this: rejected.
MIN_SCORE = 0.45
DITHER_SIGMA = 30.0  # about -61 dBFS: enough that digital silence keeps the last word
TAIL_FRAMES = 15  # 300 ms after the endpointer's end of speech
MAX_UTTERANCE_S = 10.0  # a caller who never stops is cut here (and rejected if not in grammar)
VAD_MODE = 2
ENDPOINTER_WINDOW_FRAMES = 15  # 0.3 s
_FRAME = samples_per_frame(MODEL_RATE)


@dataclass(frozen=True, slots=True)
class Heard:
    """What one utterance came to. ``text`` is the decoder's words (empty when there were none);
    ``reason`` why it was rejected: ``no_hypothesis``, ``not_in_grammar``, ``low_score`` or
    ``decoder_error`` (empty when accepted). ``ended_ms`` is where its speech ended, in
    milliseconds of the stream's audio since it was opened (or restarted): callers line it up
    with what else they know of the same audio, such as the session's caller turns."""

    text: str
    grammar: str
    confidence: float
    accepted: bool
    reason: str = ""
    speech_ms: int = 0
    ended_ms: int = 0


class Recognizer:
    """Recognition of one audio stream at ``rate`` Hz against one of ``grammars`` at a time."""

    def __init__(
        self,
        grammars: Sequence[Grammar],
        rate: int,
        *,
        seed: int = 0,
        options: Mapping[str, object] | None = None,
    ) -> None:
        """``options`` are further pocketsphinx settings (``ds``, ``topn``, ``bestpath``, ...)
        over its defaults: bench/speech_options.py weighs what they save against what they
        mishear; voicegate itself runs on the defaults."""
        if not grammars:
            raise GrammarError("a recognizer needs at least one grammar")
        names = [g.name for g in grammars]
        if len(set(names)) != len(names):
            raise GrammarError(f"grammar names repeat: {names}")
        words = vocabulary(grammars)
        self._decoder = Decoder(
            hmm=str(model_dir() / "en-us"),
            dict=str(trimmed_dictionary(words)),
            lm=None,
            loglevel="FATAL",
            **(options or {}),
        )
        for grammar in grammars:
            self._decoder.add_jsgf_string(grammar.name, grammar.jsgf)
        self.grammars = tuple(grammars)
        self.grammar = grammars[0].name
        self._decoder.activate_search(self.grammar)
        self._names = frozenset(names)
        self._in_utterance = False
        self._tail = 0
        self._endpointer: Endpointer = _endpointer()
        self.restart(rate, seed=seed)

    def restart(self, rate: int, *, seed: int = 0) -> None:
        """Start over for a new stream at ``rate`` Hz, listening with the first grammar. The
        decoder is kept: building one costs 15 to 25 ms with the GIL held, so the recognition
        thread reuses them from call to call."""
        self._abandon()
        # The front end adapts to what it hears (the cepstral mean moves utterance after
        # utterance): a reused decoder must not carry the last caller's voice and line into the
        # next call. Measured on the spoken-payment script over G.722 with a few frames lost to
        # jitter: "goodbye" came out "i would like" in 13 of 40 calls on a decoder that had
        # served a call before, in none of 40 on a new one. Rebuilding the front end costs
        # 0.06 ms and starts it as new.
        self._decoder.reinit_feat()
        first = self.grammars[0].name
        if self.grammar != first:
            self._decoder.activate_search(first)
            self.grammar = first
        self._upsample = StreamResampler(rate, MODEL_RATE) if rate != MODEL_RATE else None
        self._rng = np.random.default_rng(seed)
        self._pending = np.zeros(0, dtype=np.int16)
        self._speech_frames = 0
        self.frames = 0  # 20 ms model frames seen: the position Heard.ended_ms is counted in

    def use(self, grammar: str) -> None:
        """Listen with ``grammar`` from the next utterance on (one in progress is dropped)."""
        if grammar not in self._names:
            raise GrammarError(f"no grammar named {grammar!r}; have {sorted(self._names)}")
        self._abandon()
        if grammar != self.grammar:
            self._decoder.activate_search(grammar)
            self.grammar = grammar

    def reset(self) -> None:
        """Forget the utterance in progress (the prompt changed under the caller's feet)."""
        self._abandon()

    def feed(self, samples: NDArray[np.int16]) -> list[Heard]:
        """Caller audio at the stream's rate; the utterances that ended in it."""
        if self._upsample is not None:
            samples = self._upsample.process(samples)
        noise = self._rng.normal(0.0, DITHER_SIGMA, len(samples))
        dithered = np.clip(samples + noise, -32768, 32767).astype(np.int16)
        data = np.concatenate((self._pending, dithered)) if len(self._pending) else dithered
        heard: list[Heard] = []
        whole = len(data) - len(data) % _FRAME
        for start in range(0, whole, _FRAME):
            result = self._frame(data[start : start + _FRAME].tobytes())
            if result is not None:
                heard.append(result)
        self._pending = data[whole:]
        return heard

    def _frame(self, frame: bytes) -> Heard | None:
        self.frames += 1
        decoder = self._decoder
        if self._tail:
            decoder.process_raw(frame, False, False)
            self._tail -= 1
            return self._finish(TAIL_FRAMES) if self._tail == 0 else None
        speech = self._endpointer.process(frame)
        if speech is None:
            return None
        # Also right after an utterance cut at MAX_UTTERANCE_S while the endpointer still hears
        # speech (a caller on a noisy line "talks" without end): the rest is a new utterance.
        # Feeding a decoder with none started makes its end_utt fail for every later one.
        if not self._in_utterance:
            decoder.start_utt()
            self._in_utterance = True
            self._speech_frames = 0
        decoder.process_raw(speech, False, False)
        self._speech_frames += 1
        if not self._endpointer.in_speech:
            self._tail = TAIL_FRAMES
        elif self._speech_frames * 0.02 >= MAX_UTTERANCE_S:
            return self._finish(0)
        return None

    def _finish(self, tail: int) -> Heard:
        """The utterance that ended ``tail`` frames ago."""
        decoder = self._decoder
        self._in_utterance = False
        self._tail = 0
        speech_ms = self._speech_frames * 20
        # The endpointer hands speech over about a window late; the tail came after its end.
        ended = max(0, (self.frames - ENDPOINTER_WINDOW_FRAMES - tail) * 20)
        try:
            decoder.end_utt()
        except RuntimeError:
            # The decoder refused to close the utterance: reject it (re-prompt, never a guess)
            # and start the next one clean rather than fail every utterance after it.
            self._endpointer = _endpointer()
            return Heard("", self.grammar, 0.0, False, "decoder_error", speech_ms, ended)
        hyp = decoder.hyp()
        text = " ".join(hyp.hypstr.split()) if hyp is not None else ""
        if not text:
            return Heard("", self.grammar, 0.0, False, "no_hypothesis", speech_ms, ended)
        confidence = round(float(hyp.score), 3) if hyp is not None else 0.0
        if not decoder.get_fsg(self.grammar).accept(text):
            return Heard(text, self.grammar, confidence, False, "not_in_grammar", speech_ms, ended)
        if confidence < MIN_SCORE:
            return Heard(text, self.grammar, confidence, False, "low_score", speech_ms, ended)
        return Heard(text, self.grammar, confidence, True, "", speech_ms, ended)

    def _abandon(self) -> None:
        if self._in_utterance:
            self._in_utterance = False
            with contextlib.suppress(RuntimeError):  # dropped anyway: a refusal changes nothing
                self._decoder.end_utt()
        self._tail = 0
        self._endpointer = _endpointer()


def _endpointer() -> Endpointer:
    # 0.3 s window, 90 % of it voiced to start or end speech: the bindings' defaults, on the
    # 20 ms frames the media path already has.
    return Endpointer(
        window=ENDPOINTER_WINDOW_FRAMES * 0.02,
        ratio=0.9,
        vad_mode=VAD_MODE,
        sample_rate=MODEL_RATE,
        frame_length=0.02,
    )
