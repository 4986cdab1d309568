"""SIP over TLS and SRTP with a real softphone (issue 33): baresip calls the demo agent over TLS
with ``media.srtp = "mandatory"``, hears the greeting and presses 9 (goodbye: the demo ends the
call, so the key arrived), and a capture of that call's media holds none of the greeting's
audio, while the same check finds it in a plain call; a plain-RTP SIPp caller is refused 488
with a Warning; the TLS listener refuses TLS 1.1 and takes TLS 1.2.

The certificates are made here with the openssl CLI (a throw-away CA, and a server certificate
for 127.0.0.1). Every wait polls a condition; every failure prints baresip's and the server's
last lines.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.harness import (
    LOOPBACK,
    Server,
    ServerFactory,
    Sipp,
    free_port,
    rtp_range,
    wait_for,
)
from tests.integration.rtp_capture import ALAW, Capture
from tests.secret_audit import AUDIT

ROOT = Path(__file__).resolve().parents[2]
GREETING = ROOT / "agents" / "prompts" / "greeting.wav"

pytestmark = pytest.mark.skipif(
    shutil.which("baresip") is None or shutil.which("openssl") is None,
    reason="needs baresip (apt-get install baresip-core, scripts/bootstrap) and openssl",
)


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    new_key = ("req", "-newkey", "rsa:2048", "-nodes")
    _openssl(*new_key, "-x509", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj",
             "/CN=voicegate test CA", cwd=d)  # fmt: skip
    _openssl(*new_key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1",
             cwd=d)  # fmt: skip
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext",
             cwd=d)  # fmt: skip
    # baresip's own TLS listener needs a certificate too: PJSIP sends its in-dialog requests
    # (the BYE) to the Contact, a new connection to baresip's port (measured: without one, the
    # handshake fails and the BYE never arrives).
    (d / "phone.pem").write_text((d / "server.pem").read_text() + (d / "server.key").read_text())
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key")


def _tls_env(certs: Certs, tls_port: int, srtp: str = "mandatory") -> dict[str, str]:
    return {
        "VOICEGATE_SIP_TLS_PORT": str(tls_port),
        "VOICEGATE_SIP_TLS_CERT_FILE": str(certs.cert),
        "VOICEGATE_SIP_TLS_KEY_FILE": str(certs.key),
        "VOICEGATE_MEDIA_SRTP": srtp,
        # PJSIP's SIP messages in the log (SDP with its a=crypto keys): the masking is what the
        # secret audit then checks, on the real thing.
        "VOICEGATE_LOG_PJSIP_LEVEL": "5",
    }


class Baresip:
    """baresip 1.0.0, headless: an aufile source (a quiet 8 kHz WAV), aubridge as the player,
    sndfile dumping what it decodes, PCMA only; its console module (``cons``) on a UDP port
    takes commands such as ``/sndcode 9``."""

    def __init__(
        self, work: Path, ca: Path, mediaenc: str | None, *, own_certificate: bool = True
    ) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.cons_port = free_port()
        rtp_min, rtp_max = rtp_range(20)
        _quiet_wav(work / "caller.wav")
        (work / "config").write_text(
            "\n".join(
                [
                    "poll_method epoll",
                    f"sip_listen {LOOPBACK}:{free_port()}",
                    f"sip_cafile {ca}",
                    # Without one, baresip's TLS listener fails every handshake: a request to it
                    # arrives only over a connection it opened itself.
                    *([f"sip_certificate {ca.parent / 'phone.pem'}"] if own_certificate else []),
                    "audio_player aubridge,nil",
                    f"audio_source aufile,{work / 'caller.wav'}",
                    "audio_alert aubridge,nil",
                    "ausrc_srate 8000",
                    "auplay_srate 8000",
                    f"rtp_ports {rtp_min}-{rtp_max}",
                    "module_path /usr/lib/baresip/modules",
                    "module g711.so",
                    "module aufile.so",
                    "module aubridge.so",
                    "module sndfile.so",
                    "module srtp.so",
                    "module dtls_srtp.so",
                    "module cons.so",
                    "module_tmp account.so",
                    "module_app menu.so",
                    f"cons_listen {LOOPBACK}:{self.cons_port}",
                    f"snd_path {work}",
                    "",
                ]
            )
        )
        params = ";audio_codecs=pcma;regint=0;answermode=manual"
        if mediaenc:
            params += f";mediaenc={mediaenc}"
        (work / "accounts").write_text(f"<sip:caller@{LOOPBACK}>{params}\n")
        self.out = work / "baresip.out"
        self.process: subprocess.Popen[bytes] | None = None

    def dial(self, uri: str) -> Baresip:
        with open(self.out, "wb") as out:
            self.process = subprocess.Popen(
                ["baresip", "-s", "-f", str(self.work), "-e", f"/dial {uri}", "-t", "60"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def command(self, text: str) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(text.encode() + b"\n", (LOOPBACK, self.cons_port))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def _quiet_wav(path: Path) -> None:
    # Line noise far below the VAD's margin: the greeting is not barged in on.
    noise = np.random.default_rng(7).integers(-20, 20, 8000 * 60, dtype=np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(noise.tobytes())


def _why(server: Server, phone: Baresip) -> str:
    tail = "\n".join(server.log().splitlines()[-40:])
    return f"\n--- baresip:\n{phone.output()[-3000:]}\n--- server log tail:\n{tail}"


def _greeting_8k() -> np.ndarray:
    with wave.open(str(GREETING)) as w:
        assert w.getframerate() == 16000 and w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float64)
    return pcm[: len(pcm) // 2 * 2].reshape(-1, 2).mean(axis=1)  # 16 to 8 kHz, roughly


def _payloads(pcap: Path, server_ports: range) -> bytes:
    """The RTP payloads the server sent (PCMA, payload type 8), in sequence order."""
    data = pcap.read_bytes()
    link = int.from_bytes(data[20:24], "little")
    skip = {1: 14, 113: 16, 276: 20, 0: 4}[link]
    offset, packets = 24, []
    while offset + 16 <= len(data):
        incl = int.from_bytes(data[offset + 8 : offset + 12], "little")
        ip = data[offset + 16 + skip : offset + 16 + incl]
        offset += 16 + incl
        if len(ip) < 28 or ip[9] != 17:
            continue
        ihl = (ip[0] & 0x0F) * 4
        src = int.from_bytes(ip[ihl : ihl + 2], "big")
        rtp = ip[ihl + 8 :]
        if src in server_ports and len(rtp) > 12 and rtp[0] >> 6 == 2 and rtp[1] & 0x7F == 8:
            packets.append((int.from_bytes(rtp[2:4], "big"), rtp[12:172]))
    return b"".join(p for _, p in sorted(packets))


def greeting_likeness(payload: bytes) -> float:
    """How much of the greeting is in ``payload`` decoded as A-law: the peak of the normalised
    cross-correlation of its first second with the decoded stream (1.0 is the same audio; SRTP's
    ciphertext decodes to noise, near 0)."""
    stream = ALAW[np.frombuffer(payload, dtype=np.uint8)].astype(np.float64)
    probe = _greeting_8k()[2000:10000]  # a second of speech, past the leading silence
    assert len(stream) > len(probe), "too little audio captured"
    n = 1 << int(np.ceil(np.log2(len(stream) + len(probe))))
    corr = np.fft.irfft(np.fft.rfft(stream, n) * np.conj(np.fft.rfft(probe, n)), n)
    corr = corr[: len(stream) - len(probe) + 1]
    energy = np.sqrt(np.convolve(stream**2, np.ones(len(probe)), "valid"))
    scores = corr / (energy * np.linalg.norm(probe) + 1e-9)
    return float(np.max(np.abs(scores)))


def _call_and_press_9(server: Server, phone: Baresip, uri: str, pcap: Path) -> bytes:
    """Dial, let the greeting play, press 9; the payloads the server sent on the call."""
    capture = Capture(pcap, server.rtp_min, server.rtp_max)
    try:
        phone.dial(uri)
        wait_for(
            lambda: "Call established" in phone.output(), 20, "baresip's call" + _why(server, phone)
        )
        # The greeting plays from the answer on: wait until its session has a response out,
        # then long enough for a second of it to be sent (polled on the session, not slept).
        wait_for(
            lambda: any(
                e["type"] == "response_started" for s in server.sessions() for e in s["events"]
            ),
            10,
            "the greeting's response" + _why(server, phone),
        )
        wait_for(lambda: pcap.stat().st_size > 60_000, 20, "3 s of media" + _why(server, phone))
        phone.command("/sndcode 9")
        # 9 is goodbye: the demo says it and hangs up (agents/demo.py), so the key arrived.
        wait_for(
            lambda: "terminated" in phone.output(), 30, "the demo's hang-up" + _why(server, phone)
        )
    finally:
        capture.stop()
        phone.stop()
    return _payloads(pcap, range(server.rtp_min, server.rtp_max + 1))


def _ended_by_key_9(server: Server) -> dict[str, Any]:
    """The call's session, which the demo ended because the caller pressed 9."""
    (session,) = server.sessions()
    types = [e["type"] for e in session["events"]]
    assert "response_interrupted" in types, types  # the key cut the greeting (barge-in)
    hangups = [e["payload"] for e in session["events"] if e["type"] == "server_hangup"]
    assert hangups == [{"outcome": "completed", "reason": "caller chose to end the call"}], types
    assert session["ended"]["terminal_state"] == "completed", session["ended"]
    return session


