"""The audio frame: what every stage between the media bridge and the agent passes around.

Audio past the media bridge is never bare ``bytes`` (STYLE.md habit 4): it is a :class:`Frame`,
mono signed 16-bit samples with their rate and their place on the call's own clock. That clock is
a sample count since the call started, at the frame's rate: integers never drift the way summed
float milliseconds do, and the media bridge already counts frames, not wall time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

FRAME_MS: Final = 20
"""PJSIP's ``audioFramePtime`` and the RTP packetisation of every codec we offer."""

FRAME_RATES: Final = frozenset({8000, 16000, 32000, 48000})
"""Rates a call can run at: G.711 (8 kHz), G.722 (16 kHz) and the clock rates PJSIP bridges at."""

# The PCM on the wire between pjsua2 and us is little-endian s16 (pjmedia's native layout on every
# platform we ship for); spelling the byte order out keeps a big-endian host from misreading it.
_PCM_DTYPE: Final = np.dtype("<i2")


class FrameError(ValueError):
    """A frame was built from something that is not mono s16 audio at a call rate."""


def samples_per_frame(rate: int, ms: int = FRAME_MS) -> int:
    """Samples in ``ms`` milliseconds at ``rate`` Hz; ``ValueError`` if not a whole number."""
    if rate <= 0 or ms <= 0:
        raise ValueError(f"rate and ms must be positive, got rate={rate} ms={ms}")
    count, rest = divmod(rate * ms, 1000)
    if rest:
        raise ValueError(f"{ms} ms at {rate} Hz is not a whole number of samples")
    return count


@dataclass(frozen=True, slots=True, eq=False)
class Frame:
    """Mono s16 audio with its rate and position on the call's clock.

    ``timestamp`` is the index of ``samples[0]`` counted in samples at ``rate`` since the call's
    audio started, so consecutive frames satisfy ``next.timestamp == prev.timestamp + len(prev)``.
    ``samples`` is a read-only view: a frame never copies audio, and nobody downstream can change
    what an earlier stage already looked at.
    """

    samples: NDArray[np.int16]
    rate: int
    timestamp: int

    def __post_init__(self) -> None:
        samples = self.samples
        if not isinstance(samples, np.ndarray):
            raise FrameError(f"samples must be a numpy array, got {type(samples).__name__}")
        if samples.dtype != np.int16:
            raise FrameError(f"samples must be int16, got {samples.dtype}")
        if samples.ndim != 1:
            raise FrameError(f"samples must be mono (1-D), got shape {samples.shape}")
        if self.rate not in FRAME_RATES:
            raise FrameError(f"rate must be one of {sorted(FRAME_RATES)} Hz, got {self.rate}")
        if self.timestamp < 0:
            raise FrameError(f"timestamp must be >= 0, got {self.timestamp}")
        # A view, so the caller's own array keeps its flags; only ours is frozen.
        view = samples.view()
        view.flags.writeable = False
        object.__setattr__(self, "samples", view)

    @classmethod
    def from_pcm_bytes(cls, data: bytes, rate: int, timestamp: int) -> Frame:
        """A frame viewing ``data`` (little-endian s16) without copying it.

        ``data`` must be immutable ``bytes``: the frame shares its memory.
        """
        if len(data) % 2:
            raise FrameError(f"s16 PCM needs an even number of bytes, got {len(data)}")
        samples: NDArray[np.int16] = np.frombuffer(data, dtype=_PCM_DTYPE)
        return cls(samples, rate, timestamp)

    def to_pcm_bytes(self) -> bytes:
        """The samples as little-endian s16 PCM, as the media bridge hands them to pjsua2."""
        return self.samples.astype(_PCM_DTYPE, copy=False).tobytes()

    @property
    def duration_ms(self) -> float:
        """How long the frame plays, in milliseconds (20.0 for a standard frame)."""
        return len(self.samples) * 1000 / self.rate

    @property
    def timestamp_ms(self) -> float:
        """``timestamp`` converted to milliseconds since the call's audio started."""
        return self.timestamp * 1000 / self.rate

    def __len__(self) -> int:
        return len(self.samples)

    def __eq__(self, other: object) -> bool:
        # The generated __eq__ would compare arrays element-wise and then fail to make a bool.
        # Defining __eq__ also leaves __hash__ None: a frame is equal by value, so unhashable.
        if not isinstance(other, Frame):
            return NotImplemented
        return (
            self.rate == other.rate
            and self.timestamp == other.timestamp
            and np.array_equal(self.samples, other.samples)
        )
