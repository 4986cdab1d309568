"""How the spoken-payment script is heard when frames go missing, on new and reused decoders.

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/speech_loss.py                          # 40 runs each, "goodbye" and "hang up"
    python bench/speech_loss.py --lines goodbye --runs 60 --drops 5 --inside

The caller's track is tests/integration/test_speech.py's own G.722 script (encoded and decoded
as the call carries it), with its "hang up" line replaced by each line under study. Each run
drops 0 to ``--drops`` random 20 ms frames (as a loaded jitter buffer or a late tick loses them),
anywhere before the line or, with ``--inside``, inside it, and feeds the rest to a
``Recognizer`` whose grammar follows the demo's dialog at the script's times. A *new* decoder is
built for each run; a *reused* one is one decoder restarted between runs, as the recognition
thread reuses decoders from call to call. Printed per line and decoder: what was heard after
the payment, and how often.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import G722
import numpy as np
from numpy.typing import NDArray

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.demo_grammars import GRAMMARS  # noqa: E402
from audio.speech.recognizer import Recognizer  # noqa: E402
from tests.integration.speech_rtp import Say, caller_track, payment_script  # noqa: E402

RATE = 16000
FRAME = RATE // 50
LINE_AT_S = 13.5  # where the script says the line under study
# The demo's grammar by time: the script's lines and the dialog state they move it to.
PLAN = ((0.0, "menu"), (6.9, "amount"), (10.4, "confirm"), (13.4, "menu"), (15.9, "confirm"))


def _frames(line: str) -> list[NDArray[np.int16]]:
    steps, length = payment_script("g722")
    steps = [
        Say(s.at_s, line, s.voice) if isinstance(s, Say) and s.at_s == LINE_AT_S else s
        for s in steps
    ]
    track = caller_track(steps, RATE, length)
    encoder, decoder = G722.G722(RATE, 64000), G722.G722(RATE, 64000)
    return [
        np.asarray(decoder.decode(encoder.encode(track[i : i + FRAME])), dtype=np.int16)
        for i in range(0, len(track) - FRAME + 1, FRAME)
    ]


def _heard(recognizer: Recognizer, frames: list[NDArray[np.int16]]) -> tuple[str, ...]:
    grammar = ""
    after: list[str] = []
    for index, frame in enumerate(frames):
        at = index * 0.02
        wanted = [name for start, name in PLAN if at >= start][-1]
        if wanted != grammar:
            recognizer.use(wanted)
            grammar = wanted
        after += [h.text or "-" for h in recognizer.feed(frame) if at > PLAN[3][0]]
    return tuple(after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", nargs="+", default=["goodbye", "hang up"])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--drops", type=int, default=3, help="at most this many frames a run")
    parser.add_argument("--inside", action="store_true", help="drop them inside the line")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    low, high = (int(LINE_AT_S * 50), int(LINE_AT_S * 50) + 85) if args.inside else (0, 600)
    for line in args.lines:
        frames = _frames(line)
        reused = Recognizer(GRAMMARS, RATE)
        for kind in ("new", "reused"):
            rng = np.random.default_rng(args.seed)
            heard: collections.Counter[tuple[str, ...]] = collections.Counter()
            for _ in range(args.runs):
                lossy = list(frames)
                for _ in range(int(rng.integers(0, args.drops + 1))):
                    del lossy[int(rng.integers(low, high))]
                if kind == "new":
                    recognizer = Recognizer(GRAMMARS, RATE)
                else:
                    recognizer = reused
                    recognizer.restart(RATE)
                heard[_heard(recognizer, lossy)] += 1
            shown = ", ".join(f"{' / '.join(k) or 'nothing'}: {n}" for k, n in heard.most_common())
            print(f"{line!r:>10} {kind:>6} decoder, {args.runs} runs: {shown}")


if __name__ == "__main__":
    main()
