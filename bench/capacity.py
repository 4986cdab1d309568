"""Pool capacity: concurrent calls with speech both ways through Kamailio, and a set-up rate ramp.

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/capacity.py                          # steps 20..100 calls, baseline, rate ramp
    python bench/capacity.py --steps 4,8 --hold 10 --rates 10,20   # a quick look
    python bench/capacity.py --resample-quality 4     # PJSIP's small resampling filter, both sides
    python bench/capacity.py --clock-rate 8000        # a narrowband bridge, both sides
    python bench/capacity.py --speech                 # the demo agent recognising every caller
    python bench/capacity.py --store postgresql       # the pool on a throw-away PostgreSQL
    python bench/capacity.py --store both --steps 60,100 --hold 20   # SQLite, then PostgreSQL
    python bench/capacity.py --nodes 2 --steps 8,16 --hold 15 --no-baseline --rates 10,20

For each step it starts N SIPp callers through the pool's Kamailio (a pool of ceil(N_max / 4)
workers, at least 2, 4 calls each), waits until all N are answered, then for ``--hold`` seconds
measures:

- CPU of the workers, as a percentage of one core, in all and per call (above the idle pool);
- busy share of the machine: all of it (SIPp, tcpdump and this script included), and the pool's
  own processes alone (supervisor, workers, Kamailio);
- the same per-call figure for a C-only pjsua2 baseline (``bench/pjsua2_baseline.py``: same
  wheel and media settings, WAV player out and null sound device in, no Python per frame) run
  with the same number of calls through its own Kamailio, and the ratio of the two;
- frames per second per call moved by each worker's media port (should be 50.0 both ways);
- the p99 interval between the RTP packets each call sends (tcpdump on loopback): the media
  clock's callback interval as the caller sees it;
- memory (RSS) per call above the idle pool;

then the set-up rate ramp: short calls at increasing rates, counting the calls answered, refused
to the caller (486/503) and failed per rate, and the 486/503 the workers gave (Kamailio then
tries the next worker, so a call can be refused by one and answered by another), the highest rate
with every call answered, and whether any worker process died (an abort would show as a
restart). Loopback only, bounded in calls and time.

``--store`` picks the session store the pool writes: ``sqlite`` (the default: the embedded file
in the pool's data directory), ``postgresql`` (a throw-away cluster, tests/pg_cluster.py, and a
fresh database the pool is pointed at with VOICEGATE_STORAGE_URL; the database server's own CPU
is reported apart, as it is no process of the pool), or ``both``: the same steps for each store
one after the other, then the figures side by side. After each run the store's sessions are
counted, which shows the pool really wrote where it was told to.

On PostgreSQL a probe times the store's writes while each step holds its calls (and once while
the pool idles): a thread in this script appends a small event (bench/store.py's tool intent,
a few hundred bytes) through session/store/postgres.py every 20 ms to a session of its own, and
the step reports that append's p50 and p99. voicegate has no metric of its own store latency, so
this is what any writer of the database waits for beside the pool's, not the workers' own
appends. The probe's sessions (``bench-store/...``, ended ``completed``) are not counted among
the pool's.

``--nodes 2``: the same steps and ramp against a cluster (tests/integration/cluster.py): two
nodes on two hosts (network namespaces, tests/netns.py), each a supervisor over ceil(N_max / 8)
workers (at least 2), behind the cluster's Kamailio on the gateway, sharing one throw-away
PostgreSQL there (so ``--store`` is postgresql). The callers run in the root namespace on the
gateway address. Each step then also reports the calls each node held, the RTP is captured on
the network's bridge (each node's packets apart), and "pool" is both nodes' processes and
Kamailio.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from audio.prompts import PromptLibrary, default_prompts_dir  # noqa: E402
from config.settings import AudioSettings  # noqa: E402
from session.store import SessionSummary, StoreError  # noqa: E402
from session.store.location import SQLITE_FILE, StoreLocation  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402
from tests.integration.cluster import running_cluster as running_nodes  # noqa: E402
from tests.integration.harness import (  # noqa: E402
    Server,
    Sipp,
    free_port,
    free_port_block,
    rtp_range,
    wait_for,
)
from tests.integration.rtp_capture import Capture, RtpPacket  # noqa: E402
from tests.pg_cluster import PgCluster, running_cluster  # noqa: E402
from voicegate.pool.front_door import find_executable  # noqa: E402
from voicegate.pool.kamailio_config import (  # noqa: E402
    STAT_NO_WORKER,
    FrontDoor,
    render_config,
    render_dispatcher_list,
)

CLK_TCK = os.sysconf("SC_CLK_TCK")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
PAGE = os.sysconf("SC_PAGE_SIZE")
SPEECH_S = 7.2  # pcap/g711a.pcap
BASELINE_PROMPT = "greeting"
STORES = ("sqlite", "postgresql")
PROBE_EVERY_S = 0.02  # the store probe's pace: one small append every 20 ms
PROBE_WARM_UP = 10
CALLS_PER_WORKER = 4

# A caller that talks for its whole call: the A-law speech capture, again and again.
SPEAKING_CALLER = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="capacity: a caller who keeps talking">
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
  <nop><action><assign assign_to="n" value="0"/></action></nop>
  <label id="talk"/>
  <nop><action><exec play_pcap_audio="pcap/g711a.pcap"/></action></nop>
  <pause milliseconds="{speech_ms}"/>
  <nop><action>
    <add assign_to="n" value="1"/>
    <test assign_to="again" variable="n" compare="less_than" value="{loops}"/>
  </action></nop>
  <nop next="talk" test="again"/>
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


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (FileNotFoundError, ProcessLookupError):
        return 0


def pss_bytes(pid: int) -> int:
    """Proportional set size: private pages, plus each shared page divided by its sharers. Sums
    over processes to what they really hold (RSS counts a page every process shares each time)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


