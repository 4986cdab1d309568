"""Capture a call's RTP on loopback with tcpdump and read it back: who sent what audio, when."""

from __future__ import annotations

import shutil
import signal
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def _alaw_table() -> np.ndarray:
    # ITU-T G.711 A-law expansion, for all 256 codes.
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << (exponent - 1)
    )
    return np.where(sign != 0, magnitude, -magnitude).astype(np.int16)


ALAW = _alaw_table()
_LINK_HEADER = {1: 14, 113: 16, 276: 20, 0: 4}  # Ethernet, Linux SLL, SLL2, BSD loopback


@dataclass(frozen=True, slots=True)
class RtpPacket:
    at: float
    src_port: int
    dst_port: int
    payload_type: int
    seq: int
    rms: float
    # The strongest frequency of an A-law frame (50 Hz bins at 8 kHz) and its share of the
    # frame's energy: near 1 for a pure tone, low for speech or noise.
    peak_hz: float = 0.0
    peak_share: float = 0.0


def _peak(audio: np.ndarray) -> tuple[float, float]:
    power = np.abs(np.fft.rfft(audio.astype(np.float64))) ** 2
    power[0] = 0.0
    total = float(power.sum())
    if total == 0.0:
        return 0.0, 0.0
    k = int(np.argmax(power))
    share = float(power[max(k - 1, 0) : k + 2].sum()) / total
    return k * 8000 / len(audio), share


def read_rtp(path: Path) -> list[RtpPacket]:
    data = path.read_bytes()
    magic, _, _, _, _, _, link = struct.unpack("<IHHiIII", data[:24])
    assert magic == 0xA1B2C3D4, "expected a little-endian microsecond pcap"
    offset, skip = 24, _LINK_HEADER[link]
    packets = []
    while offset + 16 <= len(data):
        sec, usec, incl, _ = struct.unpack("<IIII", data[offset : offset + 16])
        frame = data[offset + 16 : offset + 16 + incl]
        offset += 16 + incl
        ip = frame[skip:]
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
            continue
        ihl = (ip[0] & 0x0F) * 4
        src, dst = struct.unpack(">HH", ip[ihl : ihl + 4])
        rtp = ip[ihl + 8 :]
        if len(rtp) < 12 or rtp[0] >> 6 != 2:
            continue
        pt = rtp[1] & 0x7F
        seq = struct.unpack(">H", rtp[2:4])[0]
        audio = ALAW[np.frombuffer(rtp[12:], dtype=np.uint8)] if pt == 8 else np.zeros(1)
        rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))) if len(audio) else 0.0
        peak_hz, peak_share = _peak(audio) if pt == 8 and len(audio) > 1 else (0.0, 0.0)
        packets.append(RtpPacket(sec + usec / 1e6, src, dst, pt, seq, rms, peak_hz, peak_share))
    return packets


class Capture:
    """``tcpdump`` on ``interface`` (``lo`` by default) for UDP in a port range, to a pcap file,
    only what ``source`` sends when it is given; stop() flushes it."""

    def __init__(
        self,
        path: Path,
        port_min: int,
        port_max: int,
        *,
        interface: str = "lo",
        source: str | None = None,
    ) -> None:
        tcpdump = shutil.which("tcpdump")
        assert tcpdump, "tcpdump is needed for RTP captures (apt-get install tcpdump)"
        self.path = path
        match = f"udp portrange {port_min}-{port_max}"
        if source is not None:
            match = f"src host {source} and {match}"
        self.process = subprocess.Popen(
            [tcpdump, "-i", interface, "-U", "-n", "-w", str(path), match],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        assert self.process.stderr is not None
        line = self.process.stderr.readline().decode()
        assert "listening on" in line, line

    def stop(self) -> list[RtpPacket]:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()
        return read_rtp(self.path)


@dataclass(frozen=True, slots=True)
class BargeIn:
    """A captured barge-in: what the server sent (PCMA), when the caller's speech began and
    ended, and the cut (the last loud frame the server sent within 2 s of the onset)."""

    sent: list[RtpPacket]
    onset: float
    speech_end: float
    cut: float


def barge_in(
    packets: list[RtpPacket], server_ports: range, *, loud: float, voice: float
) -> BargeIn:
    sent = [p for p in packets if p.src_port in server_ports and p.payload_type == 8]
    speech = [
        p for p in packets if p.dst_port in server_ports and p.payload_type == 8 and p.rms > voice
    ]
    assert sent and speech, (len(sent), len(speech))
    onset = speech[0].at
    cut = max((p.at for p in sent if onset <= p.at <= onset + 2 and p.rms > loud), default=onset)
    return BargeIn(sent, onset, speech[-1].at, cut)
