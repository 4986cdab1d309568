"""Where the sentences of a recorded prompt start: the pauses a speaker (or espeak-ng) leaves.

Used to pick up a cut prompt at the start of the sentence the caller was hearing (issue 21: after
a false interruption) rather than from its very beginning or mid-word.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

PAUSE_MS: Final = 350
"""A quiet run at least this long ends a sentence (espeak-ng's pauses between words are shorter:
100 to 300 ms at 160 words a minute, a comma included; after a full stop 400 to 520 ms, measured on
the demo menu)."""
QUIET_DBFS: Final = -40.0
WINDOW_MS: Final = 10


def sentence_starts(samples: NDArray[np.int16], rate: int) -> list[int]:
    """Sample indices where a sentence starts: 0, then the end of every quiet run of at least
    :data:`PAUSE_MS` that has sound after it. Always sorted, always begins with 0."""
    w = rate * WINDOW_MS // 1000
    n = len(samples) // w
    if n == 0:
        return [0]
    x = samples[: n * w].astype(np.float64).reshape(n, w)
    quiet = np.sqrt(np.mean(x**2, axis=1)) < 32768 * 10 ** (QUIET_DBFS / 20)
    need = PAUSE_MS // WINDOW_MS
    starts = [0]
    run = 0
    for i, q in enumerate(quiet.tolist()):
        if q:
            run += 1
        else:
            if run >= need and i > run:
                starts.append(i * w)
            run = 0
    return starts


def resume_point(samples: NDArray[np.int16], rate: int, heard: int) -> int:
    """The start of the sentence that sample ``heard`` falls in (0 before the first pause)."""
    return max(s for s in sentence_starts(samples, rate) if s <= max(heard, 0))
