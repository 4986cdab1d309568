"""Voice activity: webrtcvad's per-frame verdicts turned into speech started / stopped events.

webrtcvad classifies 10, 20 or 30 ms of mono s16 audio at 8, 16, 32 or 48 kHz. One verdict flips
on a breath or a click, so :class:`VoiceActivity` adds hysteresis: ``onset_ms`` of consecutive
speech verdicts before it reports :class:`SpeechStarted`, ``hangover_ms`` of consecutive non-speech
verdicts before :class:`SpeechStopped`. Events are dated on the call's own clock (sample index at
the frame's rate, see :mod:`audio.frame`) at the edge they describe, not at the frame that made the
decision: a speech start is the first speech frame of the onset run, a stop the first silent frame
of the hangover run. ``detected_at`` says when the decision could be made.

The media bridge delivers 20 ms frames; other VAD frame sizes are split (10 ms) or accumulated
(30 ms) here.

webrtcvad starts from built-in noise and speech models and calls the first few frames with any
energy speech whatever they hold (measured here on steady white noise from -80 to -40 dBFS: up to
140 ms at 20 ms frames, 180 ms at 30 ms, 400 ms at 10 ms). So verdicts of the first ``warmup_ms``
of audio, counted from the first frame that is not digital silence, are fed to webrtcvad (it
adapts on them) but read as silence. A caller who speaks at once is detected when the warm-up
ends, with that later timestamp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import webrtcvad

from audio.frame import FRAME_MS, FRAME_RATES, Frame, samples_per_frame

DETECTORS: Final = ("evidence", "verdicts")
VAD_FRAME_MS: Final = frozenset({10, 20, 30})
"""Frame durations webrtcvad accepts."""

SPEECH_MARGIN_DB: Final = 10.0
"""How far above the noise floor a speech verdict's frame must be to count in ``speech_ms``.

