"""Speech figures: recognition CPU per talking caller, and what it does to other calls' frame
path on the event loop (pocketsphinx holds the GIL while it decodes).

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/speech.py                    # 1, 2 and 4 talking callers, 16 and 8 kHz
    python bench/speech.py --streams 4 --seconds 20

1. CPU: each caller talks all the time (espeak-ng sentences from the demo's grammars with
   800 ms between them, and line noise), fed as 20 ms frames to the process's recognition thread as
   the demo agent feeds it; the thread's own CPU time over the seconds of audio is the cost.
2. Frame path: an asyncio loop runs a 20 ms tick standing for the other calls' frame path
   (voicegate/call/turns.py drains frames on the loop) and records how late each tick fires,
   first with no recognition, then with N talking callers on the recognition thread. The
   thread's queue depth and dropped frames are printed too.

For the same on real calls (RTP interval p99 of every call, CPU per call) run
``bench/capacity.py --speech`` against ``bench/capacity.py`` (an agent that takes no audio).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.demo_grammars import GRAMMARS  # noqa: E402
from audio.speech.recognizer import Heard  # noqa: E402
from audio.speech.synth import Synthesizer, Voice  # noqa: E402
from audio.speech.worker import RecognitionThread  # noqa: E402

LINES = ["make a payment", "fifty nine cents", "yes", "repeat that", "talk to a person",
         "what is the weather like today", "goodbye", "two euros and fifty cents"]  # fmt: skip


def talk(rate: int, seconds: float, seed: int) -> NDArray[np.int16]:
    """A caller who never stops: sentences back to back with 800 ms pauses (enough for the
    endpointer to end each utterance), line noise under."""
    synth = Synthesizer()
    rng = np.random.default_rng(seed)
    voices = [Voice("en-us", 150), Voice("en+f3", 185)]
    parts: list[NDArray[np.float64]] = []
    total = 0
    n = 0
    while total < seconds * rate:
        speech = synth.say(LINES[n % len(LINES)], rate, voices[n % 2]).astype(np.float64) * 0.5
        pause = np.zeros(int(0.8 * rate))
        parts += [speech, pause]
        total += len(speech) + len(pause)
        n += 1
    audio = np.concatenate(parts)[: int(seconds * rate)]
    audio += rng.normal(0, 30, len(audio))
    return np.clip(np.rint(audio), -32768, 32767).astype(np.int16)


async def _ticks(seconds: float) -> list[float]:
    """Lateness (ms) of a 20 ms tick on this loop, as the other calls' frame path would see it."""
    loop = asyncio.get_running_loop()
    late: list[float] = []
    due = loop.time() + 0.02
    end = loop.time() + seconds
    while due < end:
        await asyncio.sleep(max(0.0, due - loop.time()))
        late.append((loop.time() - due) * 1000)
        due += 0.02
    return late


async def run(streams: int, rate: int, seconds: float) -> dict[str, float]:
    worker = RecognitionThread()
    heard: list[Heard] = []
    lock = threading.Lock()

    def deliver(h: Heard) -> None:
        with lock:
            heard.append(h)

    audio = [talk(rate, seconds, seed) for seed in range(streams)]
    opened = [worker.open(GRAMMARS, rate, deliver) for _ in range(streams)]
    size = rate // 50
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.5)  # the decoders are built on the thread
    cpu0 = worker.cpu_s

    async def feed() -> None:
        due = loop.time()
        for i in range(len(audio[0]) // size):
            for stream, samples in zip(opened, audio, strict=True):
                stream.feed(samples[i * size : (i + 1) * size])
            due += 0.02
            await asyncio.sleep(max(0.0, due - loop.time()))

    max_queue = 0

    async def watch() -> None:
        nonlocal max_queue
        while True:
            max_queue = max(max_queue, worker.queued)
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    late, _ = await asyncio.gather(_ticks(seconds), feed())
    # Let the thread finish what is queued: a bounded poll, this is a bench (no event to wait on).
    for _ in range(200):
        if not worker.queued:
            break
        await asyncio.sleep(0.05)
    watcher.cancel()
    cpu = worker.cpu_s - cpu0
    for stream in opened:
        stream.close()
    worker.stop()
    late.sort()
    return {
        "cpu_per_stream": cpu / seconds / streams,
        "p50": statistics.median(late),
        "p99": late[int(len(late) * 0.99)],
        "max": late[-1],
        "utterances": len(heard) / streams,
        "accepted": sum(h.accepted for h in heard) / max(1, len(heard)),
        "dropped": worker.dropped,
        "max_queue": max_queue,
    }


async def baseline(seconds: float) -> dict[str, float]:
    late = sorted(await _ticks(seconds))
    return {"p50": statistics.median(late), "p99": late[int(len(late) * 0.99)], "max": late[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,2,4", help="talking callers at once")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rates", default="16000,8000")
    args = parser.parse_args()
    print(f"speech bench: {args.seconds:.0f} s of non-stop talk per caller")
    base = asyncio.run(baseline(args.seconds))
    print(
        f"  no recognition:        20 ms tick late p50 {base['p50']:.2f} ms, "
        f"p99 {base['p99']:.2f} ms, max {base['max']:.2f} ms"
    )
    for rate in (int(r) for r in args.rates.split(",")):
        for streams in (int(s) for s in args.streams.split(",")):
            r = asyncio.run(run(streams, rate, args.seconds))
            print(
                f"  {streams} caller(s) {rate // 1000:>2} kHz: recognition "
                f"{r['cpu_per_stream']:.3f} s CPU per s of talk per caller; tick late "
                f"p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, max {r['max']:.2f} ms; "
                f"queue max {r['max_queue']:.0f} frames, dropped {r['dropped']:.0f}; "
                f"{r['utterances']:.0f} utterances per caller, {r['accepted']:.0%} accepted"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
