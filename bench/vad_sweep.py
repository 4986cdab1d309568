"""The speech detector alone on bench/bargein.py's audio: a quick sweep of its settings.

No server and no calls: each case's caller audio (same seeds as bench/bargein.py) goes through
A-law and back, then frame by frame through the detector. Prints per setting, over every noise at
each SNR: false barge-in candidates per minute and false turns per minute on noise alone, missed
lines and the detection delay (median, p95: from a line's first sample to the frame where its
segment held ``min_speech_ms``) on speech over noise, and split lines: lines in which a second
segment held ``min_speech_ms`` (the line was cut in two at a pause shorter than it, a comma's:
``--hangovers``). Detection delay is what the detector adds; ``--shifts N`` runs each speech
case N times, shifted by a fraction of a frame each time (0, 160/N, ... samples), and adds the
p99 and the maximum delay: where the frame edges fall in a line's first syllable must not
decide when it starts (docs/barge-in.md).
bench/bargein.py measures the whole path at the caller's ear. Use it to narrow the settings, then
measure the chosen ones with bench/bargein.py.

    python bench/vad_sweep.py
    python bench/vad_sweep.py --margins 6,9,12 --onsets 40,60,80 --snrs 10
    python bench/vad_sweep.py --margins 8 --min-speech 60 --hangovers 300,400,500
    python bench/vad_sweep.py --margins 8.5 --min-speech 60 --hangovers 400 --turn-ms 240 --shifts 8
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audio.evidence_vad import EvidenceVad  # noqa: E402
from audio.vad import VadConfig, VoiceActivity  # noqa: E402
from tests.fixtures.noise import NOISES, RATE, encode_alaw  # noqa: E402
from tests.fixtures.noisy_caller import Case, build  # noqa: E402
from tests.fixtures.speech import decode_alaw  # noqa: E402


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, -(-95 * len(ordered) // 100) - 1)]


def run(
    case: Case, config: VadConfig, min_speech_ms: int, turn_ms: int, shift: int = 0
) -> dict[str, float]:
    """The detector over ``case`` (its first ``shift`` samples dropped, lines moved with it)."""
    audio = decode_alaw(encode_alaw(case.audio))[shift:]
    vad = (EvidenceVad if config.detector == "evidence" else VoiceActivity)(RATE, config)
    candidates = turns = 0
    armed_cand = armed_turn = False
    hits: list[int] = []  # sample index at which each segment first held min_speech_ms
    for at in range(0, len(audio) - 159, 160):
        event = vad.process_pcm(audio[at : at + 160].tobytes(), at)
        if event is not None and type(event).__name__ == "SpeechStarted":
            armed_cand = armed_turn = True
        ms = vad.speech_ms
        if armed_cand and ms >= min_speech_ms:
            armed_cand = False
            candidates += 1
            hits.append(at + 160)
        if armed_turn and ms >= turn_ms:
            armed_turn = False
            turns += 1
    minutes = len(audio) / RATE / 60
    if not case.speech:
        return {"cand": candidates / minutes, "turns": turns / minutes}
    delays, missed, split = [], 0, 0
    for start, length in case.lines:
        s0, s1 = round(start * RATE) - shift, round((start + length) * RATE) - shift
        got = [h for h in hits if s0 - 160 <= h <= s1]
        if got:
            delays.append((got[0] - s0) / RATE * 1000)
            split += len(got) > 1
        else:
            missed += 1
    return {
        "delays": delays,  # type: ignore[dict-item]
        "missed": missed,
        "lines": len(case.lines),
        "split": split,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--snrs", default="20,10,5")
    parser.add_argument("--margins", default="9")
    parser.add_argument("--onsets", default="60")
    parser.add_argument("--windows", default="160")
    parser.add_argument("--min-speech", default="120")
    parser.add_argument("--aggressiveness", default="2")
    parser.add_argument("--hangovers", default="300")
    parser.add_argument("--turn-ms", type=int, default=300)
    parser.add_argument("--verdicts", action="store_true", help="also the verdicts detector")
    parser.add_argument(
        "--shifts", type=int, default=1, help="run each speech case at this many sub-frame shifts"
    )
    args = parser.parse_args()
    snrs = [int(x) for x in args.snrs.split(",")]
    cases = {
        (noise, snr, speech): Case(noise, snr, speech)
        for noise in NOISES for snr in snrs for speech in (False, True)
    }
    for case in cases.values():
        build(case, args.seed, 30.0, 8)
    settings = [
        VadConfig(aggressiveness=int(a), onset_ms=int(o), window_ms=max(int(w), int(o)),
                  margin_db=float(m), hangover_ms=int(h))
        for a, m, o, w, h in itertools.product(
            args.aggressiveness.split(","), args.margins.split(","), args.onsets.split(","),
            args.windows.split(","), args.hangovers.split(","),
        )
    ]
    if args.verdicts:
        settings.insert(0, VadConfig(detector="verdicts"))
    shifts = [k * 160 // args.shifts for k in range(args.shifts)]
    print(f"{'setting':34} {'snr':>3} {'cand/min max':>12} {'turns/min max':>13} "
          f"{'missed':>7} {'med ms':>6} {'p95 ms':>6} {'split':>6}"
          + (f" {'p99 ms':>6} {'max ms':>6}" if args.shifts > 1 else ""))
    for config, min_speech in itertools.product(settings, args.min_speech.split(",")):
        label = (
            f"{config.detector[:4]} a{config.aggressiveness} m{config.margin_db:g} "
            f"o{config.onset_ms} w{config.window_ms} s{min_speech} h{config.hangover_ms}"
        )
        for snr in snrs:
            noise_runs = [
                run(cases[(n, snr, False)], config, int(min_speech), args.turn_ms) for n in NOISES
            ]
            speech_runs = [
                run(cases[(n, snr, True)], config, int(min_speech), args.turn_ms, shift)
                for n in NOISES
                for shift in shifts
            ]
            delays = [d for r in speech_runs for d in r["delays"]]  # type: ignore[attr-defined]
            missed = sum(int(r["missed"]) for r in speech_runs)
            split = sum(int(r["split"]) for r in speech_runs)
            lines = sum(int(r["lines"]) for r in speech_runs)
            worst = max(noise_runs, key=lambda r: r["cand"])
            worst_turns = max(r["turns"] for r in noise_runs)
            med = statistics.median(delays) if delays else float("nan")
            top = p95(delays) if delays else float("nan")
            tail = ""
            if args.shifts > 1 and delays:
                ordered = sorted(delays)
                p99 = ordered[min(len(ordered) - 1, -(-99 * len(ordered) // 100) - 1)]
                tail = f" {p99:>6.0f} {ordered[-1]:>6.0f}"
            print(
                f"{label:34} {snr:>3} {worst['cand']:>12.1f} {worst_turns:>13.1f} "
                f"{missed:>3}/{lines:<3} {med:>6.0f} {top:>6.0f} {split:>3}/{lines:<3}{tail}"
            )


if __name__ == "__main__":
    main()