webrtcvad keeps calling frames speech for 60 to 100 ms after any burst (its internal overhang;
measured here: a 20 ms burst in -60 dBFS noise gave 80 to 100 ms of speech verdicts, a 100 ms one
160 to 180 ms), so counting verdicts alone would let a click pass any debounce under ~100 ms.
"""

NOISE_FLOOR_MS: Final = 200
"""Time constant of the noise-floor average over the frames webrtcvad calls non-speech."""

_PCM_DTYPE: Final = np.dtype("<i2")


class VadConfigError(ValueError):
    """A VAD setting out of range; the message names the field and what it accepts."""


@dataclass(frozen=True, slots=True)
class VadConfig:
    """How eager the VAD is and how much hysteresis it adds.

    ``aggressiveness`` is webrtcvad's mode: 0 calls most things speech, 3 is strictest (on noisy
    8 kHz lines mode 2 still flags much noise as speech; shared/notes/pjsua2.md). ``onset_ms`` and
    ``hangover_ms`` are rounded up to whole VAD frames and must be at least one 20 ms media frame,
    so one media frame can never both start and stop speech. ``warmup_ms`` of audio at the start
    are never called speech (see the module docstring; 10 ms frames need about 500).
    """

    aggressiveness: int = 2
    frame_ms: int = 20
    onset_ms: int = 60
    hangover_ms: int = 300
    warmup_ms: int = 200
    detector: str = "evidence"
    """``evidence`` (:class:`audio.evidence_vad.EvidenceVad`: verdicts that stand out of the
    tracked noise floor, onset over a window) or ``verdicts`` (:class:`VoiceActivity`: webrtcvad's
    verdicts with hysteresis, what voicegate did before issue 21)."""
    margin_db: float = 8.5
    """Evidence detector: how far above the noise floor a speech frame must be."""
    window_ms: int = 160
    """Evidence detector: speech starts when ``onset_ms`` of evidence lies within this window
    (the window is never shorter than ``onset_ms``)."""
    floor_rise_db_s: float = 3.0
    """Evidence detector: how fast the noise floor may rise while webrtcvad hears speech."""

    def __post_init__(self) -> None:
        if self.detector not in DETECTORS:
            raise VadConfigError(f"detector must be evidence or verdicts, got {self.detector!r}")
        if not 0.0 <= self.margin_db <= 40.0:
            raise VadConfigError(f"margin_db must be between 0 and 40, got {self.margin_db}")
        if not 0.1 <= self.floor_rise_db_s <= 60.0:
            raise VadConfigError(
                f"floor_rise_db_s must be between 0.1 and 60, got {self.floor_rise_db_s}"
            )
        if not FRAME_MS <= self.window_ms <= 2000:
            raise VadConfigError(f"window_ms must be between 20 and 2000, got {self.window_ms}")
        if self.aggressiveness not in (0, 1, 2, 3):
            raise VadConfigError(f"aggressiveness must be 0, 1, 2 or 3, got {self.aggressiveness}")
        if self.frame_ms not in VAD_FRAME_MS:
            raise VadConfigError(f"frame_ms must be 10, 20 or 30, got {self.frame_ms}")
        for name in ("onset_ms", "hangover_ms"):
            value = getattr(self, name)
            if not FRAME_MS <= value <= 10_000:
                raise VadConfigError(f"{name} must be between {FRAME_MS} and 10000, got {value}")
        if not 0 <= self.warmup_ms <= 10_000:
            raise VadConfigError(f"warmup_ms must be between 0 and 10000, got {self.warmup_ms}")

    @property
    def onset_frames(self) -> int:
        """Consecutive speech verdicts needed for :class:`SpeechStarted`."""
        return -(-self.onset_ms // self.frame_ms)

    @property
    def hangover_frames(self) -> int:
        """Consecutive non-speech verdicts needed for :class:`SpeechStopped`."""
        return -(-self.hangover_ms // self.frame_ms)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """The caller started speaking at ``timestamp`` (first speech frame of the onset run)."""

    timestamp: int
    rate: int
    detected_at: int
    """Sample index just past the frame whose verdict completed the onset run."""

    @property
    def timestamp_ms(self) -> float:
        return self.timestamp * 1000 / self.rate

    @property
    def detected_at_ms(self) -> float:
        return self.detected_at * 1000 / self.rate


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """The caller stopped speaking at ``timestamp`` (first silent frame of the hangover run)."""

    timestamp: int
    rate: int
    detected_at: int
    """Sample index just past the frame whose verdict completed the hangover run."""

    @property
    def timestamp_ms(self) -> float:
        return self.timestamp * 1000 / self.rate

    @property
    def detected_at_ms(self) -> float:
        return self.detected_at * 1000 / self.rate


VadEvent = SpeechStarted | SpeechStopped


class VoiceActivity:
    """Speech start/stop events for one call direction at one rate.

    Feed consecutive frames (normally 20 ms) with :meth:`process`. Besides the events it keeps
    :attr:`speaking` (the hysteresis state) and :attr:`speech_ms`: milliseconds of speech verdicts
    since the current speech segment's onset began (0 when not speaking), which barge-in uses to
    tell a cough from a sentence without being fooled by the hangover.
    """

    __slots__ = (
        "_alpha",
        "_buf",
        "_buf_ts",
        "_expect_ts",
        "_floor_db",
        "_hangover",
        "_onset",
        "_run",
        "_run_ts",
        "_speech_frames",
        "_step",
        "_vad",
        "_warmup",
        "_warmup_started",
        "config",
        "rate",
        "speaking",
    )

    def __init__(self, rate: int, config: VadConfig | None = None) -> None:
        if rate not in FRAME_RATES:
            raise VadConfigError(f"webrtcvad needs 8000, 16000, 32000 or 48000 Hz, got {rate}")
        self.config = config = config or VadConfig()
        self.rate = rate
        self._vad = webrtcvad.Vad(config.aggressiveness)
        self._step = samples_per_frame(rate, config.frame_ms) * 2  # bytes per VAD frame
        self._onset = config.onset_frames
        self._hangover = config.hangover_frames
        self.speaking = False
        self._run = 0  # consecutive verdicts that argue for leaving the current state
        self._run_ts = 0  # timestamp of the first frame of that run
        # Loud speech verdicts since the current segment's onset run began.
        self._speech_frames = 0
        self._floor_db: float | None = None  # level of non-speech frames, dB re 1 LSB^2
        self._alpha = min(1.0, config.frame_ms / NOISE_FLOOR_MS)
        self._buf = b""  # 30 ms mode: PCM not yet classified
        self._buf_ts = 0
        self._expect_ts = -1
        self._warmup = -(-config.warmup_ms // config.frame_ms)  # VAD frames still to ignore
        self._warmup_started = False

    @property
    def speech_ms(self) -> int:
        """Speech in the current segment so far, onset included; 0 when not speaking.

        Counts frames webrtcvad calls speech that are also :data:`SPEECH_MARGIN_DB` above the
        line's noise floor, so the frames webrtcvad's own overhang adds after a click do not count.
        """
        return self._speech_frames * self.config.frame_ms if self.speaking else 0

    @property
    def stirring(self) -> bool:
        """Speaking, or a run of speech verdicts that the next frames may make a segment."""
        return self.speaking or self._run > 0

    def process(self, frame: Frame) -> VadEvent | None:
        """Classify ``frame``; the event it completes, if any (at most one per 20 ms frame)."""
        if frame.rate != self.rate:
            raise ValueError(f"frame at {frame.rate} Hz fed to a {self.rate} Hz VAD")
        return self.process_pcm(frame.samples.tobytes(), frame.timestamp)

    def process_pcm(self, pcm: bytes, timestamp: int) -> VadEvent | None:
        """:meth:`process` on little-endian s16 bytes, for callers that hold the bridge's bytes."""
        step = self._step
        if len(pcm) == step and not self._buf:
            # The usual case: one media frame is one VAD frame.
            return self._verdict(self._classify(pcm), timestamp, step // 2)
        if timestamp != self._expect_ts:
            # A gap in the stream: a partial VAD frame from before it would glue unrelated audio.
            self._buf = b""
        self._expect_ts = timestamp + len(pcm) // 2
        if not self._buf:
            self._buf_ts = timestamp
        data = self._buf + pcm
        event: VadEvent | None = None
        at = 0
        while len(data) - at >= step:
            ts = self._buf_ts + at // 2
            found = self._verdict(self._classify(data[at : at + step]), ts, step // 2)
            if found is not None:
                # onset/hangover >= one media frame (VadConfig) keeps this to one per call.
                assert event is None, "two VAD events in one media frame"
                event = found
            at += step
        self._buf = data[at:]
        self._buf_ts += at // 2
        return event

    def _classify(self, pcm: bytes) -> tuple[bool, bool]:
        """webrtcvad's verdict, and whether the frame is loud enough to count as speech."""
        is_speech: bool = self._vad.is_speech(pcm, self.rate)
        if self._warmup:
            # Digital silence before the first audio does not use up the warm-up.
            if self._warmup_started or pcm.count(0) != len(pcm):
                self._warmup_started = True
                self._warmup -= 1
            is_speech = False
        x = np.frombuffer(pcm, dtype=_PCM_DTYPE).astype(np.float64)
        level_db = 10 * math.log10(float(x @ x) / len(x) + 1.0)
        if not is_speech:
            floor = self._floor_db
            self._floor_db = level_db if floor is None else floor + self._alpha * (level_db - floor)
            return False, False
        return True, self._floor_db is None or level_db >= self._floor_db + SPEECH_MARGIN_DB

    def _verdict(self, verdict: tuple[bool, bool], timestamp: int, length: int) -> VadEvent | None:
        is_speech, loud = verdict
        if loud:
            self._speech_frames += 1
        if is_speech != self.speaking:
            if self._run == 0:
                self._run_ts = timestamp
            self._run += 1
            if self.speaking and self._run >= self._hangover:
                self.speaking = False
                self._run = 0
                self._speech_frames = 0
                return SpeechStopped(self._run_ts, self.rate, timestamp + length)
            if not self.speaking:
                if self._run >= self._onset:
                    self.speaking = True
                    self._run = 0
                    return SpeechStarted(self._run_ts, self.rate, timestamp + length)
                return None
        else:
            self._run = 0
            if not self.speaking:
                self._speech_frames = 0
        return None
