"""The PROTOS c07-sip test cases (../shared/sip-corpus/protos-c07-sip.tar.xz), replayed over UDP.

Each case is two length-prefixed PDUs, ``<len> <INVITE><len> <teardown>``, with placeholders
(``<To>``, ``<From>``, ``<Call-ID>``, ...) filled in here. A replayed case is sent to the server;
an answered one (2xx) is ACKed and hung up with a BYE in its dialog (same Call-ID, From tag and
the server's To tag), one still ringing is CANCELled with the case's own teardown (same branch),
so that every case reaches the call path and none holds a call slot afterwards.
"""

from __future__ import annotations

import csv
import functools
import io
import re
import socket
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "sip-corpus" / "protos-c07-sip.tar.xz"
_PDU = re.compile(rb"(\d+) ")
QUIET_S = 0.3  # no answer at all in this long: the server dropped the message
ADMIT_S = 10.0  # a case refused 503 for the set-up rate is sent again for this long


@dataclass(frozen=True, slots=True)
class Case:
    number: int
    group: str
    invite: bytes
    teardown: bytes


@dataclass(frozen=True, slots=True)
class Outcome:
    number: int
    group: str
    final: int | None  # the final status of the INVITE, None if none came
    answered: bool


def _split(data: bytes) -> tuple[bytes, bytes]:
    pdus = []
    rest = data
    while rest:
        match = _PDU.match(rest)
        if match is None:
            raise ValueError("not a PROTOS case: expected '<length> <pdu>'")
        length = int(match.group(1))
        start = match.end()
        pdus.append(rest[start : start + length])
        rest = rest[start + length :]
    if len(pdus) != 2:
        raise ValueError(f"a PROTOS case has two PDUs, this one {len(pdus)}")
    return pdus[0], pdus[1]


def load(groups: set[str] | None = None, corpus: Path = CORPUS) -> Iterator[Case]:
    """The cases of ``groups`` (all when None), in case order."""
    files = _members(corpus)
    spans = []
    for row in csv.DictReader(io.StringIO(files["GROUPS.tsv"].decode()), delimiter="\t"):
        first, count = int(row["first_case"]), int(row["count"])
        spans.append((row["group"], first, first + count))
    for group, first, end in spans:
        if groups is not None and group not in groups:
            continue
        for number in range(first, end):
            invite, teardown = _split(files[f"{number:07d}"])
            yield Case(number, group, invite, teardown)


@functools.cache
def _members(corpus: Path) -> dict[str, bytes]:
    """Every file of the archive by its base name, read in one pass: an xz stream cannot seek, so
    reading members out of order would decompress it from the start each time."""
    files = {}
    with tarfile.open(corpus, "r|xz") as archive:
        for member in archive:
            data = archive.extractfile(member) if member.isfile() else None
            if data is not None:
                files[member.name.rsplit("/", 1)[-1]] = data.read()
    return files


def filled(case: Case, host: str = "127.0.0.1") -> str:
    """The case's INVITE with its placeholders filled for ``host``, as text (what the server's
    offer check reads)."""
    values = {k.encode(): host.encode() for k in ("<From-IP>", "<From-Address>")}
    values[b"<Local-Port>"] = b"5999"
    return _fill(case.invite, values).decode("utf-8", "surrogateescape")


def _fill(pdu: bytes, values: dict[bytes, bytes]) -> bytes:
    for key, value in values.items():
        pdu = pdu.replace(key, value)
    head, sep, body = pdu.partition(b"\r\n\r\n")
    return head.replace(b"<Content-Length>", str(len(body)).encode()) + sep + body


