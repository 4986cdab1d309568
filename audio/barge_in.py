"""Barge-in: when the caller's speech (or a key press) must cut the agent off.

Pure decision logic: no clock, no I/O. Each inbound frame brings the VAD's event (if any), the
speech accumulated in the current segment, and which response is playing; the answer is an
:class:`Interrupt` or ``None``. Acting on it (bump the generation, :meth:`Playout.interrupt`, tell
the agent what was heard) is the caller's single step.

The rules:

* speech triggers only if its segment started (VAD :class:`~audio.vad.SpeechStarted`) while a
  response was playing, and only once the segment holds ``min_speech_ms`` of speech verdicts, so a
  cough does not cut the agent off; speech that began before the agent did is the caller's turn
  running on, not a barge-in;
* a DTMF key press triggers at once when ``dtmf`` is on;
* nothing triggers while nothing plays, and a response is interrupted at most once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from audio.frame import FRAME_MS
from audio.vad import SpeechStarted, SpeechStopped, VadEvent


class BargeInConfigError(ValueError):
    """A barge-in setting out of range; the message names the field."""


@dataclass(frozen=True, slots=True)
class BargeInConfig:
    """``enabled`` switches barge-in off entirely; ``min_speech_ms`` is the speech a segment must
    hold before it interrupts (the VAD's own onset counts towards it); ``dtmf`` lets a key press
    interrupt."""

    enabled: bool = True
    min_speech_ms: int = 60
    dtmf: bool = True
    turn_min_speech_ms: int = 0
    """Speech a segment must hold to become a caller turn (voicegate/call/turns.py)."""
    false_window_ms: int = 2500
    """A speech barge-in with no committed caller turn this long after it is a false one."""

    def __post_init__(self) -> None:
        for name in ("min_speech_ms", "turn_min_speech_ms"):
            value = getattr(self, name)
            if not 0 <= value <= 10_000:
                raise BargeInConfigError(f"{name} must be between 0 and 10000, got {value}")
        if not 200 <= self.false_window_ms <= 30_000:
            raise BargeInConfigError(
                f"false_window_ms must be between 200 and 30000, got {self.false_window_ms}"
            )


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Interrupt ``response_id`` now.

    ``onset_timestamp`` is on the inbound clock (samples at the call rate): the first speech frame
    of the segment for ``"speech"``, the timestamp given with the key press for ``"dtmf"``.
    """

    reason: Literal["speech", "dtmf"]
    onset_timestamp: int
    response_id: str


class BargeIn:
    """Barge-in decisions for one call; feed every inbound frame to :meth:`on_frame`."""

    __slots__ = ("_in_segment", "_onset", "_segment_response", "_triggered", "config")

    def __init__(self, config: BargeInConfig | None = None) -> None:
        self.config = config or BargeInConfig()
        self._in_segment = False
        self._onset = 0
        self._segment_response: str | None = None  # what was playing when the segment started
        self._triggered: str | None = None  # the last response interrupted

    def on_frame(
        self, event: VadEvent | None, speech_ms: int, playing: str | None
    ) -> Interrupt | None:
        """One inbound frame: its VAD ``event``, the VAD's ``speech_ms`` after it, and the id of
        the response playing (``Playout.playing``; ``None`` when idle)."""
        if isinstance(event, SpeechStarted):
            self._in_segment = True
            self._onset = event.timestamp
            self._segment_response = playing
        decision = None
        if (
            self._in_segment
            and playing is not None
            and self.armed(playing)
            and speech_ms >= self.config.min_speech_ms
        ):
            decision = Interrupt("speech", self._onset, playing)
            self._triggered = playing
        if isinstance(event, SpeechStopped):
            self._in_segment = False
            self._segment_response = None
        return decision

    def armed(self, playing: str | None) -> bool:
        """Whether speech could still cut ``playing``: not cut already, and, inside a segment,
        the response that segment started over (:meth:`on_frame`'s conditions, bar the length)."""
        if not self.config.enabled or playing is None or playing == self._triggered:
            return False
        return not self._in_segment or playing == self._segment_response

    def on_dtmf(self, timestamp: int, playing: str | None) -> Interrupt | None:
        """A key press at ``timestamp`` (inbound clock) while ``playing`` is playing."""
        config = self.config
        if not (config.enabled and config.dtmf) or playing is None or playing == self._triggered:
            return None
        self._triggered = playing
        return Interrupt("dtmf", timestamp, playing)


def onset_ns(detected_ns: int, onset_timestamp: int, detected_at: int, rate: int) -> int:
    """The monotonic time of a speech onset, from the time its detecting frame was handled.

    ``detected_ns`` is when the frame ending at ``detected_at`` was processed; the onset lies
    ``detected_at - onset_timestamp`` samples of audio before. Time the frame spent queued in the
    inbound ring is not known here, so this is at most that much late.
    """
    return detected_ns - (detected_at - onset_timestamp) * 1_000_000_000 // rate


def latency_ms(onset: int, last_audio_pull_ns: int, frame_ms: int = FRAME_MS) -> float:
    """Barge-in latency: from the speech onset (monotonic ns) until the last agent frame sent
    (``Playout.last_audio_pull_ns``) finished playing. 0 if the agent was already silent."""
    return max(0.0, (last_audio_pull_ns - onset) / 1e6 + frame_ms)
