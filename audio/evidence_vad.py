"""Speech that stands out of the line's noise: webrtcvad per frame, judged against a tracked floor.

webrtcvad alone calls much telephone noise speech (issue 21: pink noise 18 dB under speech cut a
greeting, brown noise committed caller turns), and one verdict per frame with a fixed debounce is
one threshold. :class:`EvidenceVad` keeps webrtcvad as the per-frame detector and adds:

* a **noise floor**: the plain mean level (in dB) of the line's first 400 ms, then the average
  level (over about 400 ms) of the frames that are not evidence, falling faster to quieter frames
  but by at most ``FLOOR_FALL_MAX_DB`` a frame; evidence frames raise it by at most
  ``floor_rise_db_s`` decibels a second, so speech barely moves it while a line that got louder
  under continuous "speech" is still learnt. Levels are of the whole band (pre-emphasis, which
  would take out the rumble, lost more speech than noise over pink and babble: bench/vad_sweep.py).
* **evidence**: a frame counts only if webrtcvad calls it speech *and* its level is ``margin_db``
  above the floor (*full* evidence), or ``margin_db - 3.5`` (*weak*: hysteresis keeps weaker
  syllables once speech has started).
* **onset on a window**: speech starts when ``onset_ms`` of evidence lies within the last
  ``window_ms``, at least two of its frames full and the rest at least weak, dated at the
  window's first evidence frame; it stops after ``hangover_ms`` without any. So one loud click
  is not a start, a word with a weak consonant still is, and where the frame edges fall within
  a short first syllable does not decide whether it starts.

Same events and interface as :class:`audio.vad.VoiceActivity` (which stays as the ``verdicts``
detector). Each 20 ms media frame is one webrtcvad frame of 20 ms here; the cost per frame is one
webrtcvad call and a dot product (bench/pipeline.py measures it).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

import numpy as np
import webrtcvad

from audio.frame import FRAME_MS, FRAME_RATES, Frame, samples_per_frame
from audio.vad import SpeechStarted, SpeechStopped, VadConfig, VadConfigError, VadEvent

_PCM_DTYPE: Final = np.dtype("<i2")
SPEAKING_RELIEF_DB: Final = 3.5
"""How much less than ``margin_db`` a frame needs once speech has started (hysteresis), and the
onset's frames beyond its ``ONSET_FULL_FRAMES``: 5 dB out of the floor at the default margin, as
before the onset took weak frames (at 5.5 a comma's pause split a line: bench/vad_sweep.py)."""
NOISE_TAU_MS: Final = 400
"""Time constant of the floor's average over frames that are not evidence: the line's noise
level, not its minimum (babble's quiet moments are 10 dB under its mean; speech 10 dB above)."""
FLOOR_FALL_MAX_DB: Final = 0.5
"""Most the floor falls in one frame: one frame's dip (a packet's loss, a gap in babble) is no
quieter line, and babble stood 8 dB out of a floor two dips had pulled down."""
LEARN_FRAMES: Final = 20
"""Frames of audio (400 ms) over which the floor is learnt from every frame, evidence or not."""
ONSET_FULL_FRAMES: Final = 2
"""Frames of an onset that must stand the whole ``margin_db`` out of the floor; the rest of its
``onset_ms`` may be as weak as a speaking caller's (``margin_db - SPEAKING_RELIEF_DB``). Three
full frames made the start hang on where the frame edges fell: the same line, shifted by a
fraction of a frame, was detected 180 ms or 780 ms after its first sample."""
_NONE: Final = 0
_WEAK: Final = 1
_FULL: Final = 2
FLOOR_FALL: Final = 0.1
"""Share of the way to a quieter frame's level the floor moves at once (up to FLOOR_FALL_MAX_DB):
noise that stops is forgotten within a second."""


class EvidenceVad:
    """Speech start/stop events for one call direction, on evidence against the noise floor.

    Feed consecutive 20 ms frames with :meth:`process_pcm`. :attr:`speaking` is the hysteresis
    state; :attr:`speech_ms` the milliseconds of evidence since the current segment's first
    evidence frame (0 when not speaking); :attr:`floor_db` the tracked noise floor (dB re 1 LSB^2,
    ``None`` before the first frame with any audio).
    """

    __slots__ = (
        "_alpha",
        "_evidence_ms",
        "_full",
        "_hangover",
        "_heard",
        "_onset",
        "_quiet",
        "_rise",
        "_step",
        "_vad",
        "_warmup",
        "_window",
        "config",
        "floor_db",
        "rate",
        "speaking",
    )

    def __init__(self, rate: int, config: VadConfig | None = None) -> None:
        if rate not in FRAME_RATES:
            raise VadConfigError(f"webrtcvad needs 8000, 16000, 32000 or 48000 Hz, got {rate}")
        self.config = config = config or VadConfig()
        self.rate = rate
        if config.frame_ms != FRAME_MS:
            raise VadConfigError(
                f"frame_ms must be {FRAME_MS} with the evidence detector, got {config.frame_ms}"
            )
        self._vad = webrtcvad.Vad(config.aggressiveness)
        self._step = samples_per_frame(rate, FRAME_MS) * 2
        self._onset = -(-config.onset_ms // FRAME_MS)
        # An onset of one frame (onset_ms 20) is one full frame, not two.
        self._full = min(ONSET_FULL_FRAMES, self._onset)
        self._hangover = -(-config.hangover_ms // FRAME_MS)
        # (timestamp, strength) of the last window_ms of frames.
        self._window: deque[tuple[int, int]] = deque(
            maxlen=max(self._onset, config.window_ms // FRAME_MS)
        )
        self._rise = config.floor_rise_db_s * FRAME_MS / 1000
        self._alpha = FRAME_MS / NOISE_TAU_MS
        self._warmup = -(-config.warmup_ms // FRAME_MS)
        self._heard = 0  # frames with any audio so far, while the floor is still being learnt
        self._quiet = 0  # frames without evidence since the last evidence frame
        self._evidence_ms = 0
        self.speaking = False
        self.floor_db: float | None = None

    @property
    def speech_ms(self) -> int:
        """Evidence in the current segment so far, onset included; 0 when not speaking."""
        return self._evidence_ms if self.speaking else 0

    @property
    def stirring(self) -> bool:
        """Speaking, or a full evidence frame in the window that the next frames may make an
        onset of (an onset needs full frames: weak ones alone never start one)."""
        return self.speaking or any(strength == _FULL for _, strength in self._window)

    def process(self, frame: Frame) -> VadEvent | None:
        """Classify ``frame`` (20 ms at this detector's rate); the event it completes, if any."""
        if frame.rate != self.rate:
            raise ValueError(f"frame at {frame.rate} Hz fed to a {self.rate} Hz VAD")
        return self.process_pcm(frame.samples.tobytes(), frame.timestamp)

    def process_pcm(self, pcm: bytes, timestamp: int) -> VadEvent | None:
        """:meth:`process` on one 20 ms frame of little-endian s16 bytes."""
        if len(pcm) != self._step:
            # The media bridge always hands over 20 ms; anything else is a caller's bug.
            raise ValueError(
                f"expected {self._step} bytes (20 ms at {self.rate} Hz), got {len(pcm)}"
            )
        strength = self._grade(pcm)
        length = self._step // 2
        window = self._window
        window.append((timestamp, strength))
        if not self.speaking:
            if strength == _NONE:
                return None
            count = sum(1 for _, s in window if s)
            if count < self._onset or sum(1 for _, s in window if s == _FULL) < self._full:
                return None
            self.speaking = True
            self._quiet = 0
            self._evidence_ms = count * FRAME_MS
            first = next(ts for ts, s in window if s)
            return SpeechStarted(first, self.rate, timestamp + length)
        if strength:
            self._quiet = 0
            self._evidence_ms += FRAME_MS
            return None
        self._quiet += 1
        if self._quiet < self._hangover:
            return None
        self.speaking = False
        self._evidence_ms = 0
        window.clear()
        stopped_at = timestamp - (self._hangover - 1) * length
        return SpeechStopped(stopped_at, self.rate, timestamp + length)

    def _grade(self, pcm: bytes) -> int:
        """How much speech evidence ``pcm`` is (_FULL, _WEAK or _NONE); moves the floor."""
        is_speech: bool = self._vad.is_speech(pcm, self.rate)
        if pcm.count(0) == len(pcm):
            # Digital silence (no RTP yet, a gap PJSIP filled) says nothing of the line's noise.
            return _NONE
        if self._warmup:
            # webrtcvad's first frames of any audio are speech whatever they hold (audio/vad.py);
            self._warmup -= 1
            is_speech = False
        x = np.frombuffer(pcm, dtype=_PCM_DTYPE).astype(np.float64)
        level = 10 * math.log10(float(x @ x) / len(x) + 1.0)
        floor = self.floor_db
        if floor is None:
            self.floor_db = level
            self._heard = 1
            return _NONE
        margin = self.config.margin_db
        if not is_speech or level < floor + margin - SPEAKING_RELIEF_DB:
            strength = _NONE
        elif level >= floor + margin:
            strength = _FULL
        else:
            # Evidence for a caller already speaking, and inside an onset that has full frames.
            strength = _WEAK
        evidence = strength == _FULL or (strength == _WEAK and self.speaking)
        # The floor starts as the plain mean of the line's first frames and only then becomes a
        # moving average: started from one frame, it kept that frame's luck (a quiet instant of
        # babble is 10 dB under its mean), and babble then stood out of a floor it could not
        # catch up with (speech raises it slowly), so a silent caller cut the greeting.
        if self._heard < LEARN_FRAMES:
            self._heard += 1
            self.floor_db = floor + (level - floor) / self._heard
        elif evidence:
            # Speech barely moves it: a line whose noise got louder is still learnt, slowly.
            self.floor_db = min(level, floor + self._rise)
        elif level < floor:
            self.floor_db = floor - min(FLOOR_FALL * (floor - level), FLOOR_FALL_MAX_DB)
        else:
            self.floor_db = floor + self._alpha * (level - floor)
        return strength
