"""Text said to the person on a consult leg: the real espeak-ng (audio/espeak.py) and the task
that hands its samples to the call's task (voicegate/call/consult_speech.py)."""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest
from numpy.typing import NDArray

from audio.espeak import MAX_TEXT_CHARS, SynthesisError, check_text, speak, wav_samples
from voicegate.call.consult_speech import ConsultSpeech
from voicegate.call.control import AgentWork


def _wav(samples: list[int], rate: int = 22050, data_size: int = 0x7FFFFFFF) -> bytes:
    # espeak-ng --stdout writes a bogus size for the stream: it must not be trusted.
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    pcm = struct.pack(f"<{len(samples)}h", *samples)
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
        + b"fmt " + struct.pack("<I", len(fmt)) + fmt
        + b"data" + struct.pack("<I", data_size) + pcm
    )  # fmt: skip


def test_the_wav_is_read_to_its_end_whatever_its_sizes_say() -> None:
    rate, samples = wav_samples(_wav([1, -2, 300]) + b"\x07")  # a stray odd byte at the end
    assert rate == 22050 and samples.tolist() == [1, -2, 300]
    for junk in (b"", b"RIFF\x00\x00\x00\x00WAVX", _wav([1])[:36]):
        with pytest.raises(SynthesisError):
            wav_samples(junk)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("x" * (MAX_TEXT_CHARS + 1), "at most"),
        ("bell\x07", "control"),
        (42, "string"),
    ],
)
def test_a_text_that_cannot_be_spoken_is_refused_with_the_rule(text: object, why: str) -> None:
    refusal = check_text(text)
    assert refusal is not None and why in refusal


def test_espeak_speaks_a_sentence_at_the_calls_rate() -> None:
    samples = asyncio.run(speak("-v A caller wants a refund.", 8000))  # a leading - is text
    assert samples.dtype == np.int16
    assert 0.8 < len(samples) / 8000 < 5
    assert np.abs(samples.astype(np.int32)).max() > 3000  # speech, not silence


def test_the_samples_reach_the_calls_task_through_its_queue_and_a_stop_means_never() -> None:
    async def run() -> tuple[list[object], list[tuple[NDArray[np.int16] | None, str]]]:
        queue: asyncio.Queue[object] = asyncio.Queue()
        speech = ConsultSpeech(queue.put_nowait)
        got: list[tuple[NDArray[np.int16] | None, str]] = []
        speech.synthesize("Hello there.", 16000, lambda s, why: got.append((s, why)))
        stop = speech.synthesize("Never said.", 16000, lambda s, why: got.append((s, why)))
        stop()
        work = await asyncio.wait_for(queue.get(), 10)
        assert got == []  # nothing runs outside the call's task
        assert isinstance(work, AgentWork)
        work.run()
        await asyncio.sleep(0)
        speech.cancel_all()
        return [queue.qsize()], got

    left, got = asyncio.run(run())
    assert left == [0]
    ((samples, why),) = got
    assert why == "" and samples is not None and len(samples) > 8000
