"""Barge-in on noisy lines, measured on real calls (issue 21).

Prints figures, never passes or fails (STYLE.md).

    python bench/bargein.py                  # every case, seed 21
    python bench/bargein.py --seed 5 --noises pink,babble --snrs 10
    python bench/bargein.py --write-fixtures tests/fixtures/vad   # also save frame fixtures

One ``voicegate serve`` (demo agent, its defaults unless ``--env KEY=VALUE``) on loopback; SIPp
callers that play A-law captures made here (tests/fixtures/noise.py) while tcpdump records both
directions of the RTP, so what the caller sent and what the caller heard are both on the wire.

Cases, for each noise (pink, brown, babble of six espeak-ng voices, low-passed car rumble) at each
SNR (20, 10, 5 dB; noise at the tests' speech level minus the SNR):

* **noise only**: ``--noise-s`` of noise and nothing else while the agent greets and reads its
  menu. Every barge-in is false and every committed caller turn came from noise (session log).
* **speech over noise**: the same noise throughout, and ``--utterances`` short lines from
  espeak-ng voices no test uses (en-gb-scotland, en-029, en-gb-x-rp, en-us-nyc), meant to start
  while the agent talks (lines that start while it is silent are not counted). The latency is
  from the line's first sample on the wire (the caller's packet that carried it) to the end of
  the last loud packet the caller heard before 600 ms of silence; over 1 s is a *missed*
  barge-in (the agent talked on over the caller).

Figures: false barge-ins per minute and false caller turns per minute (noise only, per minute of
call), with **acted/min**, the utterances the demo agent acted on (``caller_said`` not rejected:
the recogniser's own endpointer can hear "hang up" in noise the detector ignores), missed
barge-ins, and barge-in latency at the caller's ear (median and p95); for speech, also the caller
turns committed against the lines spoken (more turns than lines: lines split at a
pause, audio.vad_hangover_ms) and the barge-ins judged false. Up to
``--at-once`` calls run together (the server holds 4); the machine's other work shares the CPU.

``--breakdown`` also splits each counted line's latency where the time goes (median and p95 of
each part over the case's lines, and every line with ``--lines``):

* **detector**: from the line's first sample to the end of the frame on which the segment held
  ``audio.barge_in_min_speech_ms`` of evidence, the detector alone on the same audio (A-law and
  back, up to the bridge's 16 kHz, no server: what bench/vad_sweep.py measures), with the
  detector's defaults;
* **to cut**: from the line's first packet on the wire to the server's ``call.barge_in`` log
  line (wall clock, both): the detector's time plus PJSIP's jitter buffer, the media port's ring
  and the wait for the next audio tick (``audio.tick_ms``); **in** is that minus the detector;
* **after**: from the log line to the end of the last loud packet the caller heard: what was
  already past the playout when it was cleared (the C port's ring is cleared with it; PJSIP's
  bridge and encoder are not).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audio.evidence_vad import EvidenceVad  # noqa: E402
from audio.resample import resample  # noqa: E402
from audio.vad import SpeechStarted  # noqa: E402
from config.settings import AudioSettings, MediaSettings  # noqa: E402
from tests.fixtures.noise import NOISES, RATE, encode_alaw, write_rtp_pcap  # noqa: E402
from tests.fixtures.noisy_caller import Case, build  # noqa: E402
from tests.fixtures.speech import decode_alaw  # noqa: E402
from tests.integration.harness import (  # noqa: E402
    LOOPBACK,
    Server,
    free_port,
    rtp_range,
    wait_for,
)
from tests.integration.rtp_capture import Capture, RtpPacket  # noqa: E402
from voicegate.runtime import inbound_vad  # noqa: E402

LOUD = 300.0  # RMS of an A-law frame of prompt audio (silence decodes to +-8)

SCENARIO = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<!-- bench/bargein.py: a caller plays one capture from the answer on, then hangs up. -->
<scenario name="voicegate bench: noisy caller">
  <send retrans="500"><![CDATA[

      INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

      v=0
      o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[media_ip_type] [media_ip]
      t=0 0
      m=audio [media_port] RTP/AVP 8 101
      a=rtpmap:8 PCMA/8000
      a=rtpmap:101 telephone-event/8000
      a=ptime:20

  ]]></send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="200" rtd="true" rrs="true"/>
  <send><![CDATA[

      ACK [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      [routes]
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Length: 0

  ]]></send>
  <nop><action><exec play_pcap_audio="{pcap}"/></action></nop>
  <pause milliseconds="{pause_ms}"/>
  <send retrans="500"><![CDATA[

      BYE [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      [routes]
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Length: 0

  ]]></send>
  <recv response="200" crlf="true"/>
</scenario>
"""