class Replayer:
    """Replays cases from one UDP socket on loopback to ``host:port``."""

    def __init__(self, host: str, port: int, *, wait_s: float = 2.0, ack: bool = True) -> None:
        self.target = (host, port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.local_port = self.sock.getsockname()[1]
        self.wait_s = wait_s
        # False: answered cases are left half-open (never ACKed), as a careless or hostile
        # caller leaves them; the server must free their slots itself (telephony/half_open.py).
        self.ack = ack

    def close(self) -> None:
        self.sock.close()

    def replay(self, case: Case) -> Outcome:
        """Replay ``case`` until the server takes it in: one refused 503 for the worker's set-up
        rate never reached the call path, so it is sent again (a fresh Call-ID and branch), for
        up to :data:`ADMIT_S`."""
        deadline = time.monotonic() + ADMIT_S
        while True:
            outcome = self._replay_once(case)
            if outcome.final != 503 or time.monotonic() > deadline:
                return outcome

    def _replay_once(self, case: Case) -> Outcome:
        host = self.target[0].encode()
        call_id = f"protos-{case.number}-{time.monotonic_ns()}".encode()
        values = {
            b"<To>": b"service@" + host + b":" + str(self.target[1]).encode(),
            b"<From>": b"protos@" + host + b":" + str(self.local_port).encode(),
            b"<From-Address>": host,
            b"<From-IP>": host,
            b"<Local-Port>": str(self.local_port).encode(),
            b"<Branch-ID>": str(time.monotonic_ns()).encode(),
            b"<Call-ID>": call_id,
            b"<CSeq>": b"1",
        }
        invite = _fill(case.invite, values)
        # The sip-call-id groups mutate the Call-ID itself: match the answers by what was sent.
        call_id = _header(invite, b"Call-ID") or call_id
        if len(invite) > 65507:
            return Outcome(case.number, case.group, None, False)  # only fits over TCP
        self.sock.sendto(invite, self.target)
        final, response = self._final_response(call_id)
        if final is not None and 200 <= final < 300 and response is not None:
            if self.ack:
                self._ack_and_bye(invite, response)
            return Outcome(case.number, case.group, final, True)
        if final is None:
            # Still ringing (or silent): the case's own CANCEL, same branch as the INVITE.
            self.sock.sendto(
                _fill(case.teardown, {**values, b"<Teardown-Method>": b"CANCEL"}), self.target
            )
            self._final_response(call_id, wait_s=0.5)
        return Outcome(case.number, case.group, final, False)

    def _final_response(
        self, call_id: bytes, wait_s: float | None = None
    ) -> tuple[int | None, bytes | None]:
        """The INVITE's final status and the response itself. A server that says nothing at all
        within :data:`QUIET_S` dropped the message (as it may, for garbage); one that answered
        with a provisional is given the whole ``wait_s``."""
        start = time.monotonic()
        deadline = start + (self.wait_s if wait_s is None else wait_s)
        heard = False
        while (left := deadline - time.monotonic()) > 0:
            if not heard:
                left = min(left, start + QUIET_S - time.monotonic())
                if left <= 0:
                    break
            self.sock.settimeout(left)
            try:
                data, _ = self.sock.recvfrom(65535)
            except TimeoutError:
                if heard:
                    break
                continue
            if call_id not in data or not data.startswith(b"SIP/2.0 "):
                continue
            heard = True
            status = int(data[8:11])
            if status >= 200 and b" INVITE" in _header(data, b"CSeq"):
                return status, data
        return None, None

    def _ack_and_bye(self, invite: bytes, response: bytes) -> None:
        head = invite.partition(b"\r\n\r\n")[0].split(b"\r\n")
        to_header = _header(response, b"To")
        request_uri = head[0].split(b" ")[1]
        # Through a proxy that recorded its route (the pool's Kamailio), the dialog's requests go
        # to the remote target (the 200's Contact) along the route set: the Record-Route values
        # in reverse order (RFC 3261 section 12.1.2).
        routes = [
            b"Route: " + value.strip()
            for value in reversed(b",".join(_headers(response, b"Record-Route")).split(b","))
            if value.strip()
        ]
        contact = _uri(_header(response, b"Contact"))
        if routes and contact:
            request_uri = contact
        kept = [h for h in head[1:] if h.split(b":", 1)[0].lower() in (b"via", b"from", b"call-id")]
        for method, cseq in ((b"ACK", b"1 ACK"), (b"BYE", b"2 BYE")):
            via = [
                h
                if not h.lower().startswith(b"via") or method == b"ACK"
                else h.replace(b"branch=z9hG4bK", b"branch=z9hG4bKbye")
                for h in kept
            ]
            message = b"\r\n".join(
                [
                    method + b" " + request_uri + b" SIP/2.0",
                    *via,
                    b"To: " + to_header,
                    *routes,
                    b"CSeq: " + cseq,
                    b"Max-Forwards: 70",
                    b"Content-Length: 0",
                    b"",
                    b"",
                ]
            )
            self.sock.sendto(message, self.target)
        self._drain(0.3)

    def _drain(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                self.sock.recvfrom(65535)
            except TimeoutError:
                return


def _header(message: bytes, name: bytes) -> bytes:
    values = _headers(message, name)
    return values[0] if values else b""


def _headers(message: bytes, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (long form) in the head of ``message``."""
    found = []
    for line in message.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower():
            found.append(value.strip())
    return found


def _uri(name_addr: bytes) -> bytes:
    """The URI of a name-addr (``<sip:...>;params``) or of a bare addr-spec."""
    if b"<" in name_addr:
        return name_addr.partition(b"<")[2].partition(b">")[0]
    return name_addr.partition(b";")[0].strip()
