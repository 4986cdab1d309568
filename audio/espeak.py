"""Text to speech with the espeak-ng command (Debian's espeak-ng 1.51, which scripts/bootstrap
installs): what an attended transfer's consultation says to the person on the consult leg.

The command runs as a subprocess awaited on the event loop (about 10 ms for a sentence,
shared/notes/speech.md) and its WAV is converted in a thread, so no call's task waits on it;
the text goes on stdin, never on the command line, so a text that starts with ``-`` is spoken,
not taken as an option. espeak-ng's
``--stdout`` WAV header has a bogus length field (notes/speech.md): the samples are read from
the ``data`` chunk's start to the end of the output instead.
"""

from __future__ import annotations

import asyncio
import shutil
import struct

import numpy as np
from numpy.typing import NDArray

from audio.resample import resample

ESPEAK = "espeak-ng"
ESPEAK_RATE = 22050  # what espeak-ng's voices speak at
MAX_TEXT_CHARS = 500  # a sentence or three: a consultation is not a reading
TIMEOUT_S = 10.0


class SynthesisError(RuntimeError):
    """The text could not be spoken (no espeak-ng, it failed, or its output was not a WAV)."""


def available() -> bool:
    return shutil.which(ESPEAK) is not None


def check_text(text: object) -> str | None:
    """Why ``text`` cannot be spoken (a message naming the rule), or None."""
    if not isinstance(text, str):
        return "text must be a string"
    if not text.strip():
        return "text must not be empty"
    if len(text) > MAX_TEXT_CHARS:
        return f"text must be at most {MAX_TEXT_CHARS} characters"
    if any(ord(c) < 32 and c not in "\t\n" for c in text):
        return "text must not hold control characters"
    return None


def wav_samples(data: bytes) -> tuple[int, NDArray[np.int16]]:
    """The rate and mono int16 samples of espeak-ng's WAV (its sizes are not trusted)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise SynthesisError("espeak-ng's output is not a WAV")
    pos, rate = 12, 0
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        if chunk == b"fmt ":
            channels, rate, bits = (
                struct.unpack_from("<H", data, body + 2)[0],
                struct.unpack_from("<I", data, body + 4)[0],
                struct.unpack_from("<H", data, body + 14)[0],
            )
            if channels != 1 or bits != 16:
                raise SynthesisError(f"espeak-ng's WAV is {channels} channels of {bits} bits")
        elif chunk == b"data":
            if not rate:
                raise SynthesisError("espeak-ng's WAV has no fmt chunk before its data")
            pcm = data[body : len(data) - (len(data) - body) % 2]
            return rate, np.frombuffer(pcm, dtype="<i2").astype(np.int16)
        pos = body + size + size % 2
    raise SynthesisError("espeak-ng's WAV has no data chunk")


async def speak(text: str, rate: int, *, voice: str = "en") -> NDArray[np.int16]:
    """``text`` spoken at ``rate`` Hz; :class:`SynthesisError` if it cannot be. Check the text
    with :func:`check_text` first."""
    try:
        process = await asyncio.create_subprocess_exec(
            ESPEAK,
            "-v",
            voice,
            "--stdin",
            "--stdout",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        raise SynthesisError(f"{ESPEAK} could not be started: {exc.strerror}") from None
    try:
        out, _ = await asyncio.wait_for(process.communicate(text.encode()), TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise SynthesisError(f"{ESPEAK} took over {TIMEOUT_S:.0f} s") from None
    if process.returncode != 0:
        raise SynthesisError(f"{ESPEAK} exited with {process.returncode}")
    # Parsing and resampling a few seconds takes milliseconds: off the loop all the same.
    return await asyncio.to_thread(_at_rate, out, rate)


def _at_rate(wav: bytes, rate: int) -> NDArray[np.int16]:
    source_rate, samples = wav_samples(wav)
    return samples if source_rate == rate else resample(samples, source_rate, rate)