def run_batch(server: Server, batch: list[Case], work: Path) -> list[RtpPacket]:
    capture = Capture(work / "rtp.pcap", server.rtp_min, server.rtp_max)
    callers: list[subprocess.Popen[bytes]] = []
    try:
        for case in batch:
            slug = case.name.replace(" ", "")
            pcap = work / f"{slug}.pcap"
            write_rtp_pcap(pcap, case.audio)
            scenario = work / f"{slug}.xml"
            pause_ms = round(len(case.audio) / RATE * 1000) + 500
            scenario.write_text(SCENARIO.format(pcap=pcap, pause_ms=pause_ms))
            # SIPp binds this port and the next three (audio, video): a block of the harness's
            # RTP ports, as its Sipp takes; consecutive free_port() picks overlapped.
            case.media_port = rtp_range(4)[0]
            case.service = f"bench{len(callers)}"
            args = [
                "sipp", "-sf", str(scenario), server.sip_target, "-m", "1", "-i", LOOPBACK,
                "-p", str(free_port()), "-mp", str(case.media_port), "-s", case.service,
                "-timeout", "120s", "-timeout_error", "-nostdin",
            ]
            callers.append(
                subprocess.Popen(args, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            )
        for caller in callers:
            _, err = caller.communicate(timeout=180)
            if caller.returncode != 0:
                print(f"  sipp exited {caller.returncode}: {err.decode()[-300:]}", file=sys.stderr)
    finally:
        packets = capture.stop()
    return packets


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live descendants (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # it ended while we looked
            stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, grew = {pid}, True
    while grew:
        more = {child for child, (parent, _) in stats.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(stats[p][1] for p in tree if p in stats)


def cut_times(server: Server) -> dict[str, list[float]]:
    """Per called user: the wall-clock times (s) of the server's ``call.barge_in`` log lines."""
    users = {
        s["session_id"]: next(
            e["payload"]["called_user"] for e in s["events"] if e["type"] == "call_offered"
        )
        for s in server.sessions()
    }
    out: dict[str, list[float]] = {}
    for event in server.log_events():
        if event.get("event") == "call.barge_in" and event.get("call_id") in users:
            at = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()
            out.setdefault(users[event["call_id"]], []).append(at)
    return out


def detector_delays(case: Case) -> list[float | None]:
    """Per line of ``case``: ms from its first sample to the end of the frame on which its
    segment held ``barge_in_min_speech_ms`` of evidence (the detector's defaults, at the bridge's
    16 kHz after A-law); None if it never did."""
    audio = AudioSettings()
    config = inbound_vad(audio)
    rate = MediaSettings().clock_rate
    pcm = resample(decode_alaw(encode_alaw(case.audio)), RATE, rate)
    vad, step = EvidenceVad(rate, config), rate // 50
    hits, armed = [], False
    for at in range(0, len(pcm) - step + 1, step):
        event = vad.process_pcm(pcm[at : at + step].tobytes(), at)
        if isinstance(event, SpeechStarted):
            armed = True
        if armed and vad.speech_ms >= audio.barge_in_min_speech_ms:
            armed = False
            hits.append((at + step) / rate)
    delays: list[float | None] = []
    for start, length in case.lines:
        got = [h for h in hits if start <= h <= start + length]
        delays.append((got[0] - start) * 1000 if got else None)
    return delays


def no_counts(failed: int = 0) -> dict[str, int]:
    """A called user's counts before any session (``failed``: 1 for a call that never was)."""
    return {"cuts": 0, "turns": 0, "seconds": 0, "failed": failed, "false": 0, "acted": 0}


def session_counts(server: Server) -> dict[str, dict[str, int]]:
    """Per called user: barge-ins (speech) and committed caller turns, from the session log."""
    wait_for(lambda: all(s["ended"] for s in server.sessions()) or None, 20, "sessions to end")
    out: dict[str, dict[str, int]] = {}
    for session in server.sessions():
        events = session["events"]
        offered = next(e for e in events if e["type"] == "call_offered")
        counts = out.setdefault(offered["payload"]["called_user"], no_counts())
        counts["seconds"] += events[-1]["at"] - events[0]["at"]
        counts["failed"] += session["ended"]["terminal_state"] != "completed"
        # The bench's callers press no key, so every interrupted response was cut by speech.
        counts["cuts"] += sum(1 for e in events if e["type"] == "response_interrupted")
        counts["turns"] += sum(1 for e in events if e["type"] == "turn_committed")
        counts["false"] += sum(
            1
            for e in events
            if e["type"] == "barge_in_judged" and e["payload"]["outcome"] == "false"
        )
        # What the demo agent acted on of what the recogniser heard: from noise alone, a caller
        # turn as surely as a committed one (a "hang up" ends the call).
        counts["acted"] += sum(
            1
            for e in events
            if e["type"] == "caller_said" and e["payload"]["decision"] != "rejected"
        )
    return out


SILENT_S = 0.6  # longer than any pause inside a prompt (at most 0.52 s): the agent stopped
MISSED_MS = 1000.0  # the agent talked over a second of the caller's line: not a barge-in


@dataclass
class Line:
    """Where one counted line's latency went (ms; None where it cannot be told)."""

    index: int
    latency: float
    detector: float | None = None
    to_cut: float | None = None

    @property
    def after(self) -> float | None:
        return None if self.to_cut is None else self.latency - self.to_cut

    @property
    def inbound(self) -> float | None:
        if self.to_cut is None or self.detector is None:
            return None
        return self.to_cut - self.detector


def speech_figures(
    case: Case, packets: list[RtpPacket], cuts: list[float] | None = None
) -> tuple[list[Line], int, int]:
    """The lines the agent talked over and was cut by, lines missed, lines it talked over.

    For a line that began while the agent was loud (within 300 ms before): the cut is the end of
    the last loud packet before the first silence of :data:`SILENT_S` the caller heard after the
    onset; a cut more than :data:`MISSED_MS` after the onset is a missed barge-in. With ``cuts``
    (the server's barge-in times), each line also gets the first of them after its onset.
    """
    sent = [p for p in packets if p.src_port == case.media_port and p.payload_type == 8]
    if not sent:
        return [], 0, 0
    server_port = sent[0].dst_port
    loud = sorted(
        p.at
        for p in packets
        if p.src_port == server_port and p.dst_port == case.media_port and p.rms > LOUD
    )
    latencies: list[Line] = []
    missed, eligible = 0, 0
    for number, (start, _length) in enumerate(case.lines):
        index = round(start * 50)
        if index >= len(sent):
            continue
        onset = sent[index].at
        if not any(onset - 0.3 <= t < onset for t in loud):
            continue  # the agent was not talking: nothing to barge in on
        eligible += 1
        cut = onset - 0.02
        for t in loud:
            if t < onset:
                continue
            if t - cut > SILENT_S:
                break
            cut = t
        latency = (cut + 0.02 - onset) * 1000
        if latency > MISSED_MS:
            missed += 1
            continue
        line = Line(number, latency)
        decided = [t for t in cuts or () if onset <= t <= cut + 0.02]
        if decided:
            line.to_cut = (decided[0] - onset) * 1000
        latencies.append(line)
    return latencies, missed, eligible


FIXTURE_S = 2.0


def write_fixtures(cases: list[Case], directory: Path) -> None:
    """2 s of each case's caller audio, A-law as it goes on the wire (8 kB/s), and an index.

    Noise only: the first 2 s. Speech over noise: from 1 s before the first line. The index
    (``index.json``) gives each file's case and, for speech, the line's onset in the file (ms).
    """
    directory.mkdir(parents=True, exist_ok=True)
    index = {}
    for case in cases:
        slug = f"{case.noise}-{case.snr}db-{'speech' if case.speech else 'noise'}"
        begin = round((case.lines[0][0] - 1.0) * RATE) if case.speech else 0
        clip = case.audio[begin : begin + round(FIXTURE_S * RATE)]
        (directory / f"{slug}.alaw").write_bytes(encode_alaw(clip))
        index[slug] = {
            "noise": case.noise,
            "snr_db": case.snr,
            "onset_ms": round(case.lines[0][0] * 1000 - begin * 1000 / RATE)
            if case.speech
            else None,
        }
    (directory / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(index)} fixtures to {directory}")


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(np.ceil(0.95 * len(ordered))) - 1)]


def spread(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return f"{'-':>11}"
    return f"{statistics.median(known):>5.0f}/{p95(known):<5.0f}"


def breakdown_row(case: Case, lines: list[Line], every: bool) -> list[str]:
    delays = detector_delays(case)
    for line in lines:
        line.detector = delays[line.index]
    rows = [
        f"  {case.name:22} detector {spread([x.detector for x in lines])}"
        f"  in {spread([x.inbound for x in lines])}  to cut {spread([x.to_cut for x in lines])}"
        f"  after {spread([x.after for x in lines])}  (median/p95 ms, {len(lines)} lines)"
    ]
    if every:
        for x in lines:
            parts = [x.detector, x.inbound, x.to_cut, x.after]
            shown = " ".join(f"{p:>5.0f}" if p is not None else f"{'-':>5}" for p in parts)
            rows.append(f"    line {x.index}: {x.latency:>5.0f} = det+in+after {shown}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--noises", default=",".join(NOISES))
    parser.add_argument("--snrs", default="20,10,5")
    parser.add_argument("--noise-s", type=float, default=30.0)
    parser.add_argument("--utterances", type=int, default=8)
    parser.add_argument("--at-once", type=int, default=3)
    parser.add_argument("--only", choices=("noise", "speech", "both"), default="both")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    parser.add_argument("--work", type=Path, help="keep logs and captures here (else a temp dir)")
    parser.add_argument(
        "--write-fixtures", type=Path, help="write the detector's unit-test fixtures here and stop"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="also where each case's latency goes (see above)"
    )
    parser.add_argument("--lines", action="store_true", help="with --breakdown: every line")
    args = parser.parse_args()
    cases = [
        Case(noise, int(snr), speech)
        for speech in {"noise": [False], "speech": [True], "both": [False, True]}[args.only]
        for noise in args.noises.split(",")
        for snr in args.snrs.split(",")
    ]
    for case in cases:
        build(case, args.seed, args.noise_s, args.utterances)
    if args.write_fixtures:
        write_fixtures(cases, args.write_fixtures)
        return
    env = dict(item.split("=", 1) for item in args.env)
    started = time.monotonic()
    rows, details = [], []
    cpu_s = call_s = 0.0
    ticks = {"steady": 0.0, "barge_in": 0.0}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.work or Path(scratch)
        for b in range(0, len(cases), args.at_once):
            batch = cases[b : b + args.at_once]
            work = tmp / f"batch{b}"
            work.mkdir(parents=True)
            server = Server(work / "server", env_overrides=env).start()
            try:
                assert server.process is not None
                cpu_before = tree_cpu_s(server.process.pid)
                packets = run_batch(server, batch, work)
                cpu_s += tree_cpu_s(server.process.pid) - cpu_before
                counts = session_counts(server)
                cuts = cut_times(server) if args.breakdown else {}
                for pace in ticks:  # 0 from a server older than audio.barge_in_tick_ms
                    ticks[pace] += server.metric("voicegate_media_ticks_total", pace=pace)
            finally:
                server.stop()
            for case in batch:
                got = counts.get(case.service, no_counts(failed=1))
                call_s += got["seconds"]
                minutes = max(got["seconds"], 1) / 60
                ended = "FAILED" if got["failed"] else ""
                if case.speech:
                    lines, missed, eligible = speech_figures(
                        case, packets, cuts.get(case.service)
                    )
                    lat = [line.latency for line in lines]
                    if args.breakdown:
                        details += breakdown_row(case, lines, args.lines)
                    rows.append(
                        f"{case.name:22} {'':>8} {'':>8} {missed:>3}/{eligible:<3} "
                        + (f"{statistics.median(lat):>7.0f} {p95(lat):>7.0f}" if lat else " " * 15)
                        + f" {got['seconds']:>5.0f} turns {got['turns']}/{len(case.lines)}"
                        f" false {got['false']} {ended}"
                    )
                else:
                    rows.append(
                        f"{case.name:22} {got['cuts'] / minutes:>8.1f}"
                        f" {got['turns'] / minutes:>8.1f} {'':>23} {got['seconds']:>5.0f}"
                        f" {got['acted'] / minutes:>9.1f} {ended}"
                    )
                print(rows[-1], flush=True)
    print()
    print(f"seed {args.seed}, {time.monotonic() - started:.0f} s, env {env or 'defaults'}")
    # The server's process tree while the calls ran, idle costs included (its own threads).
    print(
        f"server CPU {cpu_s:.1f} s over {call_s:.0f} s of calls:"
        f" {100 * cpu_s / max(call_s, 1):.2f}% of a core per call"
    )
    all_ticks = sum(ticks.values())
    print(
        f"media ticks {all_ticks:.0f}: {ticks['barge_in']:.0f} at the barge-in pace"
        f" ({100 * ticks['barge_in'] / max(all_ticks, 1):.1f}%)"
    )
    print(
        f"{'case':22} {'cuts/min':>8} {'turns/min':>8} {'missed':>7} {'med ms':>7} {'p95 ms':>7}"
        f" {'call s':>5} {'acted/min':>9}"
    )
    for row in rows:
        print(row)
    if details:
        print()
        print("where the time goes (detector + in = to cut; to cut + after = the latency):")
        for row in details:
            print(row)


if __name__ == "__main__":
    main()
