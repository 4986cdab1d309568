"""Speech out: espeak-ng in process (``libespeak-ng.so.1`` through ctypes), cached per sentence.

The library's synchronous mode hands the samples to a callback while ``espeak_Synth`` runs, a
few milliseconds for a sentence (the command would cost a process start and a WAV with a bogus
length). espeak-ng keeps global state (one voice, one rate, one callback), so every synthesis
holds one lock; ctypes releases the GIL while the library runs. Each distinct (text, voice,
words per minute, rate) is synthesised once and kept, read-only, in a bounded LRU cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from audio.resample import resample

# espeak-ng's speak_lib.h: output modes, parameters and flags used here.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_ESPEAK_RATE = 1
_POS_CHARACTER = 1
_ESPEAK_CHARS_UTF8 = 1
_EE_OK = 0
_LIBRARY = "libespeak-ng.so.1"
# Words per minute espeak-ng accepts (speak_lib.h: 80 to 450).
MIN_WPM, MAX_WPM = 80, 450
MAX_TEXT = 500  # characters: a sentence, not a document
CACHE_SIZE = 256
# Below -46 dBFS counts as silence (as for the recorded prompts, scripts/make_prompts.py).
_SILENCE = 32768 * 10 ** (-46 / 20)
_PEAK = 32768 * 10 ** (-3 / 20)

_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class SynthesisError(RuntimeError):
    """espeak-ng is missing or refused the request; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Voice:
    """An espeak-ng voice name (``en-us``, ``en-gb``, ``en-us+f3``) and speed in words/minute."""

    name: str = "en-us"
    wpm: int = 160

    def __post_init__(self) -> None:
        if not MIN_WPM <= self.wpm <= MAX_WPM:
            raise ValueError(f"voice speed must be {MIN_WPM} to {MAX_WPM} words a minute")
        if not self.name or not all(c.isalnum() or c in "-+_" for c in self.name):
            raise ValueError(f"voice name {self.name!r} is not an espeak-ng voice name")


class _Engine:
    """The library, initialised once; every use under :attr:`lock`."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL(ctypes.util.find_library("espeak-ng") or _LIBRARY)
        except OSError as exc:
            raise SynthesisError(
                f"cannot load {_LIBRARY} ({exc}): install espeak-ng (scripts/bootstrap does)"
            ) from None
        self.lock = threading.Lock()
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.rate = self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, 0)
        if self.rate <= 0:
            raise SynthesisError("espeak-ng failed to initialise (is espeak-ng-data installed?)")
        self._chunks: list[NDArray[np.int16]] = []
        # Kept on self: ctypes would free the thunk while the library still points at it.
        self._callback = _SynthCallback(self._collect)
        self.lib.espeak_SetSynthCallback(self._callback)
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]  # fmt: skip

    def _collect(self, wav: ctypes._Pointer[ctypes.c_short], count: int, _events: int) -> int:
        if count > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).astype(np.int16))
        return 0  # go on

    def speak(self, text: str, voice: Voice) -> NDArray[np.int16]:
        data = text.encode("utf-8") + b"\0"
        with self.lock:
            if self.lib.espeak_SetVoiceByName(voice.name.encode()) != _EE_OK:
                raise SynthesisError(f"espeak-ng has no voice {voice.name!r}")
            self.lib.espeak_SetParameter(_ESPEAK_RATE, voice.wpm, 0)
            self._chunks = []
            status = self.lib.espeak_Synth(
                data, len(data), 0, _POS_CHARACTER, 0, _ESPEAK_CHARS_UTF8, None, None
            )
            chunks, self._chunks = self._chunks, []
        if status != _EE_OK:
            raise SynthesisError(f"espeak-ng could not synthesise the sentence (status {status})")
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(chunks)


_engine: _Engine | None = None
_engine_lock = threading.Lock()


def _get_engine() -> _Engine:
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = _Engine()
        return _engine


def _trimmed(samples: NDArray[np.int16], rate: int) -> NDArray[np.int16]:
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > _SILENCE)
    if len(loud) == 0:
        return samples[:0]
    start = max(0, int(loud[0]) - round(0.03 * rate))
    return samples[start : min(len(samples), int(loud[-1]) + 1 + round(0.06 * rate))]


class Synthesizer:
    """Sentences as int16 audio at a call's rate, trimmed and at a -3 dBFS peak, like the prompts.

    Thread-safe. Arrays returned are shared between callers and read-only.
    """

    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self._cache: OrderedDict[tuple[str, Voice, int], NDArray[np.int16]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.synthesised = 0  # cache misses, for tests and the bench

    def say(self, text: str, rate: int, voice: Voice | None = None) -> NDArray[np.int16]:
        """``text`` spoken by ``voice`` (default en-us at 160 words a minute) at ``rate`` Hz."""
        text = " ".join(text.split())
        if not text:
            raise ValueError("nothing to say: the text is empty")
        if len(text) > MAX_TEXT:
            raise ValueError(f"text of {len(text)} characters is over the {MAX_TEXT} allowed")
        voice = voice or Voice()
        key = (text, voice, rate)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        engine = _get_engine()
        raw = _trimmed(engine.speak(text, voice), engine.rate)
        audio = resample(raw, engine.rate, rate).astype(np.float64) if len(raw) else None
        out = np.zeros(0, dtype=np.int16)
        if audio is not None and len(audio):
            audio *= _PEAK / max(1.0, float(np.abs(audio).max()))
            out = np.rint(audio).astype(np.int16)
        out.flags.writeable = False
        with self._lock:
            self.synthesised += 1
            self._cache[key] = out
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return out