@pytest.fixture
def stopped_phones() -> Iterator[list[Baresip]]:
    phones: list[Baresip] = []
    yield phones
    for phone in phones:
        phone.stop()


def test_a_tls_call_with_mandatory_srtp_carries_no_plain_audio(
    server_factory: ServerFactory, certs: Certs, tmp_path: Path, stopped_phones: list[Baresip]
) -> None:
    tls_port = free_port()
    server = server_factory("srtp", **_tls_env(certs, tls_port))
    phone = Baresip(tmp_path / "srtp-phone", certs.ca, "srtp-mand")
    stopped_phones.append(phone)
    sent = _call_and_press_9(
        server, phone, f"sip:100@{LOOPBACK}:{tls_port};transport=tls", tmp_path / "srtp.pcap"
    )
    out = phone.output()
    assert "SRTP is Enabled" in out and "srtp-mand" in out, _why(server, phone)
    # The call's SDES keys, as baresip's SIP trace (-s) shows the offer and the answer: the
    # secret audit proves no output of voicegate holds them (its log quotes whole SDPs at
    # log.pjsip_level 5, masked by telephony.sip_message.mask_text).
    keys = set(re.findall(r"inline:([A-Za-z0-9+/=]{20,})", out))
    assert len(keys) >= 2, "no SDES keys in baresip's trace" + _why(server, phone)
    for key in keys:
        AUDIT.register(key, "SRTP master key", "tests/integration/test_tls_srtp.py")
    assert not any(key in server.log() for key in keys), "an SRTP key is in the server's log"
    assert "PCMA" in out, _why(server, phone)
    _ended_by_key_9(server)
    # PJSIP's own account of where the INVITE came from (its log at level 5), and our Contact.
    assert "Request msg INVITE/cseq" in server.log() and "from TLS 127.0.0.1" in server.log()
    assert ";transport=TLS>" in server.log(), "the server's Contact does not say TLS"
    secure = greeting_likeness(sent)
    # The same check on a plain call finds the greeting: the check can fail.
    plain_server = server_factory("plain")
    plain_phone = Baresip(tmp_path / "plain-phone", certs.ca, None)
    stopped_phones.append(plain_phone)
    plain = greeting_likeness(
        _call_and_press_9(
            plain_server, plain_phone, f"sip:100@{plain_server.sip_target}", tmp_path / "plain.pcap"
        )
    )
    _ended_by_key_9(plain_server)
    print(f"greeting likeness: SRTP call {secure:.3f}, plain call {plain:.3f}")
    assert plain > 0.5, f"the greeting was not found in the plain call ({plain:.2f})"
    assert secure < 0.2, f"the greeting is in the SRTP call's packets ({secure:.2f})"
    # baresip heard it: what it decoded holds the greeting (sndfile's dump of the decoder).
    (heard,) = (tmp_path / "srtp-phone").glob("dump-*-dec.wav")
    with wave.open(str(heard)) as w:
        decoded = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    assert np.sqrt(np.mean(decoded.astype(np.float64) ** 2)) > 300, "baresip heard silence"


