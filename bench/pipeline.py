"""Audio pipeline figures: CPU per 20 ms frame per call, barge-in latency, stale frames.

Prints figures, never passes or fails (STYLE.md: tests assert behaviour, benchmarks measure).

    python bench/pipeline.py                          # 1, 4 and 16 simulated calls
    python bench/pipeline.py --calls 4 16 32 --seconds 60 --onsets 400

Every call is simulated in this one process on a media clock of 20 ms ticks, with no sleeping:
at tick k the "media thread" pushes the caller's frame k into the call's inbound ring and pulls
one frame from its playout; then the "asyncio side" drains the ring (inbound pipeline: VAD at
the call rate and 8 -> 16 kHz for the agent), runs barge-in, interrupts the playout if told to,
and keeps the agent's response fed. So an interrupt decided on frame k takes effect at the pull of
tick k + 1. Caller audio is real speech: SIPp's A-law capture and espeak-ng sentences over a
-60 dBFS noise floor. Every agent frame carries its response's number in its first sample, so
each pulled frame can be checked against the responses already cut.

A last section lets a real thread pull while the main thread interrupts, to count stale frames
under true concurrency: a frame counts as stale if its pull began after interrupt() had returned
for its response.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audio.barge_in import BargeIn, BargeInConfig  # noqa: E402
from audio.inbound import InboundPipeline  # noqa: E402
from audio.playout import Playout  # noqa: E402
from audio.vad import VadConfig  # noqa: E402
from tests.fixtures.speech import espeak, have_espeak, pcap_speech  # noqa: E402

RATE = 8000  # G.711 call
AGENT_RATE = 16000
SPF = RATE // 50
TICK_MS = 20
CHUNK_FRAMES = 10  # the agent sends 200 ms chunks
LEAD_MS = 400  # and keeps this much queued ahead
PHRASES = [
    "Stop, I want to talk to a person.",
    "Wait, that is not what I asked for.",
    "Yes.",
    "No, the other account please.",
    "Hello? Can you hear me?",
    "Excuse me, sorry to interrupt.",
]


def noise(n: int, rng: np.random.Generator, dbfs: float = -60.0) -> NDArray[np.float64]:
    return rng.normal(0.0, 32768 * 10 ** (dbfs / 20), n)


def to_int16(x: NDArray[np.float64]) -> NDArray[np.int16]:
    return np.clip(np.rint(x), -32768, 32767).astype(np.int16)


def first_loud(x: NDArray[np.int16], dbfs: float = -45.0) -> int:
    """First sample of the first 10 ms window louder than ``dbfs``: the speech edge."""
    w = RATE // 100
    windows = x[: len(x) // w * w].astype(np.float64).reshape(-1, w)
    level = 10 * np.log10(np.mean(windows**2, axis=1) + 1e-9) - 20 * np.log10(32768)
    return w * int(np.argmax(level > dbfs))


def trim(x: NDArray[np.int16]) -> NDArray[np.int16]:
    start = first_loud(x)
    end = len(x) - first_loud(x[::-1].copy())
    return x[start:end]


def utterances() -> list[NDArray[np.int16]]:
    found = [trim(pcap_speech())]
    if have_espeak():
        found += [trim(espeak(text, RATE)) for text in PHRASES]
    return found


# --- one simulated call -----------------------------------------------------------------------


@dataclass
class Cut:
    onset_timestamp: int
    decided_tick: int
    last_agent_tick: int


@dataclass
class SimCall:
    caller: list[bytes]  # the caller's 20 ms frames, one per tick
    vad: VadConfig
    barge: BargeInConfig
    late_chunks: int = 2  # chunks the agent still sends before it hears of an interrupt
    tick: int = 0
    pipeline: InboundPipeline = field(init=False)
    barge_in: BargeIn = field(init=False)
    playout: Playout = field(init=False)
    inbound: deque[bytes] = field(default_factory=lambda: deque(maxlen=50))
    rx: int = 0
    generation: int = 0
    number: int = 0  # response number = the tag in its audio
    response: str | None = None
    late: list[tuple[str, int, int]] = field(default_factory=list)
    cut_tags: set[int] = field(default_factory=set)
    stale_pulled: int = 0
    cuts: list[Cut] = field(default_factory=list)
    pull_ns: int = 0
    work_ns: int = 0  # inbound pipeline + barge-in, timed around both
    frame_times: list[int] = field(default_factory=list)
    keep_frame_times: bool = False

    def __post_init__(self) -> None:
        self.pipeline = InboundPipeline(RATE, AGENT_RATE, self.vad)
        self.barge_in = BargeIn(self.barge)
        # The media clock is the tick count: last_audio_pull_ns holds the tick of the last frame.
        self.playout = Playout(RATE, clock_ns=lambda: self.tick)

    def media_tick(self) -> None:
        self.inbound.append(self.caller[self.tick % len(self.caller)])
        started = time.perf_counter_ns()
        frame = self.playout.pull()
        self.pull_ns += time.perf_counter_ns() - started
        tag = int.from_bytes(frame[:2], "little", signed=True)
        if tag and tag in self.cut_tags:
            self.stale_pulled += 1

    def asyncio_tick(self) -> None:
        playout = self.playout
        while self.inbound:
            pcm = self.inbound.popleft()
            started = time.perf_counter_ns()
            result = self.pipeline.process(pcm, self.rx * SPF)
            decision = self.barge_in.on_frame(result.vad_event, result.speech_ms, playout.playing)
            spent = time.perf_counter_ns() - started
            self.work_ns += spent
            if self.keep_frame_times:
                self.frame_times.append(spent)
            self.rx += 1
            if decision is not None:
                self.generation += 1
                for cut in playout.interrupt(self.generation):
                    self.cut_tags.add(int(cut.response_id[1:]))
                self.cuts.append(
                    Cut(decision.onset_timestamp, self.tick, playout.last_audio_pull_ns)
                )
                if self.response is not None:
                    self.late += [
                        (self.response, self.generation - 1, self.number)
                    ] * self.late_chunks
                self.response = None
        self.agent_step()
        playout.poll()

    def agent_step(self) -> None:
        playout = self.playout
        if self.late:
            rid, generation, tag = self.late.pop()
            playout.admit(rid, generation, agent_chunk(tag))  # refused and counted
        if self.response is None:
            self.number += 1
            self.response = f"r{self.number}"
            playout.begin(self.response, self.generation)
        while playout.queued_ms < LEAD_MS:
            playout.admit(self.response, self.generation, agent_chunk(self.number))


_TONE = to_int16(3000 * np.sin(2 * np.pi * 330 * np.arange(CHUNK_FRAMES * SPF) / RATE))


def agent_chunk(tag: int) -> NDArray[np.int16]:
    chunk = _TONE.copy()
    chunk[::SPF] = tag  # the first sample of every frame names the response
    return chunk


def frames_of(x: NDArray[np.int16]) -> list[bytes]:
    return [x[i : i + SPF].tobytes() for i in range(0, len(x) - SPF + 1, SPF)]


# --- sections ---------------------------------------------------------------------------------


def cpu_per_frame(calls: int, seconds: float, speech: list[NDArray[np.int16]]) -> None:
    rng = np.random.default_rng(calls)
    # Each caller: the capture and sentences with pauses, over line noise, from its own offset.
    pieces: list[NDArray[np.float64]] = []
    for x in speech:
        pieces += [x.astype(np.float64), np.zeros(RATE)]
    clean = np.concatenate(pieces)
    track = to_int16(clean + noise(len(clean), rng))
    ticks = int(seconds * 1000 / TICK_MS)
    sims = []
    for _ in range(calls):
        offset = int(rng.integers(0, len(track) // SPF)) * SPF
        caller = frames_of(np.roll(track, -offset))
        sims.append(SimCall(caller, VadConfig(), BargeInConfig(), keep_frame_times=True))
    cpu0 = time.process_time()
    for _ in range(ticks):
        for sim in sims:
            sim.media_tick()
        for sim in sims:
            sim.asyncio_tick()
        for sim in sims:
            sim.tick += 1
    cpu = time.process_time() - cpu0
    frames = ticks * calls
    work = sum(s.work_ns for s in sims) / frames / 1000
    pull = sum(s.pull_ns for s in sims) / frames / 1000
    inbound = sum(s.pipeline.total_ns for s in sims) / frames / 1000
    times = sorted(t for s in sims for t in s.frame_times)
    p99 = times[int(0.99 * (len(times) - 1))] / 1000
    core = (work + pull) * calls / (TICK_MS * 1000) * 100
    print(
        f"  {calls:>3} call(s) x {seconds:.0f} s: {work + pull:6.1f} us/frame/call "
        f"(inbound {inbound:5.1f} + barge-in {work - inbound:4.1f} + pull {pull:4.2f}; "
        f"p99 inbound+barge-in {p99:5.1f}) = {core:4.1f} % of a core in real time; "
        f"whole simulation incl. agent feeding {cpu / frames * 1e6:6.1f} us CPU/frame/call; "
        f"barge-ins {sum(len(s.cuts) for s in sims)}, stale frames pulled "
        f"{sum(s.stale_pulled for s in sims)}"
    )


def barge_in_latency(onsets: int, speech: list[NDArray[np.int16]]) -> None:
    rng = np.random.default_rng(42)
    pieces: list[NDArray[np.float64]] = []
    edges: list[tuple[int, int]] = []  # (speech edge, end) in samples, from the clean signal
    at = 0
    for i in range(onsets):
        gap = np.zeros(int(rng.integers(RATE, 2 * RATE)) // SPF * SPF)
        utterance = speech[i % len(speech)]
        if len(utterance) > 3 * RATE:  # the long capture: a random 2 s slice of it
            start = int(rng.integers(0, len(utterance) - 2 * RATE))
            utterance = trim(utterance[start : start + 2 * RATE])
        pieces += [gap, utterance.astype(np.float64)]
        at += len(gap)
        edges.append((at + first_loud(utterance), at + len(utterance)))
        at += len(utterance)
    pieces.append(np.zeros(RATE))
    track = np.concatenate(pieces)
    caller = frames_of(to_int16(track + noise(len(track), rng)))
    vad, barge = VadConfig(aggressiveness=2, frame_ms=20), BargeInConfig()
    sim = SimCall(caller, vad, barge)
    for _ in range(len(caller)):
        sim.media_tick()
        sim.asyncio_tick()
        sim.tick += 1
    from_onset: list[float] = []
    from_edge: list[float] = []
    unmatched = 0
    matched = set()
    for cut in sim.cuts:
        hit = [
            i for i, (edge, end) in enumerate(edges) if edge - 4 * SPF <= cut.onset_timestamp < end
        ]
        if not hit:
            unmatched += 1
            continue
        matched.add(hit[0])
        stop_ms = (cut.last_agent_tick + 1) * TICK_MS  # the last agent frame has played out
        from_onset.append(float(stop_ms - cut.onset_timestamp // SPF * TICK_MS))
        from_edge.append(stop_ms - edges[hit[0]][0] * 1000 / RATE)

    def summary(values: list[float]) -> str:
        values = sorted(values)
        p95 = values[int(0.95 * (len(values) - 1))]
        return f"median {statistics.median(values):5.1f} ms, p95 {p95:5.1f} ms"

    print(
        f"  {len(sim.cuts)} barge-ins for {onsets} caller utterances ({len(matched)} matched, "
        f"{onsets - len(matched)} missed, {unmatched} outside any utterance); "
        f"VAD aggressiveness {vad.aggressiveness}, {vad.frame_ms} ms frames, onset "
        f"{vad.onset_ms} ms, min_speech {barge.min_speech_ms} ms"
    )
    if from_onset:
        print(f"    VAD onset frame -> last agent frame played out: {summary(from_onset)}")
        print(f"    speech edge (energy, clean) -> same:             {summary(from_edge)}")
    print(
        f"    stale frames that reached pull(): {sim.stale_pulled}; stale chunks dropped at "
        f"admission: {sim.playout.stale_dropped} ({sim.playout.stale_dropped_frames} frames)"
    )


def components() -> None:
    """Where the inbound time goes, per 20 ms frame of speech (timeit, best of 5)."""
    import timeit

    from audio.evidence_vad import EvidenceVad
    from audio.frame import Frame
    from audio.resample import StreamResampler
    from audio.vad import VadConfig, VoiceActivity

    speech = pcap_speech()[RATE : RATE + SPF]
    pcm8 = speech.tobytes()
    pcm16 = np.repeat(speech, 2).tobytes()
    up = StreamResampler(RATE, AGENT_RATE)
    vad = VoiceActivity(RATE)
    evidence = EvidenceVad(RATE)
    same = InboundPipeline(AGENT_RATE, AGENT_RATE)
    same_verdicts = InboundPipeline(AGENT_RATE, AGENT_RATE, VadConfig(detector="verdicts"))
    rows = [
        ("StreamResampler 8 -> 16 kHz", lambda: up.process(speech)),
        ("VoiceActivity (webrtcvad + level)", lambda: vad.process_pcm(pcm8, 0)),
        ("EvidenceVad (webrtcvad + floor + window)", lambda: evidence.process_pcm(pcm8, 0)),
        ("Frame(...) for the agent", lambda: Frame(speech, RATE, 0)),
        ("whole pipeline, G.722 16 -> 16 kHz", lambda: same.process(pcm16, 0)),
        ("the same with the verdicts detector", lambda: same_verdicts.process(pcm16, 0)),
    ]
    parts = []
    for label, fn in rows:
        best = min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6
        parts.append(f"{label} {best:.1f} us")
    print("  " + "; ".join(parts))


def admission_and_interrupt_cost() -> None:
    playout = Playout(RATE, max_ms=60_000, source_rate=AGENT_RATE)
    chunk = to_int16(3000 * np.sin(2 * np.pi * 330 * np.arange(3200) / AGENT_RATE))  # 200 ms
    playout.begin("r", 0)
    started = time.perf_counter_ns()
    n = 250
    for _ in range(n):
        playout.admit("r", 0, chunk)
    admit_us = (time.perf_counter_ns() - started) / (n * CHUNK_FRAMES) / 1000
    started = time.perf_counter_ns()
    playout.interrupt(1)
    cut_us = (time.perf_counter_ns() - started) / 1000
    print(
        f"  admit at 16 kHz into an 8 kHz playout: {admit_us:5.1f} us per 20 ms of agent audio; "
        f"interrupt with 50 s queued: {cut_us:6.0f} us (asyncio side)"
    )


def threaded_stale_check(seconds: float) -> None:
    playout = Playout(RATE, max_ms=120_000)
    counter = itertools.count()
    cut_seq: dict[int, int] = {}
    stale = pulled = 0
    stop = threading.Event()

    def media() -> None:
        nonlocal stale, pulled
        while not stop.is_set():
            begun = next(counter)
            frame = playout.pull()
            tag = int.from_bytes(frame[:2], "little", signed=True)
            if tag:
                pulled += 1
                if cut_seq.get(tag, begun + 1) < begun:
                    stale += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    thread = threading.Thread(target=media, daemon=True)
    thread.start()
    generation = cuts = 0
    rng = np.random.default_rng(7)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            number = cuts + 1
            rid = f"r{number}"
            playout.begin(rid, generation)
            for _ in range(int(rng.integers(1, 6))):
                playout.admit(rid, generation, agent_chunk(number))
            time.sleep(0)
            generation += 1
            playout.interrupt(generation)
            cut_seq[number] = next(counter)
            for _ in range(2):  # the agent's late chunks
                playout.admit(rid, generation - 1, agent_chunk(number))
            cuts += 1
    finally:
        stop.set()
        thread.join(timeout=10)
        sys.setswitchinterval(old)
    print(
        f"  {cuts} interrupts racing a free-running pull thread, {pulled} agent frames pulled: "
        f"stale frames that reached pull(): {stale}; stale chunks dropped at admission: "
        f"{playout.stale_dropped}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[4, 16], help="besides 1 call")
    parser.add_argument("--seconds", type=float, default=30.0, help="media seconds per call")
    parser.add_argument("--onsets", type=int, default=300, help="caller utterances for latency")
    args = parser.parse_args()
    print("reproduce: python " + shlex.join(["bench/pipeline.py", *sys.argv[1:]]))
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    speech = utterances()
    if not have_espeak():
        print("  (espeak-ng not found: caller speech is the SIPp capture only)")
    print("CPU per 20 ms frame per call (inbound pipeline 8 -> 16 kHz + VAD, barge-in, pull):")
    for calls in sorted({1, *args.calls}):
        cpu_per_frame(calls, args.seconds, speech)
    components()
    admission_and_interrupt_cost()
    print("Barge-in latency (media clock, 20 ms ticks; asyncio acts before the next tick):")
    barge_in_latency(args.onsets, speech)
    print("Concurrency:")
    threaded_stale_check(3.0)


if __name__ == "__main__":
    main()