@dataclass(frozen=True)
class Memory:
    """PSS of a pool: its workers one by one, and all its processes together."""

    workers: list[int]  # bytes, one per worker
    total: int  # bytes: supervisor, fork server, workers, Kamailio

    @classmethod
    def of(cls, workers: Iterable[int], own: Iterable[int]) -> Memory:
        return cls([pss_bytes(p) for p in workers], sum(pss_bytes(p) for p in own))

    def text(self) -> str:
        mib = [w / 2**20 for w in self.workers] or [0.0]
        return (
            f"PSS per worker {statistics.fmean(mib):.1f} MiB (min {min(mib):.1f}, max "
            f"{max(mib):.1f}), pool {self.total / 2**20:.0f} MiB in all"
        )


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (Kamailio forks its workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


class CpuWindow:
    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = list(pids)
        self.start_cpu = {pid: cpu_seconds(pid) for pid in self.pids}
        self.start = time.monotonic()

    def percent(self) -> float:
        """CPU since the start, as a percentage of one core."""
        spent = sum(cpu_seconds(pid) - self.start_cpu[pid] for pid in self.pids)
        return 100.0 * spent / (time.monotonic() - self.start)


class MachineCpu:
    """Busy share of the whole machine (every core, every process: SIPp and Kamailio too)."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    def percent(self) -> float:
        total, idle = self._read()
        spent = total - self.start[0]
        return 100.0 * (spent - (idle - self.start[1])) / spent if spent else 0.0


def write_scenario(work: Path, call_s: float) -> Path:
    loops = max(1, math.ceil(call_s / SPEECH_S))
    path = work / f"speaking-caller-{loops}.xml"
    path.write_text(SPEAKING_CALLER.format(speech_ms=round(SPEECH_S * 1000), loops=loops))
    return path


@dataclass(frozen=True)
class BridgeMedia:
    """What the pool and the C-only baseline share: PJSIP's resample quality and bridge rate."""

    quality: int
    clock_rate: int

    def baseline_wav(self, work: Path) -> Path:
        """The baseline's outbound audio at the bridge's rate (a WAV at another rate would give
        its player a resampler that a worker's port does not need)."""
        path = work / f"{BASELINE_PROMPT}-{self.clock_rate}.wav"
        samples = PromptLibrary(default_prompts_dir()).get(BASELINE_PROMPT, self.clock_rate)
        with wave.open(str(path), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(self.clock_rate)
            out.writeframes(samples.astype("<i2").tobytes())
        return path


@dataclass
class Step:
    calls: int
    held: int
    held_stale: bool  # the supervisor did not answer the last scrape: held is an older count
    cpu_total: float
    cpu_per_call: float
    fps_in: float
    fps_out: float
    interval_p99_ms: float
    wire_pps: float
    frames_seen: int  # calls whose frame counters the workers reported in time
    rss_per_call_mb: float
    pss_per_call_mb: float  # the pool's PSS (all its processes) above the idle pool, per call
    memory: Memory  # the pool's PSS while the step held its calls
    machine_busy: float
    pool_busy: float
    baseline_per_call: float | None = None
    db_cpu: float | None = None  # the PostgreSQL server's processes, % of one core (not the pool's)
    per_node: dict[str, int] | None = None  # calls each node held (--nodes 2)
    write: WriteLatency | None = None  # the store probe's appends meanwhile (PostgreSQL)


def rtp_interval_p99_ms(work: Path, rtp: tuple[int, int], seconds: float) -> tuple[float, float]:
    """p99 of the gaps between consecutive packets each server RTP port sends, and the mean
    packets per second per port (on the wire, whatever the control plane can still answer)."""
    capture = Capture(work / f"rtp-{time.monotonic_ns()}.pcap", *rtp)
    time.sleep(seconds)
    packets = capture.stop()
    return interval_figures(
        {port: times for (_, port), times in sent_by_port([packets], rtp).items()}
    )


def sent_by_port(
    captures: list[list[RtpPacket]], rtp: tuple[int, int]
) -> dict[tuple[int, int], list[float]]:
    """When each (capture, server RTP port) sent its packets."""
    by_port: dict[tuple[int, int], list[float]] = {}
    for index, packets in enumerate(captures):
        for packet in packets:
            if rtp[0] <= packet.src_port <= rtp[1]:
                by_port.setdefault((index, packet.src_port), []).append(packet.at)
    return by_port


def interval_figures(by_port: dict[Any, list[float]]) -> tuple[float, float]:
    """p99 of the gaps between each port's consecutive packets (ms), and its mean packets per
    second."""
    gaps: list[float] = []
    for times in by_port.values():
        gaps.extend(b - a for a, b in itertools.pairwise(times))
    if not gaps:
        return float("nan"), float("nan")
    gaps.sort()
    pps = statistics.fmean(
        (len(times) - 1) / (times[-1] - times[0]) for times in by_port.values() if len(times) > 1
    )
    return gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1000, pps


@dataclass(frozen=True)
class WriteLatency:
    """The store probe's appends over one window."""

    samples: int
    p50_ms: float
    p99_ms: float
    errors: int

    def text(self) -> str:
        errors = f", {self.errors} errors" if self.errors else ""
        return f"p50 {self.p50_ms:.2f} / p99 {self.p99_ms:.2f} ms ({self.samples} writes{errors})"


class WriteProbe:
    """A thread that appends one small event every PROBE_EVERY_S through the store's own code
    (bench/store.py's Writer: its tool intent, on a session of the probe's own) and times each
    append; :meth:`stop` gives the figures."""

    def __init__(self, location: StoreLocation) -> None:
        from store import Writer  # bench/store.py (it imports this module: so, here)

        self.store = location.open()
        self.writer = Writer(self.store, "probe")
        for _ in range(PROBE_WARM_UP):  # untimed: the connection, the statements' first plans
            self.writer.step(checkpoint=False)
        self.latencies_ns: list[int] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                elapsed, _ = self.writer.step(checkpoint=False)
                self.latencies_ns.append(elapsed)
            except StoreError:
                self.errors += 1
                self.writer.abandon()
            next_at += PROBE_EVERY_S
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> WriteLatency:
        self._stop.set()
        self._thread.join(timeout=30)
        try:
            self.writer.close()
        finally:
            self.store.close()
        ordered = sorted(self.latencies_ns)

        def ms(q: float) -> float:
            if not ordered:
                return float("nan")
            return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] / 1e6

        return WriteLatency(len(ordered), ms(0.5), ms(0.99), self.errors)


@contextlib.contextmanager
def probing(location: StoreLocation | None) -> Iterator[list[WriteLatency]]:
    """Times the store's writes for the block (PostgreSQL only: None or a file gives nothing);
    the figures are in the yielded list once the block is over."""
    found: list[WriteLatency] = []
    if location is None or not location.url:
        yield found
        return
    probe = WriteProbe(location)
    try:
        yield found
    finally:
        found.append(probe.stop())


def not_the_probes(summary: SessionSummary) -> bool:
    return summary.meta.get("bench") != "store"


class Target(Protocol):
    """What the steps and the ramp run against: one pool (:class:`Pool`) or the nodes of a
    cluster (:class:`Nodes`)."""

    workers: int
    local_ip: str  # where SIPp binds

    @property
    def sip_target(self) -> str: ...
    def ready(self) -> int: ...
    def worker_pids(self) -> list[int]: ...
    def restarts(self) -> int: ...
    def answered(self) -> int: ...
    def answered_by_node(self) -> dict[str, int] | None: ...
    def frames(self) -> dict[str, tuple[int, int]]: ...
    def metrics(self) -> Samples: ...
    def live_calls(self) -> list[dict[str, Any]]: ...
    def own_pids(self) -> list[int]: ...
    def rtp_interval(self, work: Path, seconds: float) -> tuple[float, float]: ...
    def store(self) -> StoreLocation: ...


def capacity_env(media: BridgeMedia, settings: dict[str, str]) -> dict[str, str]:
    """The settings every serving process of this bench runs with, beside its ports."""
    return {
        "VOICEGATE_LOG_LEVEL": "warning",
        # Per worker; the pool admits workers x this. The ramp measures the whole.
        "VOICEGATE_SIP_MAX_SETUP_RATE": "30",
        # Every SIPp caller is one source (127.0.0.1), like a carrier trunk: no per-source
        # limit at the front door, or the ramp would measure pike instead of the pool.
        "VOICEGATE_POOL_SOURCE_MAX_RATE": "0",
        "VOICEGATE_SESSION_NO_INPUT_S": "0",
        "VOICEGATE_POOL_START_TIMEOUT_S": "120",
        "VOICEGATE_MEDIA_RESAMPLE_QUALITY": str(media.quality),
        "VOICEGATE_MEDIA_CLOCK_RATE": str(media.clock_rate),
        **settings,
    }


class WorkerCounts:
    """What a target derives from its workers' rows (``GET /v1/pool``, one node's or all)."""

    def workers_now(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def ready(self) -> int:
        return sum(1 for w in self.workers_now() if w["state"] == "ready")

    def worker_pids(self) -> list[int]:
        return [int(w["pid"]) for w in self.workers_now() if w["pid"]]

    def restarts(self) -> int:
        return sum(int(w["restarts"]) for w in self.workers_now())


class Pool(WorkerCounts):
    def __init__(
        self, work: Path, workers: int, media: BridgeMedia, settings: dict[str, str]
    ) -> None:
        self.rtp = rtp_range(size=max(40, 8 * workers + 8))
        env = {
            "VOICEGATE_POOL_WORKERS": str(workers),
            "VOICEGATE_POOL_WORKER_SIP_PORT": str(free_port_block(workers)),
            "VOICEGATE_POOL_WORKER_HTTP_PORT": str(free_port_block(workers, udp_and_tcp=False)),
            "VOICEGATE_MEDIA_RTP_PORT_MIN": str(self.rtp[0]),
            "VOICEGATE_MEDIA_RTP_PORT_MAX": str(self.rtp[1]),
            **capacity_env(media, settings),
        }
        self.server = Server(work / "pool", env_overrides=env)
        self.workers = workers
        self._answered = 0
        self.stale = False  # the last scrape of /metrics failed: _answered is an older count
        self.local_ip = "127.0.0.1"

    @property
    def sip_target(self) -> str:
        return self.server.sip_target

    def store(self) -> StoreLocation:
        """Where the pool keeps its sessions: the database its settings name, else the embedded
        file in its data directory."""
        url = self.server.env_overrides.get("VOICEGATE_STORAGE_URL", "")
        return StoreLocation(url, self.server.data_dir / SQLITE_FILE)

    def start(self) -> None:
        self.server.start()
        wait_for(lambda: self.ready() == self.workers, 180, "every worker ready")

    def workers_now(self) -> list[dict[str, Any]]:
        status, body = self.server.http("/v1/pool")
        assert status == 200, body
        return list(body["workers"])

    def answered(self) -> int:
        # From the supervisor's /metrics (the workers' multiprocess files): a saturated worker
        # may be too slow to answer /v1/calls, but its gauge is on disk. A saturated machine
        # may starve the supervisor past the scrape's timeout too: then the last figure stands
        # (the step measures what the pool holds; it must not die of a slow scrape).
        status, body = self.server.http("/metrics")
        self.stale = status != 200
        if status == 200:
            for family in text_string_to_metric_families(body):
                for sample in family.samples:
                    if sample.name == "voicegate_calls_active" and not sample.labels:
                        self._answered = int(sample.value)
        return self._answered

    def frames(self) -> dict[str, tuple[int, int]]:
        status, body = self.server.http("/v1/calls")
        if status != 200:
            return {}
        return {
            c["call_id"]: (c["frames_in"], c["frames_out"])
            for c in body["calls"]
            if c.get("frames_in") is not None
        }

    def answered_by_node(self) -> dict[str, int] | None:
        return None  # one pool: no nodes

    def metrics(self) -> Samples:
        return self.server.metrics()

    def live_calls(self) -> list[dict[str, Any]]:
        return self.server.live_calls()

    def own_pids(self) -> list[int]:
        """The supervisor, its workers and its Kamailio."""
        assert self.server.process is not None
        return descendants(self.server.process.pid)

    def rtp_interval(self, work: Path, seconds: float) -> tuple[float, float]:
        return rtp_interval_p99_ms(work, self.rtp, seconds)


_STAT = re.compile(r"^\s*script:(\w+)\s*=\s*(\d+)\s*$", re.M)


class Nodes(WorkerCounts):
    """The nodes of a cluster (tests/integration/cluster.py) behind its Kamailio, as one target:
    what a step reads of a pool, summed over the nodes."""

    def __init__(self, cluster: Cluster, workers_per_node: int, rtp: tuple[int, int]) -> None:
        self.cluster = cluster
        self.per_node = workers_per_node
        self.workers = workers_per_node * len(cluster.nodes)
        self.rtp = rtp
        self.local_ip = cluster.net.gateway

    @property
    def sip_target(self) -> str:
        assert self.cluster.door is not None
        return self.cluster.door.target

    def start(self) -> None:
        """Wait for every worker of every node ready and in Kamailio's set (running_nodes has
        started them)."""
        door = self.cluster.door
        assert door is not None
        wait_for(lambda: self.ready() == self.workers, 180, "every worker of both nodes ready")
        wait_for(
            lambda: len(door.active() or []) == self.workers, 60, "every worker in Kamailio's set"
        )

    def workers_now(self) -> list[dict[str, Any]]:
        found = []
        for server in self.cluster.nodes.values():
            status, body = server.http("/v1/pool")
            assert status == 200, body
            found.extend(body["workers"])
        return found

    def answered_by_node(self) -> dict[str, int]:
        return {
            name: int(server.metric("voicegate_calls_active"))
            for name, server in self.cluster.nodes.items()
        }

    def answered(self) -> int:
        return sum(self.answered_by_node().values())

    def frames(self) -> dict[str, tuple[int, int]]:
        found = {}
        for server in self.cluster.nodes.values():
            status, body = server.http("/v1/calls")
            if status == 200:
                for c in body["calls"]:
                    if c.get("frames_in") is not None:
                        found[c["call_id"]] = (c["frames_in"], c["frames_out"])
        return found

    def door_refused(self) -> int:
        """INVITEs Kamailio answered 503 itself, no worker in its set (its own counter, read
        over its ctl socket as a pool's supervisor reads it)."""
        door = self.cluster.door
        assert door is not None
        listed = subprocess.run(
            ["kamcmd", "-s", f"unix:{door.run_dir / 'kamailio-ctl.sock'}",
             "stats.get_statistics", "script:"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        found = {name: int(value) for name, value in _STAT.findall(listed.stdout)}
        return found.get(STAT_NO_WORKER, 0)

    def metrics(self) -> Samples:
        """Every node's samples summed by name and labels, with Kamailio's refusals as the
        pool's own front door would count them."""
        summed: Samples = {}
        for server in self.cluster.nodes.values():
            for sample, value in server.metrics().items():
                summed[sample] = summed.get(sample, 0.0) + value
        summed[("voicegate_front_door_refused_total", ())] = float(self.door_refused())
        return summed

    def live_calls(self) -> list[dict[str, Any]]:
        return [c for server in self.cluster.nodes.values() for c in server.live_calls()]

    def own_pids(self) -> list[int]:
        """Both nodes' supervisors and workers, and Kamailio."""
        pids = []
        for server in self.cluster.nodes.values():
            assert server.process is not None
            pids.extend(descendants(server.process.pid))
        door = self.cluster.door
        assert door is not None and door.process is not None
        return pids + descendants(door.process.pid)

    def rtp_interval(self, work: Path, seconds: float) -> tuple[float, float]:
        """As :func:`rtp_interval_p99_ms`, captured on the cluster's bridge, each node apart."""
        stamp = time.monotonic_ns()
        captures = [
            Capture(work / f"rtp-{stamp}-{host.name}.pcap", *self.rtp,
                    interface=self.cluster.net.bridge, source=host.address)
            for host in self.cluster.hosts.values()
        ]  # fmt: skip
        time.sleep(seconds)
        return interval_figures(sent_by_port([c.stop() for c in captures], self.rtp))

    def store(self) -> StoreLocation:
        return StoreLocation(self.cluster.store_url, Path("/nonexistent") / SQLITE_FILE)


def pool_workers(calls: int) -> int:
    """Workers for ``calls`` at 4 calls each; at least 2, as one worker is no pool (no Kamailio,
    no /v1/pool: pool.workers > 1)."""
    return max(2, math.ceil(calls / 4))


def pool_settings(
    *,
    media_port: str = "c",
    tick_ms: int = AudioSettings().tick_ms,
    speech: bool = False,
    storage_url: str = "",
    strict_source: str = "on",
    fork_server: str = "on",
) -> dict[str, str]:
    """The worker settings a pool runs with here (the defaults: this script's); ``storage_url``:
    the PostgreSQL database to keep its sessions in (empty: the embedded SQLite file)."""
    settings = {
        "VOICEGATE_MEDIA_PORT": media_port,
        "VOICEGATE_AUDIO_TICK_MS": str(tick_ms),
        "VOICEGATE_AGENT_SPEECH": "true" if speech else "false",
        # As beyond loopback (the default there): each call's RTP filtered to its caller.
        "VOICEGATE_MEDIA_STRICT_SOURCE": strict_source,
        "VOICEGATE_POOL_FORK_SERVER": "true" if fork_server == "on" else "false",
    }
    if storage_url:
        settings["VOICEGATE_STORAGE_URL"] = storage_url
    return settings


def place_calls(pool: Target, calls: int, work: Path, hold_s: float, name: str) -> Sipp:
    """Start ``calls`` talking callers (SIPp, 20 new calls a second) and wait until the pool
    holds them all, or for as long as the ramp should take: a saturated machine answers fewer,
    and the caller measures what it holds. Each caller hangs up by itself about ``hold_s`` after
    the ramp; :meth:`Sipp.wait` for them, or kill them once the pool stopped."""
    ramp_s = calls / 20 + 5
    wait_s = ramp_s + 20
    # Callers hang up by themselves once the hold is over: a killed SIPp would leave the
    # workers' BYEs retransmitting (and call slots held) for 32 s. They stay past the longest
    # wait below: a pool that never holds them all (a saturated machine, one call refused) must
    # still be measured while the others talk, not while they hang up.
    scenario = write_scenario(work, wait_s + 2 + hold_s + 4)
    callers = Sipp(
        str(scenario), pool.sip_target, work / name, calls=calls, rate=20,
        limit=calls, timeout_s=int(ramp_s + hold_s + 90), local_ip=pool.local_ip,
    ).start()  # fmt: skip
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and pool.answered() < calls:
            time.sleep(0.25)
    except BaseException:
        callers.kill()
        raise
    return callers


def database_pids(cluster: PgCluster) -> list[int]:
    """The PostgreSQL server's processes: its postmaster (the first line of its pid file) and
    every backend, WAL writer and checkpointer it forked."""
    postmaster = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
    return descendants(postmaster)


def count_sessions(
    location: StoreLocation, where: Callable[[SessionSummary], bool] | None = not_the_probes
) -> int | None:
    """How many sessions the store holds (only those ``where`` accepts, when given); None for
    an SQLite file that was never made."""
    if not location.url and not location.sqlite_path.exists():
        return None
    store = location.open()
    try:
        count, cursor = 0, None
        while True:
            page, cursor = store.list(limit=500, cursor=cursor)
            count += sum(1 for s in page if where is None or where(s))
            if cursor is None:
                return count
    finally:
        store.close()


def measure_step(
    pool: Target,
    calls: int,
    hold_s: float,
    work: Path,
    idle: dict[str, float],
    db_pids: Callable[[], list[int]] | None = None,
    probe: StoreLocation | None = None,
) -> Step:
    """One step of ``calls`` concurrent calls; ``db_pids``: the database server's processes,
    measured apart (PostgreSQL; the SQLite store is the workers' own writer thread); ``probe``:
    the database whose writes are timed meanwhile (:class:`WriteProbe`)."""
    callers = place_calls(pool, calls, work, hold_s, f"step-{calls}")
    try:
        time.sleep(2)  # let every call's media settle
        pids = pool.worker_pids()
        cpu = CpuWindow(pids)
        own = CpuWindow(pool.own_pids())
        db = CpuWindow(db_pids()) if db_pids is not None else None
        machine = MachineCpu()
        with probing(probe) as writes:
            held_before = pool.answered()
            before_stale = getattr(pool, "stale", False)
            frames_before, t0 = pool.frames(), time.monotonic()
            p99, wire_pps = pool.rtp_interval(work, min(5.0, hold_s / 2))
            time.sleep(max(0.0, hold_s - (time.monotonic() - t0)))
            frames_after, t1 = pool.frames(), time.monotonic()
        total = cpu.percent()
        pool_busy = own.percent() / (os.cpu_count() or 1)
        db_cpu = db.percent() if db is not None else None
        machine_busy = machine.percent()
        rss = sum(rss_bytes(pid) for pid in pids)
        memory = Memory.of(pids, pool.own_pids())
        # What the pool held all through the window: a call lost in it does not count. A
        # scrape the supervisor did not answer in time gives an older count: not that one.
        held_after = pool.answered()
        held = held_after if before_stale else min(held_before, held_after)
        held_stale = getattr(pool, "stale", False)
        per_node = pool.answered_by_node()
        callers.wait()
    finally:
        callers.kill()
    rates_in, rates_out = [], []
    for call_id, (fin, fout) in frames_after.items():
        if call_id in frames_before:
            rates_in.append((fin - frames_before[call_id][0]) / (t1 - t0))
            rates_out.append((fout - frames_before[call_id][1]) / (t1 - t0))
    wait_for(lambda: not pool.live_calls(), 60, "the step's calls to end")
    time.sleep(2)
    return Step(
        calls=calls,
        held=held,
        held_stale=held_stale,
        cpu_total=total,
        cpu_per_call=(total - idle["cpu"]) / max(1, held),
        machine_busy=machine_busy,
        pool_busy=pool_busy,
        fps_in=statistics.fmean(rates_in) if rates_in else float("nan"),
        fps_out=statistics.fmean(rates_out) if rates_out else float("nan"),
        interval_p99_ms=p99,
        wire_pps=wire_pps,
        frames_seen=len(rates_in),
        rss_per_call_mb=(rss - idle["rss"]) / max(1, held) / 2**20,
        pss_per_call_mb=(memory.total - idle["pss"]) / max(1, held) / 2**20,
        memory=memory,
        db_cpu=db_cpu,
        per_node=per_node,
        write=writes[0] if writes else None,
    )


def baseline_per_call(calls: int, hold_s: float, work: Path, media: BridgeMedia) -> float:
    """CPU per call (% of a core, above idle) of C-only pjsua2 callees behind their own Kamailio."""
    count = math.ceil(calls / 4)
    first = free_port_block(count)
    low, high = rtp_range(size=max(40, 8 * count + 8))
    width = ((high - low + 1) // count) & ~1
    wav = media.baseline_wav(work)
    procs = []
    for i in range(count):
        rtp = f"{low + i * width}-{low + (i + 1) * width - 1}"
        procs.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "pjsua2_baseline.py"), "--port",
                 str(first + i), "--rtp", rtp, "--wav", str(wav),
                 "--quality", str(media.quality), "--clock-rate", str(media.clock_rate)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
    for proc in procs:
        assert proc.stdout is not None
        # PJSIP logs a few lines to stdout before the log config applies.
        for _ in range(100):
            if b"baseline ready" in proc.stdout.readline():
                break
        else:
            raise RuntimeError("a baseline process did not start")
    run_dir = work / "baseline-front"
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    door = FrontDoor("127.0.0.1", port, run_dir / "ctl.sock", run_dir / "list", run_dir)
    (run_dir / "list").write_text(
        render_dispatcher_list([(f"b.{i}", f"sip:127.0.0.1:{first + i}") for i in range(count)])
    )
    (run_dir / "k.cfg").write_text(render_config(door))
    kamailio, _ = find_executable("kamailio")
    front = subprocess.Popen(
        [kamailio, "-f", str(run_dir / "k.cfg"), "-Y", str(run_dir), "-DD", "-E"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(2)
        pids = [p.pid for p in procs]
        idle = CpuWindow(pids)
        time.sleep(5)
        idle_cpu = idle.percent()
        ramp_s = calls / 20 + 5
        scenario = write_scenario(work, ramp_s + hold_s + 4)
        callers = Sipp(
            str(scenario), f"127.0.0.1:{port}", work / "baseline-calls", calls=calls, rate=20,
            limit=calls, timeout_s=int(ramp_s + hold_s + 90),
        ).start()  # fmt: skip
        time.sleep(ramp_s + 2)
        cpu = CpuWindow(pids)
        time.sleep(hold_s)
        spent = cpu.percent()
        callers.wait()
        callers.kill()
    finally:
        front.terminate()
        for proc in procs:
            proc.terminate()
        for proc in [front, *procs]:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return (spent - idle_cpu) / calls


def rate_ramp(pool: Target, rates: list[int], work: Path) -> int:
    """Prints each rate's counts; returns the highest rate with every call answered."""
    print("\nset-up rate ramp (uac-burst: INVITE, 200, ACK, BYE at once; 3 s per rate)")
    print(
        f"  {'rate/s':>7} {'calls':>6} {'answered':>9} {'refused':>8} {'by workers':>11} "
        f"{'failed':>7}  workers"
    )
    best = 0
    pids_before = set(pool.worker_pids())
    for rate in rates:
        calls = rate * 3
        before = pool.metrics()
        burst = Sipp(
            "uac-burst.xml", pool.sip_target, work / f"rate-{rate}", calls=calls,
            rate=rate, limit=max(8, pool.workers * 4), timeout_s=60, local_ip=pool.local_ip,
        )  # fmt: skip
        burst.run()
        after = pool.metrics()

        def delta(name: str, after: Samples = after, before: Samples = before) -> float:
            return sum(v for (n, _), v in after.items() if n == name) - sum(
                v for (n, _), v in before.items() if n == name
            )

        answered = int(delta("voicegate_calls_offered_total"))
        # A worker's 486 or 503 sends the INVITE on to the next worker (Kamailio's failover):
        # counted here once per refusal, so a call refused by one worker and taken by another
        # is in both columns. The caller is refused only when every try was.
        by_workers = int(delta("voicegate_calls_refused_total"))
        # uac-burst takes a 486 or 503 as a proper answer: what SIPp counts failed got none.
        failed_sipp = _sipp_failed(work / f"rate-{rate}")
        refused = max(0, calls - answered - failed_sipp)
        alive = set(pool.worker_pids())
        state = "all up" if alive == pids_before and pool.restarts() == 0 else "RESTARTED"
        print(
            f"  {rate:>7} {calls:>6} {answered:>9} {refused:>8} {by_workers:>11} "
            f"{failed_sipp:>7}  {state}"
        )
        if answered == calls and failed_sipp == 0:
            best = rate
        time.sleep(2)
    print(f"  highest rate with every call answered: {best}/s")
    return best


def _sipp_failed(work: Path) -> int:
    """Calls SIPp counted as failed for another reason than the refusal it expects."""
    stat = work / "uac-burst.stat.csv"
    if not stat.exists():
        return 0
    lines = stat.read_text().splitlines()
    if len(lines) < 2:
        return 0
    header, last = lines[0].split(";"), lines[-1].split(";")
    row = dict(zip(header, last, strict=False))
    return int(row.get("FailedCall(C)", "0") or 0)


@dataclass
class StoreRun:
    """One store's pass: the pool's steps and ramp, and what the store held afterwards."""

    store: str  # one of STORES
    where: str  # the file, or the database URL
    results: list[Step]
    idle_cpu: float  # the idle pool's workers, % of one core
    idle_db: float | None  # the idle database server, % of one core (PostgreSQL)
    best_rate: int | None  # from the ramp, when one ran
    sessions: int | None  # sessions the store held after the run
    idle_write: WriteLatency | None = None  # the store probe while the pool idled
    nodes: int = 1
    sessions_by_node: dict[str, int] = field(default_factory=dict)
    idle_memory: Memory | None = None

    def step(self, calls: int) -> Step | None:
        return next((s for s in self.results if s.calls == calls), None)


@dataclass
class Measured:
    results: list[Step]
    # The idle pool: its workers' "cpu" (% of one core) and "rss" (bytes), all its processes'
    # "pss" (bytes).
    idle: dict[str, float]
    idle_memory: Memory
    idle_db: float | None
    idle_write: WriteLatency | None
    best_rate: int | None


def measure(
    pool: Target,
    args: argparse.Namespace,
    work: Path,
    db_pids: Callable[[], list[int]] | None,
    probe: StoreLocation | None,
) -> Measured:
    """Idle the started ``pool``, run every step and the rate ramp, printing as it goes."""
    steps = [int(x) for x in args.steps.split(",")]
    rates = [int(x) for x in args.rates.split(",") if x]
    results: list[Step] = []
    time.sleep(3)
    pids = pool.worker_pids()
    window = CpuWindow(pids)
    db_window = CpuWindow(db_pids()) if db_pids is not None else None
    with probing(probe) as writes:
        time.sleep(5)
    idle_memory = Memory.of(pids, pool.own_pids())
    idle = {
        "cpu": window.percent(),
        "rss": float(sum(rss_bytes(p) for p in pids)),
        "pss": float(idle_memory.total),
    }
    idle_db = db_window.percent() if db_window is not None else None
    idle_write = writes[0] if writes else None
    database = f", database {idle_db:.1f}% of a core" if idle_db is not None else ""
    written = f"; store writes {idle_write.text()}" if idle_write is not None else ""
    print(
        f"  idle pool: {idle['cpu']:.1f}% of a core for {pool.workers} workers, "
        f"{idle['rss'] / 2**20:.0f} MiB RSS{database}{written}\n"
        f"    {idle_memory.text()}"
    )
    for calls in steps:
        step = measure_step(pool, calls, args.hold, work, idle, db_pids, probe)
        results.append(step)
        database = f", database {step.db_cpu:.0f}% of a core" if step.db_cpu is not None else ""
        nodes = (
            " (" + ", ".join(f"{n} {c}" for n, c in sorted(step.per_node.items())) + ")"
            if step.per_node is not None
            else ""
        )
        written = f", store writes {step.write.text()}" if step.write is not None else ""
        print(
            f"  step {calls:>3}: held {step.held}{'*' if step.held_stale else ''}{nodes}, "
            f"machine {step.machine_busy:.0f}% busy "
            f"(pool {step.pool_busy:.0f}%), "
            f"workers {step.cpu_total:.0f}% of a core, "
            f"{step.cpu_per_call:.2f}%/call, fps in/out {step.fps_in:.1f}/{step.fps_out:.1f} "
            f"({step.frames_seen} calls reported), RTP out {step.wire_pps:.1f} pkt/s/call, "
            f"RTP interval p99 {step.interval_p99_ms:.1f} ms, "
            f"{step.rss_per_call_mb:.1f} MiB/call{database}{written}\n"
            f"    {step.memory.text()}, {step.pss_per_call_mb:.1f} MiB PSS/call above idle",
            flush=True,
        )
    best_rate = rate_ramp(pool, rates, work) if rates else None
    return Measured(results, idle, idle_memory, idle_db, idle_write, best_rate)


def run_pool(
    store: str,
    args: argparse.Namespace,
    work: Path,
    workers: int,
    media: BridgeMedia,
    cluster: PgCluster | None,
) -> StoreRun:
    """Start a pool on ``store``, idle it, run every step and the rate ramp, stop it."""
    url = ""
    db_pids: Callable[[], list[int]] | None = None
    if store == "postgresql":
        assert cluster is not None
        cluster.create_database("capacity")
        url = cluster.url("capacity")
        db_pids = functools.partial(database_pids, cluster)
    settings = pool_settings(
        media_port=args.media_port,
        tick_ms=args.tick_ms,
        speech=args.speech,
        storage_url=url,
        strict_source=args.strict_source,
        fork_server=args.fork_server,
    )
    pool = Pool(work, workers, media, settings)
    where = pool.store().describe()
    print(f"  store: {store} ({where})", flush=True)
    try:
        pool.start()  # in the try: a pool that never got ready is stopped all the same
        got = measure(pool, args, work, db_pids, pool.store() if url else None)
    finally:
        pool.server.stop()
    sessions = count_sessions(pool.store())
    print(f"  sessions in the store after the run: {sessions} ({where})")
    if store == "postgresql":
        # A pool that ignored the URL would have written its embedded file instead.
        stray = count_sessions(StoreLocation("", pool.server.data_dir / SQLITE_FILE))
        if stray:
            print(
                f"  WARNING: {stray} sessions in the pool's SQLite file: it did not (only) "
                "write to PostgreSQL; are VOICEGATE_STORAGE_URL and the runtime wired?"
            )
    return StoreRun(
        store, where, got.results, got.idle["cpu"], got.idle_db, got.best_rate, sessions,
        got.idle_write, idle_memory=got.idle_memory,
    )  # fmt: skip


def node_workers(calls: int, nodes: int) -> int:
    """Workers per node for ``calls`` spread over ``nodes`` by Kamailio, 4 calls each."""
    return pool_workers(math.ceil(calls / nodes))


def run_nodes(args: argparse.Namespace, work: Path, media: BridgeMedia) -> StoreRun:
    """The same as :func:`run_pool` against two nodes behind one Kamailio on one PostgreSQL
    (tests/integration/cluster.py), the cluster started and removed here."""
    steps = [int(x) for x in args.steps.split(",")]
    per_node = node_workers(max(steps), args.nodes)
    # Each host is a network namespace of its own: the nodes may use the same ports.
    low = 20000
    rtp = (low, low + max(40, 8 * per_node + 8) - 1)
    settings = pool_settings(
        media_port=args.media_port,
        tick_ms=args.tick_ms,
        speech=args.speech,
        strict_source=args.strict_source,
        fork_server=args.fork_server,
    )
    env = {
        **capacity_env(media, settings),
        "VOICEGATE_POOL_WORKERS": str(per_node),
        "VOICEGATE_MEDIA_RTP_PORT_MIN": str(rtp[0]),
        "VOICEGATE_MEDIA_RTP_PORT_MAX": str(rtp[1]),
        # The product's health checks, not the cluster test's quick ones: a worker slowed by a
        # busy machine is not killed with its calls (config/settings.py).
        "VOICEGATE_POOL_HEALTH_INTERVAL_S": "1",
        "VOICEGATE_POOL_HEALTH_TIMEOUT_S": "5",
    }
    door_env = {"VOICEGATE_POOL_SOURCE_MAX_RATE": "0"}  # every caller is one source here
    with running_nodes(work / "nodes", env=env, door_env=door_env) as cluster:
        assert cluster.pg is not None
        pool = Nodes(cluster, per_node, rtp)
        where = pool.store().describe()
        print(
            f"  store: postgresql ({where}), {len(cluster.nodes)} nodes x {per_node} workers on "
            f"{cluster.net.subnet}, Kamailio on {pool.sip_target}",
            flush=True,
        )
        pool.start()
        got = measure(pool, args, work, functools.partial(database_pids, cluster.pg), pool.store())
        wait_for(lambda: not pool.live_calls(), 60, "the ramp's calls to end")
        sessions = count_sessions(pool.store())
        by_node: dict[str, int] = {}
        for name in cluster.nodes:
            by_node[name] = count_sessions(pool.store(), functools.partial(_owned_by, name)) or 0
    print(
        f"  sessions in the store after the run: {sessions} ({where}); by the node that held "
        "them: " + ", ".join(f"{n} {c}" for n, c in sorted(by_node.items()))
    )
    return StoreRun(
        "postgresql", where, got.results, got.idle["cpu"], got.idle_db, got.best_rate, sessions,
        got.idle_write, args.nodes, by_node, got.idle_memory,
    )  # fmt: skip


def _owned_by(node: str, summary: SessionSummary) -> bool:
    return not_the_probes(summary) and (summary.owner or "").startswith(f"{node}.")


def print_results(run: StoreRun, args: argparse.Namespace, media: BridgeMedia) -> None:
    print(
        f"\nconcurrent calls with speech both ways (G.711 A-law caller, "
        f"{media.clock_rate // 1000} kHz bridge, resample quality {media.quality}; "
        f"pool: {args.media_port} media port, {args.tick_ms} ms audio tick, strict source "
        f"{args.strict_source}, fork server {args.fork_server}; store: {run.store}"
        f"{f'; {run.nodes} nodes' if run.nodes > 1 else ''})"
    )
    nodes = run.nodes > 1
    writes = any(s.write is not None for s in run.results)
    print(
        f"  {'calls':>5} {'held':>5} {'machine':>8} {'pool':>5} {'workers':>8} {'CPU/call':>9} "
        f"{'C-only':>7} "
        f"{'ratio':>6} "
        f"{'fps in':>7} {'fps out':>8} {'wire':>6} {'p99 ms':>7} {'MiB/call':>9} "
        f"{'PSS/call':>9}"
        + (f" {'per node':>12}" if nodes else "")
        + (f" {'write p50/p99 ms':>17}" if writes else "")
    )
    for s in run.results:
        base = f"{s.baseline_per_call:.2f}%" if s.baseline_per_call is not None else "-"
        ratio = f"{s.cpu_per_call / s.baseline_per_call:.1f}x" if s.baseline_per_call else "-"
        per_node = " / ".join(str(c) for _, c in sorted((s.per_node or {}).items())) or "-"
        write = f"{s.write.p50_ms:.2f} / {s.write.p99_ms:.2f}" if s.write is not None else "-"
        print(
            f"  {s.calls:>5} {str(s.held) + ('*' if s.held_stale else ''):>5} "
            f"{s.machine_busy:>7.0f}% {s.pool_busy:>4.0f}% "
            f"{s.cpu_total:>7.0f}% "
            f"{s.cpu_per_call:>8.2f}% {base:>7} "
            f"{ratio:>6} {s.fps_in:>7.1f} {s.fps_out:>8.1f} {s.wire_pps:>6.1f} "
            f"{s.interval_p99_ms:>7.1f} "
            f"{s.rss_per_call_mb:>9.1f} {s.pss_per_call_mb:>9.1f}"
            + (f" {per_node:>12}" if nodes else "")
            + (f" {write:>17}" if writes else "")
        )
    if any(s.held_stale for s in run.results):
        print(
            "  *: the supervisor's /metrics did not answer within 5 s (a saturated machine): held\n"
            "  is the last count it gave, and every per-call figure of that step is meaningless."
        )
    if run.idle_memory is not None:
        print(f"  idle pool: {run.idle_memory.text()}")
    if run.idle_write is not None:
        print(f"  store writes with the pool idle: {run.idle_write.text()}")


def print_side_by_side(runs: list[StoreRun]) -> None:
    """Each figure of every store in one cell, ``sqlite / postgresql``."""

    def with_db(run: StoreRun, s: Step) -> str:
        if s.db_cpu is None or run.idle_db is None:
            return f"{s.cpu_per_call:.2f}%"
        return f"{s.cpu_per_call + (s.db_cpu - run.idle_db) / max(1, s.held):.2f}%"

    columns: list[tuple[str, Callable[[StoreRun, Step], str]]] = [
        ("held", lambda r, s: str(s.held)),
        ("machine", lambda r, s: f"{s.machine_busy:.0f}%"),
        ("pool", lambda r, s: f"{s.pool_busy:.0f}%"),
        ("database", lambda r, s: "-" if s.db_cpu is None else f"{s.db_cpu:.0f}%"),
        ("CPU/call", lambda r, s: f"{s.cpu_per_call:.2f}%"),
        ("CPU/call+db", with_db),
        ("fps in", lambda r, s: f"{s.fps_in:.1f}"),
        ("fps out", lambda r, s: f"{s.fps_out:.1f}"),
        ("p99 ms", lambda r, s: f"{s.interval_p99_ms:.1f}"),
        ("MiB/call", lambda r, s: f"{s.rss_per_call_mb:.1f}"),
    ]
    calls = sorted({s.calls for run in runs for s in run.results})
    header = ["calls", *(name for name, _ in columns)]
    rows = []
    for n in calls:
        row = [str(n)]
        for _, cell in columns:
            values = []
            for run in runs:
                step = run.step(n)
                values.append(cell(run, step) if step is not None else "-")
            row.append(" / ".join(values))
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\nby store: {' / '.join(run.store for run in runs)} (one after the other, same steps)")
    for row in [header, *rows]:
        print("  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    for run in runs:
        rate = f"{run.best_rate}/s" if run.best_rate is not None else "not ramped"
        print(
            f"  {run.store}: highest set-up rate with every call answered {rate}; "
            f"{run.sessions} sessions in the store ({run.where})"
        )
    print(
        "  database: the PostgreSQL server's processes, % of one core (not in pool or workers);\n"
        "  CPU/call+db: CPU/call plus the database's CPU above its idle, per call held."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="20,40,60,80,100", help="concurrent calls per step")
    parser.add_argument("--hold", type=float, default=20.0, help="seconds measured per step")
    parser.add_argument("--rates", default="10,20,40,60,80,120", help="set-up rates to ramp")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument(
        "--resample-quality", type=int, default=8,
        help="media.resample_quality for the pool and the C-only baseline alike (PJSIP: 8)",
    )  # fmt: skip
    parser.add_argument(
        "--clock-rate", type=int, choices=(8000, 16000), default=16000,
        help="media.clock_rate (the bridge's rate) for the pool and the baseline alike",
    )  # fmt: skip
    parser.add_argument(
        "--media-port", choices=("c", "python"), default="c",
        help="media.port of the pool's workers (the baseline is C-only either way)",
    )  # fmt: skip
    parser.add_argument(
        "--tick-ms", type=int, choices=(20, 40, 60), default=AudioSettings().tick_ms,
        help="audio.tick_ms of the pool's workers (default: voicegate's)",
    )  # fmt: skip
    parser.add_argument(
        "--speech", action="store_true",
        help="the demo agent with speech (agent.speech): every caller's audio is recognised; "
        "without it the demo takes no audio, the agent the capacity targets are for",
    )  # fmt: skip
    parser.add_argument(
        "--store", choices=(*STORES, "both"), default=None,
        help="the session store the pool writes: the embedded SQLite file (default), a "
        "throw-away PostgreSQL cluster (tests/pg_cluster.py), or both, one after the other "
        "(--nodes 2: postgresql only, the default there)",
    )  # fmt: skip
    parser.add_argument(
        "--nodes", type=int, choices=(1, 2), default=1,
        help="1: one pool on loopback; 2: two nodes in network namespaces behind one Kamailio "
        "on one PostgreSQL (tests/integration/cluster.py; needs root)",
    )  # fmt: skip
    parser.add_argument(
        "--strict-source", choices=("on", "off"), default="on",
        help="media.strict_source of the pool's workers (on: as beyond loopback, the kernel "
        "filter on every call's media sockets; off: to measure what it costs)",
    )  # fmt: skip
    parser.add_argument(
        "--fork-server", choices=("on", "off"), default="on",
        help="pool.fork_server (on: workers forked from one process that imported voicegate "
        "once; off: each worker its own interpreter, to measure what forking saves)",
    )  # fmt: skip
    parser.add_argument("--work", help="keep logs and captures here (default: a temp dir)")
    args = parser.parse_args()
    # A bench stopped with SIGTERM (a CI timeout, kill) unwinds like one stopped with ^C: every
    # `finally` stops what it started, so that no pool is left holding the machine's ports.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.store is None:
        args.store = "postgresql" if args.nodes > 1 else "sqlite"
    if args.nodes > 1 and args.store != "postgresql":
        parser.error("--nodes 2 shares one PostgreSQL: --store postgresql (or leave it out)")
    steps = [int(x) for x in args.steps.split(",")]
    stores = list(STORES) if args.store == "both" else [args.store]
    work = Path(args.work or tempfile.mkdtemp(prefix="voicegate-capacity-"))
    work.mkdir(parents=True, exist_ok=True)
    workers = pool_workers(max(steps))
    if args.nodes > 1:
        per_node = node_workers(max(steps), args.nodes)
        print(
            f"voicegate capacity: {args.nodes} nodes x {per_node} workers x {CALLS_PER_WORKER} "
            f"calls behind one Kamailio, {os.cpu_count()} cores"
        )
    else:
        print(
            f"voicegate capacity: {workers} workers x {CALLS_PER_WORKER} calls behind Kamailio, "
            f"{os.cpu_count()} cores"
        )
    print(f"  work dir: {work}")
    print(f"  agent: the demo {'with speech' if args.speech else 'without speech (no audio)'}")
    media = BridgeMedia(args.resample_quality, args.clock_rate)
    runs: list[StoreRun] = []
    if args.nodes > 1:
        runs.append(run_nodes(args, work, media))
        stores = []
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(running_cluster()) if "postgresql" in stores else None
        if cluster is not None:
            print(f"  PostgreSQL: throw-away cluster on port {cluster.port} ({cluster.directory})")
        for store in stores:
            # One store alone keeps the work dir's layout of before; several get one dir each.
            store_work = work if len(stores) == 1 else work / store
            if len(stores) > 1:
                print(f"\n{store}:")
            runs.append(run_pool(store, args, store_work, workers, media, cluster))
    if not args.no_baseline and runs[0].results:
        # The comparison means something where the pool held every call of the step.
        full = [s for s in runs[0].results if s.held == s.calls] or runs[0].results
        top = max(full, key=lambda s: s.calls)
        per_call = baseline_per_call(top.calls, args.hold, work, media)
        for run in runs:
            step = run.step(top.calls)
            if step is not None:
                step.baseline_per_call = per_call
    for run in runs:
        print_results(run, args, media)
    print(
        "  machine: busy share of all cores, SIPp, tcpdump and this script included.\n"
        "  pool: share of all cores taken by the pool's own processes (supervisor, workers,\n"
        "  Kamailio).\n"
        "  workers, CPU/call: % of one core, per call above the idle pool.\n"
        "  fps: frames each call's media port moved (calls whose worker answered in time).\n"
        "  wire: RTP packets per second each call sent its caller.\n"
        "  MiB/call: the workers' RSS above the idle pool, per call; PSS/call: the same of every\n"
        "  process of the pool in PSS (shared pages divided among their sharers).\n"
        "  targets (issue 34): 200 calls under 75% machine at 50.0 fps, RTP p99 <= 25 ms,\n"
        "  CPU/call <= 1.3x C-only, idle worker PSS <= 20 MiB; with --speech, 80 calls under 75%."
    )
    if args.store != "sqlite":
        print_side_by_side(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
