"""Bridged-transfer figures: set-up time, audio transit delay through the bridge each way, and
the server's CPU while two people talk through it.

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/bridge.py               # 3 rounds, one bridged call at a time
    python bench/bridge.py --rounds 5

Each round starts a SIPp desk (``uas-callcentre.xml``) and a SIPp caller
(``uac-transfer-bridged.xml``) against one ``voicegate serve`` on loopback, asks for a bridged
transfer through the API once the call is answered, and captures the RTP with tcpdump. Transit
delay is the lag that best lines up the speech envelope entering voicegate on one leg with the
envelope leaving it on the other (10 ms steps). Loopback only; about 20 s a round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.harness import (  # noqa: E402
    LOOPBACK,
    Server,
    Sipp,
    free_port,
    wait_for,
)
from tests.integration.rtp_capture import Capture, RtpPacket  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
STEP_S = 0.01


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def envelope(packets: list[RtpPacket], start: float, end: float) -> np.ndarray:
    grid = np.zeros(int((end - start) / STEP_S) + 1)
    for p in packets:
        if start <= p.at <= end:
            grid[int((p.at - start) / STEP_S)] = max(grid[int((p.at - start) / STEP_S)], p.rms)
    return grid


def transit_ms(into: list[RtpPacket], out_of: list[RtpPacket], start: float, end: float) -> float:
    a, b = envelope(into, start, end), envelope(out_of, start, end)
    lags = range(0, 40)  # 0 to 400 ms
    scores = [float(np.dot(a[: len(a) - lag], b[lag:])) for lag in lags]
    return lags[int(np.argmax(scores))] * STEP_S * 1000


def one_round(work: Path) -> dict[str, float]:
    server = Server(work / "server", env_overrides={
        "VOICEGATE_TRANSFER_ALLOWED_TARGETS": "sip:desk@127.0.0.1:*",
    }).start()
    try:
        capture = Capture(work / "rtp.pcap", server.rtp_min, server.rtp_max)
        port = free_port()
        desk = Sipp("uas-callcentre.xml", "", work / "desk", port=port).start()
        caller = Sipp("uac-transfer-bridged.xml", server.sip_target, work / "caller").start()
        calls = wait_for(
            lambda: [c for c in server.live_calls() if c["state"] == "answered" and c["media"]],
            10,
            "an answered call",
        )
        asked = time.time()
        status, body = server.post_json(
            f"/v1/calls/{calls[0]['call_id']}/transfer",
            {"target": f"sip:desk@{LOOPBACK}:{port}", "mode": "bridge"},
        )
        assert status == 202, body
        assert server.process is not None
        wait_for(lambda: server.metric("voicegate_bridged_legs_active") == 2, 10, "the bridge")
        cpu_before, wall_before = cpu_s(server.process.pid), time.monotonic()
        caller.wait()
        cpu_after, wall_after = cpu_s(server.process.pid), time.monotonic()
        desk.wait()
        packets = capture.stop()
    finally:
        server.stop()
    ours = range(server.rtp_min, server.rtp_max + 1)
    sent: dict[int, list[RtpPacket]] = defaultdict(list)
    received: dict[int, list[RtpPacket]] = defaultdict(list)
    for p in packets:
        if p.payload_type != 8:
            continue
        if p.src_port in ours:
            sent[p.src_port].append(p)
        elif p.dst_port in ours:
            received[p.dst_port].append(p)
    caller_port, desk_port = sorted(sent, key=lambda port: sent[port][0].at)
    bridged_at = sent[desk_port][0].at
    end = max(p.at for p in packets)
    return {
        "setup_ms": (bridged_at - asked) * 1000,
        "caller_to_desk_ms": transit_ms(received[caller_port], sent[desk_port], bridged_at, end),
        "desk_to_caller_ms": transit_ms(received[desk_port], sent[caller_port], bridged_at, end),
        "cpu_pct": (cpu_after - cpu_before) / (wall_after - wall_before) * 100,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            figures = one_round(Path(tmp) / f"round{n}")
            rounds.append(figures)
            print(f"round {n + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        print(f"{key}: median {statistics.median(values):.1f} (min {min(values):.1f}, "
              f"max {max(values):.1f})")


if __name__ == "__main__":
    main()
