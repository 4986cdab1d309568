"""The hold pulse (voicegate/call/hold.py): quiet, a tone and not speech, mostly silence."""

from __future__ import annotations

import numpy as np
import pytest

from voicegate.call.hold import CYCLE_MS, HOLD_HZ, HOLD_PEAK, TONE_MS, hold_pattern


@pytest.mark.parametrize("rate", [8000, 16000])
def test_the_pulse_is_a_soft_tone_then_silence(rate: int) -> None:
    cycle = hold_pattern(rate)
    assert cycle.dtype == np.int16 and len(cycle) == rate * CYCLE_MS // 1000
    tone_n = rate * TONE_MS // 1000
    assert not cycle[tone_n:].any()  # the rest of the cycle is silence
    tone = cycle[:tone_n].astype(np.float64)
    assert 0.6 * HOLD_PEAK <= np.abs(tone).max() <= HOLD_PEAK  # about -35 dBFS, never louder
    assert abs(tone[0]) < 0.1 * HOLD_PEAK and abs(tone[-1]) < 0.1 * HOLD_PEAK  # faded: no click
    spectrum = np.abs(np.fft.rfft(tone))
    assert abs(np.argmax(spectrum) * rate / tone_n - HOLD_HZ) <= rate / tone_n
