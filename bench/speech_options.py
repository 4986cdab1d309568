"""What pocketsphinx's own speed settings save in recognition CPU, and what they cost in meaning.

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/speech_options.py                       # the default option sets, 8 and 16 kHz
    python bench/speech_options.py --rates 8000 --options '[{}, {"ds": 2}]'

Issue 34 asks for 80 talking callers of the speaking demo under 75% of this 2-core machine; the
recognition thread costs 2.6% of a core a talking caller (docs/benchmarks.md), so it would have to
decode at about a third of today's cost. This bench weighs the decoder settings that trade
accuracy for speed: ``ds`` (score every n-th frame), ``topn`` (Gaussians scored per frame),
``bestpath`` (the lattice search behind each utterance's hypothesis), ``maxhmmpf`` and the beams.

The corpus is the demo's own grammars: each line below said by four espeak-ng voices, with
silence around it and line noise under it, fed in 20 ms frames at the call's rate to a
:class:`~audio.speech.recognizer.Recognizer` listening with that line's grammar, exactly as the
recognition thread would. Per option set it prints the thread CPU per second of audio and what
the demo would have understood (``agents.demo_grammars.intent``): *right* (the line's meaning),
*wrong* (another meaning accepted: the dangerous kind; the demo confirms amounts before paying),
*rejected* (the caller is asked again), and lines outside the grammar that were accepted anyway.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.demo_grammars import GRAMMARS, intent  # noqa: E402
from audio.speech.recognizer import Recognizer  # noqa: E402
from audio.speech.synth import Synthesizer, Voice  # noqa: E402

# grammar -> lines in it; OUTSIDE lines are not (an accepted one was forced into the grammar).
LINES = {
    "menu": ["make a payment", "i would like to pay", "talk to a person", "goodbye",
             "repeat that", "read back my digits", "operator"],
    "amount": ["fifty nine cents", "two euros and fifty cents", "three hundred and twelve euros",
               "seventeen cents", "nine euros", "cancel"],
    "confirm": ["yes", "no thank you", "that is right", "repeat that"],
    "digits": ["four one one seven", "zero nine eight", "five five five two", "cancel"],
}  # fmt: skip
OUTSIDE = {
    "menu": ["what is the weather like today"],
    "amount": ["i have no idea"],
    "confirm": ["maybe later"],
    "digits": ["my card is in the car"],
}
VOICES = (Voice("en-us", 150), Voice("en+f3", 185), Voice("en+m3", 130), Voice("en+f2", 165))
DEFAULT_OPTIONS: tuple[dict[str, Any], ...] = (
    {},
    {"bestpath": False},
    {"ds": 2},
    {"topn": 2},
    {"maxhmmpf": 2000},
    {"beam": 1e-30, "wbeam": 1e-20},
    {"ds": 2, "topn": 2, "bestpath": False},
)


@dataclass(frozen=True, slots=True)
class Utterance:
    grammar: str
    line: str
    inside: bool
    audio: NDArray[np.int16]


@dataclass(slots=True)
class Score:
    cpu_s: float = 0.0
    audio_s: float = 0.0
    right: int = 0
    wrong: int = 0
    rejected: int = 0
    outside_accepted: int = 0


def corpus(rate: int, noise: float, seed: int) -> list[Utterance]:
    synth = Synthesizer()
    rng = np.random.default_rng(seed)
    pad = np.zeros(int(0.6 * rate))
    out = []
    for grammar in LINES:
        said = [(line, True) for line in LINES[grammar]]
        said += [(line, False) for line in OUTSIDE[grammar]]
        for line, inside in said:
            for voice in VOICES:
                speech = synth.say(line, rate, voice).astype(np.float64) * 0.5
                # 1.2 s after: the endpointer's window and the recognizer's tail end the line.
                audio = np.concatenate((pad, speech, pad, pad))
                audio += rng.normal(0.0, noise, len(audio))
                pcm = np.clip(np.rint(audio), -32768, 32767).astype(np.int16)
                out.append(Utterance(grammar, line, inside, pcm))
    return out


def run(options: dict[str, Any], utterances: list[Utterance], rate: int) -> Score:
    recognizer = Recognizer(GRAMMARS, rate, options=options)
    size = rate // 50
    score = Score()
    for u in utterances:
        recognizer.restart(rate)
        recognizer.use(u.grammar)
        accepted = []
        started = time.thread_time()
        for at in range(0, len(u.audio) - size + 1, size):
            accepted += [h.text for h in recognizer.feed(u.audio[at : at + size]) if h.accepted]
        score.cpu_s += time.thread_time() - started
        score.audio_s += len(u.audio) / rate
        if not u.inside:
            score.outside_accepted += bool(accepted)
        elif not accepted:
            score.rejected += 1
        elif all(intent(u.grammar, t) == intent(u.grammar, u.line) for t in accepted):
            score.right += 1
        else:
            score.wrong += 1
    return score


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="8000,16000", help="call rates, comma-separated")
    parser.add_argument("--noise", type=float, default=30.0, help="line noise, sigma in LSB")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--options", default=None, help="a JSON list of option sets (default: a useful few)"
    )
    args = parser.parse_args()
    option_sets = json.loads(args.options) if args.options else list(DEFAULT_OPTIONS)
    rates = [int(r) for r in args.rates.split(",")]
    inside = sum(len(lines) for lines in LINES.values()) * len(VOICES)
    outside = sum(len(lines) for lines in OUTSIDE.values()) * len(VOICES)
    print(f"reproduce: python bench/speech_options.py --rates {args.rates} --noise {args.noise}")
    print(
        f"{inside} utterances in the grammars and {outside} outside them, {len(VOICES)} espeak-ng "
        f"voices, line noise sigma {args.noise:g}"
    )
    for rate in rates:
        utterances = corpus(rate, args.noise, args.seed)
        print(f"\n{rate} Hz calls" + (" (upsampled to the 16 kHz model)" if rate != 16000 else ""))
        print(
            f"  {'options':44} {'CPU':>6} {'right':>7} {'wrong':>6} {'rejected':>9} "
            f"{'outside accepted':>17}"
        )
        base = None
        for options in option_sets:
            score = run(options, utterances, rate)
            cpu = score.cpu_s / score.audio_s * 100
            base = base if base is not None else cpu
            print(
                f"  {json.dumps(options):44} {cpu:5.2f}% {score.right:3d}/{inside:<3d} "
                f"{score.wrong:6d} {score.rejected:9d} {score.outside_accepted:9d}/{outside}"
                f"   ({cpu / base:.2f}x the first's CPU)"
            )
    print(
        "\nCPU: the feeding thread's CPU time per second of audio (silence around each line "
        "included: the endpointer skips it), % of one core."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