def test_a_plain_rtp_offer_to_a_mandatory_server_is_refused_488(
    server_factory: ServerFactory, certs: Certs, tmp_path: Path
) -> None:
    server = server_factory("srtp", **_tls_env(certs, free_port()))
    sipp = Sipp("uac-srtp-refused.xml", server.sip_target, tmp_path / "sipp")
    assert sipp.run() == 0, sipp.errors() + server.log()[-3000:]
    assert server.metric("voicegate_calls_refused_total", reason="srtp_required", status="488")


@pytest.mark.parametrize(("version", "accepted"), [("-tls1_1", False), ("-tls1_2", True)])
def test_the_tls_listener_takes_tls_1_2_and_not_older(
    server_factory: ServerFactory, certs: Certs, version: str, accepted: bool
) -> None:
    tls_port = free_port()
    server = server_factory("tls", **_tls_env(certs, tls_port, srtp="off"))
    done = subprocess.run(
        [
            "openssl",
            "s_client",
            version,
            "-connect",
            f"{LOOPBACK}:{tls_port}",
            "-CAfile",
            str(certs.ca),
            "-verify_return_error",
        ],
        input=b"",
        capture_output=True,
        timeout=20,
    )
    out = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    shook_hands = "Cipher is (NONE)" not in out and "Verify return code: 0 (ok)" in out
    assert shook_hands is accepted, out + server.log()[-2000:]


@pytest.mark.parametrize("srtp", ["optional", "mandatory"])
def test_a_dtls_offer_is_refused_and_the_server_lives_on(
    server_factory: ServerFactory, certs: Certs, tmp_path: Path, srtp: str
) -> None:
    """The wheel's PJSIP crashes on a DTLS-SRTP offer while SRTP is on (telephony.srtp_offer,
    offers_dtls); voicegate hands it to an account without SRTP first: a 488, nothing else."""
    server = server_factory("srtp", **_tls_env(certs, free_port(), srtp=srtp))
    sipp = Sipp("uac-dtls-refused.xml", server.sip_target, tmp_path / "dtls")
    assert sipp.run() == 0, sipp.errors() + server.log()[-3000:]
    # Still serving: the next caller is answered (a plain offer where SRTP is optional).
    assert server.process is not None and server.process.poll() is None, server.log()[-3000:]
    if srtp == "optional":
        after = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "after")
        assert after.run() == 0, after.errors() + server.log()[-3000:]
    status, _ = server.http("/readyz")
    assert status == 200
