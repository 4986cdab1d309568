"""Frame-path figures: microseconds per frame for the bridge's copies; server CPU per call-minute.

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/frame_path.py                 # micro figures + 4 concurrent SIPp calls on the
                                               # C media port, then on the Python port
    python bench/frame_path.py --calls 2 --duration 20 --compare
                                               # also the Python port with the slow SWIG copy

The call figures start ``voicegate serve`` on free loopback ports with a temporary data directory,
run N concurrent SIPp callers (each plays 7 s of A-law speech, sends DTMF and stays about 15 s),
and read the server's CPU time from /proc before and after. Loopback only; bounded in count and
time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pjsua2 as pj  # noqa: E402

from telephony.c_media_port import CPortLibrary, CRing  # noqa: E402
from telephony.frame_copy import (  # noqa: E402
    fast_read,
    fast_read_frame,
    fast_write,
    fast_write_frame,
    slow_read,
    slow_read_frame,
    slow_write,
    slow_write_frame,
)
from telephony.media_bridge import MediaChannel, frame_bytes  # noqa: E402
from tests.integration.harness import Server, Sipp, wait_for  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def per_frame_us(fn: object, number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6  # type: ignore[arg-type]


def micro(rate: int) -> None:
    size = frame_bytes(rate)
    pcm = bytes(range(256)) * (size // 256) + bytes(size % 256)
    vec = pj.ByteVector(pcm)
    target = pj.ByteVector()
    channel = MediaChannel(rate, inbound_frames=1 << 20)
    incoming = pj.MediaFrame()
    incoming.type = pj.PJMEDIA_FRAME_TYPE_AUDIO
    incoming.buf = vec
    incoming.size = size
    requested = pj.MediaFrame()
    rows = [
        ("read  naive bytes(vec)", lambda: slow_read(vec), 2000),
        ("read  fast pointer copy", lambda: fast_read(vec), 100_000),
        ("write naive slice assignment", lambda: slow_write(target, pcm), 5000),
        ("write fast memmove", lambda: fast_write(target, pcm), 100_000),
        ("frame in, SWIG attributes", lambda: slow_read_frame(incoming), 2000),
        ("frame in, through the layout", lambda: fast_read_frame(incoming), 100_000),
        ("frame out, SWIG attributes", lambda: slow_write_frame(requested, pcm), 5000),
        ("frame out, through the layout", lambda: fast_write_frame(requested, pcm), 100_000),
        ("ring push (media thread, in)", lambda: channel.push_inbound(pcm), 100_000),
        ("playout pull (media thread, out)", channel.playout.pull, 100_000),
    ]
    lib = CPortLibrary.load()
    port = lib.new_port("bench", rate)
    ring = CRing(lib, port, lib.vg.vg_port_attach(port), size)
    out = bytes(size)
    two = pcm * 2

    def c_tick() -> None:
        lib.vg.vg_port_tick(port, out, pcm)

    def c_round() -> None:
        # What asyncio does per 40 ms tick: two frames in, two caller frames out.
        ring.push(two, 1, True)
        ring.take()

    rows += [
        ("C port tick, both callbacks (ctypes)", c_tick, 100_000),
        ("C ring: push 2 + take (asyncio, 40 ms)", c_round, 100_000),
    ]
    print(f"  {rate} Hz, {size}-byte frame:")
    for label, fn, number in rows:
        print(f"    {label:<42}{per_frame_us(fn, number):8.2f} us")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def calls_run(calls: int, duration: float, port: str, fast: bool, work: Path) -> None:
    server = Server(
        work / f"{port}-{'fast' if fast else 'slow'}",
        env_overrides={
            "VOICEGATE_MEDIA_PORT": port,
            "VOICEGATE_MEDIA_FAST_FRAME_COPY": "true" if fast else "false",
            "VOICEGATE_LOG_LEVEL": "warning",
        },
    ).start()
    try:
        assert server.process is not None
        pid = server.process.pid
        idle0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(3)
        idle_rate = (cpu_seconds(pid) - idle0) / (time.monotonic() - t0)
        rounds = max(1, int(duration // 15))
        cpu0, wall0 = cpu_seconds(pid), time.monotonic()
        call_seconds = 0.0
        for i in range(rounds):
            sipp = Sipp(
                "uac-speech-dtmf.xml",
                server.sip_target,
                work / f"sipp{i}",
                calls=calls,
                rate=50,
                limit=calls,
            ).start()
            wait_for(lambda: len(server.live_calls()) == calls, 10, f"{calls} live calls")
            started = time.monotonic()
            code = sipp.wait()
            call_seconds += calls * (time.monotonic() - started)
            if code != 0:
                print(f"    SIPp exit {code}: {sipp.errors()[-500:]}")
        cpu = cpu_seconds(pid) - cpu0
        wall = time.monotonic() - wall0
        busy = cpu - idle_rate * wall
        label = (
            "C media port"
            if port == "c"
            else f"Python port, {'fast pointer copy' if fast else 'naive SWIG copy'}"
        )
        print(f"  {calls} concurrent calls, {label}:")
        print(
            f"    server CPU {cpu:.2f} s over {wall:.1f} s wall ({100 * cpu / wall:.1f}% of a core)"
        )
        print(f"    idle CPU   {100 * idle_rate:.2f}% of a core")
        print(
            f"    CPU per call-minute (above idle): {60 * busy / call_seconds:.3f} s "
            f"({100 * busy / call_seconds:.2f}% of a core per call)"
        )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--calls", type=int, default=4, help="concurrent SIPp calls (<= 4 per process)"
    )
    parser.add_argument(
        "--duration", type=float, default=30, help="seconds of calls (rounds of ~15 s)"
    )
    parser.add_argument(
        "--compare", action="store_true", help="also the Python port with the slow copy"
    )
    parser.add_argument("--no-calls", action="store_true", help="micro figures only")
    args = parser.parse_args()
    if not 1 <= args.calls <= 4:
        parser.error("--calls must be 1 to 4 (one process holds at most 4 calls)")
    print("Frame copy, per 20 ms frame (microseconds):")
    for rate in (8000, 16000):
        micro(rate)
    if args.no_calls:
        return
    print("Server CPU with real SIPp calls (loopback):")
    with tempfile.TemporaryDirectory(prefix="vg-bench-") as tmp:
        calls_run(args.calls, args.duration, "c", True, Path(tmp))
        calls_run(args.calls, args.duration, "python", True, Path(tmp))
        if args.compare:
            calls_run(args.calls, args.duration, "python", False, Path(tmp))


if __name__ == "__main__":
    main()
