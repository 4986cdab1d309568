"""Caller audio from the media bridge's ring to the agent: one 20 ms frame at a time.

Per frame: voice activity on the call-rate audio (the media port's rate, which is the conference
bridge's: PJSIP has already converted the codec's), then, for an agent that takes caller audio,
conversion to the agent's rate with :class:`~audio.resample.StreamResampler` when the two differ.
Runs on the asyncio side, never on the media clock thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

import numpy as np

from audio.evidence_vad import EvidenceVad
from audio.frame import FRAME_RATES, Frame, FrameError, samples_per_frame
from audio.resample import StreamResampler
from audio.vad import VadConfig, VadEvent, VoiceActivity

PIPELINE_BUCKETS_S: Final = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3)
"""Buckets of ``voicegate_frame_pipeline_seconds``: the time a caller frame takes here, or in the
C media port's detector (telephony/c_media_port.py), which counts into the same ones."""


class AgentAudio:
    """Caller frames as the agent takes them: at its rate, timestamped on its clock."""

    __slots__ = ("_pcm_dtype", "_resampler", "agent_rate", "call_rate")

    def __init__(self, call_rate: int, agent_rate: int) -> None:
        self.call_rate = call_rate
        self.agent_rate = agent_rate
        # Only when the rates differ: an equal-rate StreamResampler would still copy every frame.
        self._resampler = (
            StreamResampler(call_rate, agent_rate) if call_rate != agent_rate else None
        )
        self._pcm_dtype = np.dtype("<i2")

    @property
    def delay(self) -> int:
        """Agent-rate samples by which agent audio lags its frame timestamps (filter delay)."""
        return self._resampler.delay if self._resampler is not None else 0

    def frame(self, pcm: bytes, timestamp: int) -> Frame:
        """The agent's frame of one 20 ms frame of caller PCM whose first sample is at
        ``timestamp`` (call rate); frames in order, gaps allowed (the resampler runs on)."""
        samples = np.frombuffer(pcm, dtype=self._pcm_dtype)
        if self._resampler is None:
            return Frame(samples, self.call_rate, timestamp)
        converted = self._resampler.process(samples)
        return Frame(converted, self.agent_rate, timestamp * self.agent_rate // self.call_rate)


@dataclass(frozen=True, slots=True)
class InboundResult:
    """What one caller frame became: audio for the agent and the VAD event it completed, if any.

    ``vad_event`` timestamps are at the call rate; ``frame_for_agent.timestamp`` is at the agent
    rate (use ``timestamp_ms`` to compare the two).
    """

    frame_for_agent: Frame | None
    """None when the pipeline was told the agent takes no audio."""
    vad_event: VadEvent | None
    speech_ms: int = 0
    """Speech in the caller's current segment after this frame (``VoiceActivity.speech_ms``)."""


class InboundPipeline:
    """VAD and rate conversion for one call's caller audio.

    ``frames`` and ``total_ns`` (``time.perf_counter_ns`` around this object's own work) let the
    caller export the per-frame pipeline time; nothing here reads a clock for any decision.
    """

    __slots__ = (
        "_agent",
        "agent_rate",
        "call_rate",
        "frame_bytes",
        "frames",
        "total_ns",
        "vad",
    )

    def __init__(
        self, call_rate: int, agent_rate: int = 16000, vad: VadConfig | None = None
    ) -> None:
        for name, rate in (("call_rate", call_rate), ("agent_rate", agent_rate)):
            if rate not in FRAME_RATES:
                raise FrameError(f"{name} must be one of {sorted(FRAME_RATES)} Hz, got {rate}")
        self.call_rate = call_rate
        self.agent_rate = agent_rate
        self.frame_bytes = samples_per_frame(call_rate) * 2
        config = vad or VadConfig()
        self.vad: VoiceActivity | EvidenceVad = (
            EvidenceVad(call_rate, config)
            if config.detector == "evidence"
            else VoiceActivity(call_rate, config)
        )
        self._agent = AgentAudio(call_rate, agent_rate)
        self.frames = 0
        self.total_ns = 0

    @property
    def delay(self) -> int:
        """Agent-rate samples by which agent audio lags its frame timestamps (filter delay)."""
        return self._agent.delay

    @property
    def mean_us(self) -> float:
        """Mean pipeline time per frame so far, in microseconds (0.0 before the first frame)."""
        return self.total_ns / self.frames / 1000 if self.frames else 0.0

    def process(self, pcm: bytes, timestamp: int, *, for_agent: bool = True) -> InboundResult:
        """One 20 ms frame of caller PCM (little-endian s16 at the call rate) at ``timestamp``.

        ``timestamp`` is the frame's first sample counted at the call rate since the call's audio
        started; the agent frame carries the same instant at the agent rate. Frames must be fed in
        order; a gap in timestamps is allowed (the resampler just runs on). ``for_agent`` false
        skips the agent's frame (and the resampler) for an agent that takes no caller audio.
        """
        started = time.perf_counter_ns()
        if len(pcm) != self.frame_bytes:
            raise FrameError(
                f"expected a 20 ms frame of {self.frame_bytes} bytes at {self.call_rate} Hz, "
                f"got {len(pcm)}"
            )
        event = self.vad.process_pcm(pcm, timestamp)
        frame = self._agent.frame(pcm, timestamp) if for_agent else None
        self.frames += 1
        self.total_ns += time.perf_counter_ns() - started
        return InboundResult(frame, event, self.vad.speech_ms)
