"""Sample-rate conversion between call rates, and from the rates prompts are recorded at.

One rational-ratio polyphase resampler (upsample by ``up``, low-pass, keep every ``down``-th
sample) whose windowed-sinc prototype is designed once per rate pair and cached. Only the
``K = ceil(L / up)`` taps that meet real input samples are evaluated for each output sample, as one
matrix product over strided input windows per output phase (a single one for integer upsampling),
so a 20 ms frame costs a handful of numpy calls.

:class:`StreamResampler` is the causal form for live frames: a fixed number of samples out per
20 ms in, a constant delay of :attr:`StreamResampler.delay` output samples. :func:`resample` is the
same filter with that delay removed, for whole prompts: output sample ``m`` of the stream is exactly
output sample ``m - delay`` of the batch (apart from float rounding).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

import numpy as np
from numpy.typing import NDArray

RATES: Final = frozenset({8000, 16000, 22050, 24000, 32000, 44100, 48000})
"""Rates :func:`resample` converts between: the call rates and the usual recording rates."""

# The flat band ends at 85 % of the lower Nyquist frequency: 3400 Hz at 8 kHz, the top of the
# telephone band (ITU-T G.712). The stop band starts at that Nyquist frequency, so nothing aliases.
PASSBAND: Final = 0.85
# 70 dB keeps aliases and images far below G.711's ~38 dB SQNR and passband ripple under 0.003 dB;
# every further 10 dB costs about 15 % more taps per output sample.
STOPBAND_DB: Final = 70.0

# Rows of the strided window matrix built at once, so a minute-long prompt does not allocate
# hundreds of megabytes; live 20 ms frames always fit in one block.
_BLOCK_ROWS: Final = 8192

# float32 is plenty (rounding error ~0.05 LSB on int16 output) and halves the memory each block
# touches; 16 kHz -> 8 kHz per 20 ms frame, measured on a shared 2-core VM:
#   /work/venv/bin/python -m timeit -s "import numpy as np; from audio.resample import \
#   StreamResampler; r = StreamResampler(16000, 8000); x = np.zeros(320, np.int16)" "r.process(x)"
# about 20 to 26 us per loop; 8 -> 16 kHz about 22 us, 48 -> 16 kHz about 28 us.
_DTYPE: Final = np.float32


@dataclass(frozen=True, slots=True)
class _Design:
    """A low-pass prototype at ``src * up`` Hz, split into the per-output-phase taps it needs."""

    up: int
    down: int
    taps: int  # K: input samples each output sample is computed from
    delay: int  # D: output samples the causal stream lags the batch by
    newest: tuple[int, ...]  # output m = q * up + r reads inputs up to q * down + newest[r]
    bank: NDArray[np.float32]  # (up, K); bank[r] dotted with the K oldest-first inputs gives y[m]


def _check_rate(rate: int) -> None:
    if rate not in RATES:
        raise ValueError(f"unsupported sample rate {rate} Hz; supported: {sorted(RATES)}")


@functools.cache
def _design(src_rate: int, dst_rate: int) -> _Design:
    g = math.gcd(src_rate, dst_rate)
    up, down = dst_rate // g, src_rate // g
    proto_rate = src_rate * up
    nyquist = min(src_rate, dst_rate) / 2
    f_pass, f_stop = PASSBAND * nyquist, nyquist
    # Kaiser's empirical formulas for length and beta (Kaiser 1974; the Kaiser window method of
    # Oppenheim & Schafer's "Discrete-Time Signal Processing").
    width = 2 * math.pi * (f_stop - f_pass) / proto_rate
    length = math.ceil((STOPBAND_DB - 7.95) / (2.285 * width)) + 1
    length += 1 - length % 2  # odd, so the group delay (length - 1) / 2 is a whole sample
    beta = 0.1102 * (STOPBAND_DB - 8.7)
    center = (length - 1) // 2
    cutoff = (f_pass + f_stop) / 2 / proto_rate  # cycles per prototype sample
    n = np.arange(length) - center
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(length, beta)
    h *= up / h.sum()  # unity gain at DC once zero-stuffing has divided the level by `up`

    taps = -(-length // up)
    padded = np.zeros(taps * up)
    padded[:length] = h
    # by_phase[p, j] weighs input n - j for an output at prototype time t = n * up + p.
    by_phase = padded.reshape(taps, up).T
    delay = -(-center // down)
    # Stream output m sits at prototype time m * down + offset; offset in (-down, 0] is the
    # fraction of an output sample left after the whole `delay`, so the stream stays causal.
    offset = center - delay * down
    newest, rows = [], []
    for r in range(up):
        n_r, p_r = divmod(r * down + offset, up)
        newest.append(n_r)
        rows.append(by_phase[p_r, ::-1])  # oldest input first, to match a forward window
    bank = np.ascontiguousarray(np.array(rows), dtype=_DTYPE)
    bank.flags.writeable = False
    return _Design(up, down, taps, delay, tuple(newest), bank)


def _to_int16(y: NDArray[np.float32]) -> NDArray[np.int16]:
    # Round, then clip: a full-scale square wave overshoots (Gibbs) and must saturate, not wrap.
    np.rint(y, out=y)
    np.clip(y, -32768, 32767, out=y)
    return y.astype(np.int16)


def _check_samples(samples: NDArray[np.int16]) -> None:
    if samples.dtype != np.int16 or samples.ndim != 1:
        raise ValueError(f"expected 1-D int16 samples, got {samples.dtype} {samples.shape}")


class StreamResampler:
    """Converts one continuous stream chunk by chunk, keeping the filter's history between chunks.

    After ``n`` input samples in total, exactly ``n * up // down`` output samples have come out
    (``up / down`` is ``dst_rate / src_rate`` in lowest terms), so 20 ms in gives 20 ms out at the
    call rates. Output lags input by :attr:`delay` output samples; the first ones are the filter
    filling up from silence. Concatenating the outputs of any split of the input gives the same
    samples, which are those of :func:`resample` shifted by :attr:`delay`.
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        _check_rate(src_rate)
        _check_rate(dst_rate)
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._d = _design(src_rate, dst_rate)
        self._n_in = 0  # input samples consumed
        self._n_out = 0  # output samples produced
        # Input history as float; _buf[0] is input sample number _base (negative: silence before
        # the stream started, which the first outputs' windows reach back into).
        self._base = self._d.newest[0] - self._d.taps + 1
        self._buf = np.zeros(-self._base, dtype=_DTYPE)

    @property
    def delay(self) -> int:
        """Output samples by which this stream lags its input (0 when the rates are equal)."""
        return self._d.delay if self.src_rate != self.dst_rate else 0

    def process(self, chunk: NDArray[np.int16]) -> NDArray[np.int16]:
        """Feed the next input samples; returns every output sample they complete."""
        _check_samples(chunk)
        if self.src_rate == self.dst_rate:
            return chunk.copy()
        return _to_int16(self._process(chunk))

    def _process(self, chunk: NDArray[np.int16]) -> NDArray[np.float32]:
        d = self._d
        buf = np.concatenate((self._buf, chunk), dtype=_DTYPE)
        self._n_in += len(chunk)
        m0, m1 = self._n_out, self._n_in * d.up // d.down
        out = np.empty(m1 - m0, dtype=_DTYPE)
        if d.down == 1:
            # Integer upsampling (8 -> 16 kHz): m0 and m1 are whole periods of `up` outputs and
            # every phase of a period reads the same window, so one product gives them all,
            # already interleaved.
            q0 = m0 // d.up
            for q in range(q0, m1 // d.up, _BLOCK_ROWS):
                rows = min(_BLOCK_ROWS, m1 // d.up - q)
                windows = self._windows(buf, q + d.newest[0], rows)
                at = (q - q0) * d.up
                out[at : at + rows * d.up] = (windows @ d.bank.T).ravel()
        else:
            for r in range(d.up):
                # Outputs m = q * up + r; output m's newest input is q * down + newest[r].
                q_lo, q_hi = -((r - m0) // d.up), -((r - m1) // d.up)
                for q in range(q_lo, q_hi, _BLOCK_ROWS):
                    rows = min(_BLOCK_ROWS, q_hi - q)
                    windows = self._windows(buf, q * d.down + d.newest[r], rows)
                    at = q * d.up + r - m0
                    step = out[at : at + (rows - 1) * d.up + 1 : d.up]
                    np.matmul(windows, d.bank[r], out=step)
        # Keep what the next output m1 reaches back to; everything older is done with.
        q, r = divmod(m1, d.up)
        keep_from = q * d.down + d.newest[r] - d.taps + 1
        self._buf = buf[keep_from - self._base :].copy()
        self._base = keep_from
        self._n_out = m1
        return out

    def _windows(self, buf: NDArray[np.float32], newest: int, rows: int) -> NDArray[np.float32]:
        """``rows`` windows of ``taps`` inputs, oldest first, the first ending at input ``newest``
        and each next one ``down`` inputs later, as a contiguous matrix BLAS can multiply."""
        size, taps = buf.itemsize, self._d.taps
        # A strided view first: numpy refuses one that would reach outside buf.
        view: NDArray[np.float32] = np.ndarray(
            (rows, taps),
            _DTYPE,
            buffer=buf,
            offset=(newest - taps + 1 - self._base) * size,
            strides=(self._d.down * size, size),
        )
        return view.copy()


def resample(samples: NDArray[np.int16], src_rate: int, dst_rate: int) -> NDArray[np.int16]:
    """A whole buffer at ``dst_rate``, time-aligned with the input (no filter delay).

    The result has ``round(len(samples) * dst_rate / src_rate)`` samples, saturated to int16.
    Audio outside the band both rates can carry (85 % of the lower Nyquist frequency and up) is
    removed rather than aliased.
    """
    _check_samples(samples)
    stream = StreamResampler(src_rate, dst_rate)
    if src_rate == dst_rate:
        return samples.copy()
    d = stream._d
    want = round(Fraction(len(samples) * d.up, d.down))
    # Feed silence after the end until the stream has produced `delay` + `want` samples.
    need_in = -(-(want + d.delay) * d.down // d.up)
    padded = np.zeros(max(need_in, len(samples)), dtype=np.int16)
    padded[: len(samples)] = samples
    y = stream._process(padded)
    return _to_int16(y[d.delay : d.delay + want])
