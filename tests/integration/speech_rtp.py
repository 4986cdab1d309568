"""A caller who talks: espeak-ng speaks the caller's lines, and they become an RTP stream in a
pcap that SIPp plays into a real call (``play_pcap_audio``), as G.711 A-law at 8 kHz or G.722
at 16 kHz, with RFC 2833 key presses where the script has them.

The stream is continuous from start to end (low noise between the lines, as a phone line has),
so the server sees no media gap; a key press replaces the audio packets for its 100 ms. Run
as a script to write a pcap for a deployment:

    .venv/bin/python -m tests.integration.speech_rtp --codec g722 --out /tmp/speech-g722.pcap
"""

from __future__ import annotations

import argparse
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import G722
import numpy as np
from numpy.typing import NDArray

from audio.speech.synth import Synthesizer, Voice

PAYLOAD_TYPES = {"pcma": 8, "g722": 9}
RATES = {"pcma": 8000, "g722": 16000}
DTMF_PT = 101
NOISE_SIGMA = 30.0  # about -61 dBFS of line noise
_DTMF_EVENTS = {**{str(d): d for d in range(10)}, "*": 10, "#": 11}
_SSRC = 0x5EEC4


@dataclass(frozen=True, slots=True)
class Say:
    at_s: float
    text: str
    voice: Voice


@dataclass(frozen=True, slots=True)
class Keys:
    at_s: float
    digits: str


Step = Say | Keys


def _alaw_encode(samples: NDArray[np.int16]) -> bytes:
    # ITU-T G.711 A-law: sign, 3-bit segment, 4-bit mantissa, even bits inverted.
    x = samples.astype(np.int32)
    sign = np.where(x >= 0, 0x80, 0x00)
    magnitude = np.minimum(np.abs(x), 32767) >> 3
    segment = np.zeros_like(magnitude)
    for threshold in (32, 64, 128, 256, 512, 1024, 2048):
        segment += magnitude >= threshold
    mantissa = np.where(segment == 0, magnitude >> 1, magnitude >> segment) & 0x0F
    code = (sign | (segment << 4) | mantissa) ^ 0x55
    return bytes(code.astype(np.uint8).tobytes())


def caller_track(
    steps: Sequence[Step], rate: int, length_s: float, seed: int = 7
) -> NDArray[np.int16]:
    """The caller's audio: line noise with each spoken line placed at its time."""
    rng = np.random.default_rng(seed)
    track = rng.normal(0.0, NOISE_SIGMA, round(length_s * rate))
    synth = Synthesizer()
    for step in steps:
        if isinstance(step, Say):
            speech = synth.say(step.text, rate, step.voice).astype(np.float64) * 0.5
            start = round(step.at_s * rate)
            if start + len(speech) > len(track):
                raise ValueError(f"{step.text!r} at {step.at_s} s runs past {length_s} s")
            track[start : start + len(speech)] += speech
    return np.clip(np.rint(track), -32768, 32767).astype(np.int16)


def _dtmf_frames(steps: Sequence[Step]) -> dict[int, tuple[int, int, bool]]:
    """Frame index -> (event, duration in timestamp units so far, end bit)."""
    frames: dict[int, tuple[int, int, bool]] = {}
    for step in steps:
        if isinstance(step, Keys):
            first = round(step.at_s / 0.02)
            for n, digit in enumerate(step.digits):
                start = first + n * 15  # 100 ms tone, 200 ms apart
                for i in range(5):
                    frames[start + i] = (_DTMF_EVENTS[digit], 160 * (i + 1), False)
                for i in range(5, 8):  # the end packet, sent three times (RFC 4733 2.5.1.4)
                    frames[start + i] = (_DTMF_EVENTS[digit], 800, True)
    return frames


def rtp_packets(steps: Sequence[Step], codec: str, length_s: float) -> list[bytes]:
    """The caller's RTP, one packet per 20 ms."""
    rate = RATES[codec]
    track = caller_track(steps, rate, length_s)
    size = rate // 50
    encoder = G722.G722(16000, 64000) if codec == "g722" else None
    dtmf = _dtmf_frames(steps)
    packets = []
    event_ts = 0
    for index in range(len(track) // size):
        timestamp = index * 160  # both codecs: an 8000 Hz RTP clock (RFC 3551 4.5.2 for G.722)
        frame = track[index * size : (index + 1) * size]
        if index in dtmf:
            event, duration, end = dtmf[index]
            if duration == 160 and not end:
                event_ts = timestamp
            marker = 0x80 if duration == 160 and not end else 0
            header = struct.pack(">BBHII", 0x80, marker | DTMF_PT, index & 0xFFFF, event_ts, _SSRC)
            payload = struct.pack(">BBH", event, (0x80 if end else 0) | 10, duration)
        else:
            pt = PAYLOAD_TYPES[codec]
            header = struct.pack(">BBHII", 0x80, pt, index & 0xFFFF, timestamp, _SSRC)
            payload = encoder.encode(frame) if encoder is not None else _alaw_encode(frame)
        packets.append(header + payload)
    return packets


def write_pcap(path: Path, packets: Sequence[bytes]) -> None:
    """``packets`` as UDP on Ethernet/IPv4, 20 ms apart (SIPp replaces the addresses)."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for n, rtp in enumerate(packets):
        udp = struct.pack(">HHHH", 40000, 20000, 8 + len(rtp), 0) + rtp
        ip = struct.pack(
            ">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), n & 0xFFFF, 0, 64, 17, 0,
            bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]),
        ) + udp  # fmt: skip
        frame = b"\x00" * 12 + b"\x08\x00" + ip
        at_us = n * 20000
        sec, usec = divmod(at_us, 1_000_000)
        out.append(struct.pack("<IIII", sec, usec, len(frame), len(frame)))
        out.append(frame)
    path.write_bytes(b"".join(out))


VOICES = (Voice("en-us", 150), Voice("en+f3", 185))


def payment_script(codec: str) -> tuple[list[Step], float]:
    """What the caller of the spoken-payment test says, and when; and how long the stream is.

    An out-of-grammar sentence first (it must get a re-prompt, not an action), then the payment
    by voice, then "hang up" and "yes" when asked whether to end the call. At 8 kHz the caller
    keys the amount (5 9 #) instead of saying it: spoken amounts through G.711 are unreliable
    (docs/speech.md), and a scripted caller who then says "yes" to whatever was heard would
    confirm a wrong amount; the agent offers the keypad for that."""
    first, second = VOICES if codec == "g722" else VOICES[::-1]
    steps: list[Step] = [
        Say(0.5, "what is the weather like today", first),
        Say(4.0, "make a payment", second),
        Say(7.0, "fifty nine cents", first) if codec == "g722" else Keys(7.0, "59#"),
        Say(10.5, "yes", second),
        # "hang up", not "goodbye": this voice's "goodbye" at 16 kHz is a near miss against
        # the menu's "i would like ..." (lost in 1 of 30 runs with a few frames of it dropped,
        # as a loaded machine's jitter buffer does; "hang up" in none).
        Say(13.5, "hang up", second),
        # Asked whether to end the call: "yes", over the question (a barge-in).
        Say(16.0, "yes", second),
    ]
    return steps, 20.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", choices=sorted(PAYLOAD_TYPES), default="g722")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    steps, length = payment_script(args.codec)
    write_pcap(args.out, rtp_packets(steps, args.codec, length))


if __name__ == "__main__":
    main()
