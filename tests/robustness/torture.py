"""Replay raw SIP messages (RFC 4475, RFC 5118, PJSIP's fuzz seeds) over UDP or TCP, byte for byte,
and tear down whatever they set up.

A torture message goes out as bytes, never through a line-based text API: its folding, NULs, wrong
Content-Length and trailing octets are the point. Two things in its top Via are changed, and only
there:

- the branch gets a per-replay suffix (when it is an RFC 3261 branch longer than the magic cookie),
  because the corpora reuse one branch (``z9hG4bKkdjuw``) across unrelated messages, each meant to
  be sent on its own; PJSIP matches server transactions by branch and method (RFC 3261 section
  17.2.3), so without it a later message would be absorbed as a retransmission of an earlier one;
- over UDP, the transport and sent-by name the replayer's socket, because RFC 3261 section 18.2.2
  sends a UDP request's response to the sent-by port (and over the Via's transport). Over TCP the
  response comes back on the connection and the sent-by stays as written.

Every final response is seen. An INVITE answered 2xx is ACKed and hung up with a BYE in its dialog
(Call-ID, From tag and the server's To tag from the 200), a non-2xx final is ACKed on its
transaction (the response's own top Via), so that every answered message reaches the call path and
none holds a call slot afterwards.
"""

from __future__ import annotations

import itertools
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Literal

Transport = Literal["udp", "tcp"]
# Nothing at all from the server in this long: it dropped the message (as it may, for garbage).
QUIET_S = 1.0
# A provisional answer was heard: the final one has this long to come.
FINAL_S = 5.0
# Messages go out at most this often: 40 a second, under the 60 set-ups a second the tests give
# a worker (sip.max_setup_rate).
MIN_GAP_S = 0.025

_serial = itertools.count(1)
# The first Via header (long or compact name, any case, LWS before the colon), then its first
# value: "SIP / 2.0 / <transport> <sent-by>", where each separator may be folded LWS.
_TOP_VIA = re.compile(
    rb"(?im)^(?:via|v)[ \t]*:(?:[ \t]|\r?\n[ \t])*"
    rb"SIP(?:\s*)/(?:\s*)2\.0(?:\s*)/(?:\s*)(?P<transport>[A-Za-z0-9\-.!%*_+`'~]+)\s+"
    rb"(?P<sent_by>\[[0-9A-Fa-f:.]*\](?:\s*:\s*\d+)?|[^\s;,:]+(?:\s*:\s*\d+)?)"
    rb"(?P<params>[^,\r\n]*(?:\r?\n[ \t][^,\r\n]*)*)"
)
_BRANCH = re.compile(rb"(?i)(branch\s*=\s*)(z9hG4bK[^\s;,]*)")


@dataclass(frozen=True, slots=True)
class Message:
    """One SIP message as received: start line, headers (unfolded, names lowered, compact forms
    expanded for the ones used here) and body."""

    start: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    @property
    def is_response(self) -> bool:
        return self.start.startswith(b"SIP/2.0 ")

    @property
    def status(self) -> int:
        return int(self.start[8:11])

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    def all(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k == name]

    @property
    def cseq(self) -> tuple[int, bytes]:
        number, _, method = (self.header(b"cseq") or b"0 ?").strip().partition(b" ")
        return int(number), method.strip()


_COMPACT = {b"v": b"via", b"f": b"from", b"t": b"to", b"i": b"call-id", b"m": b"contact"}
_COMPACT |= {b"l": b"content-length", b"c": b"content-type"}


def parse(raw: bytes) -> Message:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines: list[bytes] = []
    for line in head.split(b"\r\n"):
        if line[:1] in (b" ", b"\t") and lines:
            lines[-1] += b" " + line.strip()
        else:
            lines.append(line)
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        headers.append((_COMPACT.get(key, key), value.strip()))
    return Message(lines[0], tuple(headers), body)


def prepare(message: bytes, transport: Transport, local: tuple[str, int]) -> bytes:
    """``message`` with its top Via changed as the module docstring says, nothing else."""
    via = _TOP_VIA.search(message)
    if via is None:
        return message
    params = _BRANCH.sub(
        lambda m: (
            m.group(1)
            + m.group(2)
            + (f"-r{next(_serial)}".encode() if len(m.group(2)) > 7 else b"")
        ),
        via.group("params"),
        count=1,
    )
    if transport == "udp":
        start, end = via.start("transport"), via.end("sent_by")
        spacer = message[via.end("transport") : via.start("sent_by")]
        middle = b"UDP" + spacer + f"{local[0]}:{local[1]}".encode()
    else:
        start, end = via.end("sent_by"), via.end("sent_by")
        middle = b""
    return (
        message[:start]
        + middle
        + message[end : via.start("params")]
        + params
        + message[via.end("params") :]
    )


class Channel:
    """One UDP socket, or one TCP connection, to the server; yields whole messages."""

    def __init__(self, transport: Transport, target: tuple[str, int]) -> None:
        self.transport = transport
        self.target = target
        kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
        self.sock = socket.socket(socket.AF_INET, kind)
        self.sock.bind((target[0], 0))
        if transport == "tcp":
            self.sock.settimeout(5)
            self.sock.connect(target)
        self.local: tuple[str, int] = self.sock.getsockname()
        self._buffer = b""
        self.closed_by_peer = False

    def send(self, data: bytes) -> None:
        if self.transport == "udp":
            self.sock.sendto(data, self.target)
        elif not self.closed_by_peer:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed_by_peer = True

    def receive(self, timeout: float) -> Message | None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self.transport == "tcp":
                framed = self._frame()
                if framed is not None:
                    return framed
                if self.closed_by_peer:
                    return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                return None
            except OSError:
                self.closed_by_peer = True
                return None
            if self.transport == "udp":
                return parse(data)
            if not data:
                self.closed_by_peer = True
            self._buffer += data
        return None

    def _frame(self) -> Message | None:
        # RFC 3261 section 18.3: over a stream, Content-Length delimits the body.
        self._buffer = self._buffer.lstrip(b"\r\n")  # keep-alive CRLFs (RFC 5626)
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = parse(self._buffer[: end + 4])
        length = int(head.header(b"content-length") or b"0")
        total = end + 4 + length
        if len(self._buffer) < total:
            return None
        raw, self._buffer = self._buffer[:total], self._buffer[total:]
        return parse(raw)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Outcome:
    """What came back for one replayed message."""

    finals: list[tuple[int, bytes]] = field(default_factory=list)  # (status, CSeq method)
    answered: int = 0  # INVITEs answered 2xx, then ACKed and hung up
    hung_up: int = 0  # of those, BYEs answered 200
    closed: bool = False  # TCP: the server closed the connection

    @property
    def status(self) -> int | None:
        """The first final status, None when the server said nothing (dropped the message)."""
        return self.finals[0][0] if self.finals else None


class Replayer:
    """Replays messages to ``host:port`` over one transport, one fresh TCP connection each."""

    def __init__(
        self,
        host: str,
        port: int,
        transport: Transport,
        *,
        quiet_s: float = QUIET_S,
        route_via: tuple[str, int] | None = None,
        sentinel: bool = True,
    ) -> None:
        self.target = (host, port)
        self.transport: Transport = transport
        self.quiet_s = quiet_s
        # Through a proxy, the in-dialog ACK and BYE carry the Record-Route entries naming it.
        self.route_via = route_via
        # Off through a proxy: it answers an OPTIONS for itself at once, whatever the workers
        # still do with the message before it.
        self.sentinel = sentinel
        self._udp = Channel("udp", self.target) if transport == "udp" else None
        self._last_sent = 0.0

    def close(self) -> None:
        if self._udp is not None:
            self._udp.close()

    def replay(self, message: bytes) -> Outcome:
        # Below the server's set-up rate, so that no message is refused 503 for it: sent again,
        # it would be a merged request (same Call-ID, From tag and CSeq under a new branch),
        # which PJSIP answers 482 (RFC 3261 section 8.2.2.2).
        time.sleep(max(0.0, self._last_sent + MIN_GAP_S - time.monotonic()))
        self._last_sent = time.monotonic()
        channel = self._udp or Channel("tcp", self.target)
        try:
            sentinel = f"torture-sentinel-{next(_serial)}".encode()
            data = prepare(message, self.transport, channel.local)
            if self.sentinel and (self.transport == "udp" or _framed_alone(data)):
                # The server reads one socket (or one connection) in order on one SIP thread:
                # once this OPTIONS is answered, every answer to the message has been sent, or
                # it was dropped. A stream whose framing the message leaves open (a wrong
                # Content-Length) would swallow it, so there the silence decides.
                channel.send(data)
                channel.send(_options(self.target, channel, sentinel))
            else:
                sentinel = b""
                channel.send(data)
            return self._collect(channel, message, sentinel)
        finally:
            if channel is not self._udp:
                channel.close()

    def _collect(self, channel: Channel, sent: bytes, sentinel: bytes) -> Outcome:
        outcome = Outcome()
        ringing: set[bytes] = set()  # Call-IDs with a provisional and no final yet
        settled = False  # the sentinel was answered
        heard_at = time.monotonic()
        while True:
            if settled and not ringing:
                break
            limit = FINAL_S if ringing or sentinel else self.quiet_s
            wait = limit - (time.monotonic() - heard_at)
            if wait <= 0:
                break
            message = channel.receive(wait)
            if message is None:
                if channel.closed_by_peer:
                    outcome.closed = True
                    break
                continue
            if not message.is_response:
                continue  # a request of the server's own (none expected): not an answer
            call_id = message.header(b"call-id") or b""
            if sentinel and call_id == sentinel:
                settled = settled or message.status >= 200
                continue
            if call_id and call_id not in sent:
                continue  # a late answer to an earlier message
            heard_at = time.monotonic()
            number, method = message.cseq
            if message.status < 200:
                ringing.add(call_id)
                continue
            ringing.discard(call_id)
            if method == b"BYE":
                continue  # the answer to our own hang-up
            request_method, request_uri = _request_line(sent, call_id)
            outcome.finals.append((message.status, request_method))
            if request_method == b"INVITE" and method == b"INVITE":
                self._ack(channel, message, request_uri)
                if message.status < 300:
                    outcome.answered += 1
                    outcome.hung_up += self._bye(channel, message, request_uri, number)
        return outcome

    def _dialog(self, response: Message, method: bytes, number: int, via: bytes) -> list[bytes]:
        return [
            b"Via: " + via,
            b"From: " + (response.header(b"from") or b""),
            b"To: " + (response.header(b"to") or b""),
            b"Call-ID: " + (response.header(b"call-id") or b""),
            b"CSeq: " + str(number).encode() + b" " + method,
            b"Max-Forwards: 70",
        ]

    def _own_via(self, channel: Channel) -> bytes:
        host, port = channel.local
        proto = channel.transport.upper().encode()
        return b"SIP/2.0/%s %s:%d;rport;branch=z9hG4bKtorture%d" % (
            proto,
            host.encode(),
            port,
            next(_serial),
        )

    def _ack(self, channel: Channel, response: Message, request_uri: bytes) -> None:
        number, _ = response.cseq
        if response.status < 300:
            # RFC 3261 section 13.2.2.4: the ACK of a 2xx is a new transaction in the dialog.
            target = _contact_uri(response) or request_uri
            lines = self._dialog(response, b"ACK", number, self._own_via(channel))
            lines += self._routes(response)
        else:
            # Section 17.1.1.3: the ACK of a non-2xx final is part of the INVITE's transaction.
            target = request_uri
            lines = self._dialog(response, b"ACK", number, response.all(b"via")[0])
        channel.send(_request(b"ACK", target, lines))

    def _bye(self, channel: Channel, response: Message, request_uri: bytes, number: int) -> int:
        target = _contact_uri(response) or request_uri
        lines = self._dialog(response, b"BYE", number + 1, self._own_via(channel))
        lines += self._routes(response)
        channel.send(_request(b"BYE", target, lines))
        deadline = time.monotonic() + FINAL_S
        while (left := deadline - time.monotonic()) > 0:
            message = channel.receive(left)
            if message is None:
                if channel.closed_by_peer:
                    return 0
                continue
            if message.is_response and message.cseq[1] == b"BYE" and message.status >= 200:
                return 1 if message.status == 200 else 0
        return 0

    def _routes(self, response: Message) -> list[bytes]:
        """Route headers for an in-dialog request: the response's Record-Route entries that name
        the proxy we send through (the others are fictional hops of the corpus), in UAC order
        (RFC 3261 section 12.1.2)."""
        if self.route_via is None:
            return []
        host, port = self.route_via
        mine = f"{host}:{port}".encode()
        entries = [
            e.strip()
            for value in response.all(b"record-route")
            for e in value.split(b",")
            if mine in e
        ]
        return [b"Route: " + e for e in reversed(entries)]


def _request(method: bytes, uri: bytes, lines: list[bytes]) -> bytes:
    return b"\r\n".join([method + b" " + uri + b" SIP/2.0", *lines, b"Content-Length: 0", b"", b""])


def _contact_uri(response: Message) -> bytes | None:
    contact = response.header(b"contact")
    if not contact:
        return None
    match = re.search(rb"<([^>]*)>", contact)
    return match.group(1) if match else contact.split(b";")[0].strip()


def _request_line(sent: bytes, call_id: bytes) -> tuple[bytes, bytes]:
    """Method and Request-URI of the sent request with this Call-ID (a datagram may hold two)."""
    for start in re.finditer(rb"(?m)^([!-~]+) +(\S+) +SIP/2\.0 *\r?$", sent):
        rest = sent[start.end() :]
        if not call_id or call_id in rest.split(b"\r\n\r\n", 1)[0]:
            return start.group(1), start.group(2)
    return b"", b"sip:127.0.0.1"


def _framed_alone(message: bytes) -> bool:
    """Whether a stream parser ends this message exactly where its bytes end."""
    head, sep, body = message.partition(b"\r\n\r\n")
    if not sep:
        return False
    values = parse(head + sep).all(b"content-length")
    if not values:
        return not body
    return values[0].isdigit() and int(values[0]) == len(body)


def _options(target: tuple[str, int], channel: Channel, call_id: bytes) -> bytes:
    host, port = channel.local
    return (
        f"OPTIONS sip:{target[0]}:{target[1]} SIP/2.0\r\n"
        f"Via: SIP/2.0/{channel.transport.upper()} {host}:{port};rport;"
        f"branch=z9hG4bKsentinel{next(_serial)}\r\n"
        f"From: <sip:robustness@{host}>;tag=sentinel\r\nTo: <sip:{target[0]}:{target[1]}>\r\n"
        f"Call-ID: {call_id.decode()}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


# An INVITE over the worker's set-up rate (malformed ones included: each costs PJSIP the same
# sockets) is answered 503 after the slot hold (telephony/admission.py) and never reaches the
# call path: sent again until admitted, this long.
ADMIT_S = 10.0


def replay_admitted(replayer: Replayer, message: bytes) -> Outcome:
    """``message`` replayed until the server takes it in: not refused 503 for its set-up rate
    (each replay gets a fresh top-Via branch)."""
    deadline = time.monotonic() + ADMIT_S
    while True:
        outcome = replayer.replay(message)
        if outcome.status != 503 or time.monotonic() > deadline:
            return outcome


def options(
    host: str, port: int, transport: Transport = "udp", *, sentinel: bool = True
) -> int | None:
    """The status a plain OPTIONS to the server gets: 200 means it still answers."""
    call_id = f"alive-{time.monotonic_ns()}"
    request = (
        f"OPTIONS sip:{host}:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 0.0.0.0;branch=z9hG4bKalive{next(_serial)}\r\n"
        f"From: <sip:robustness@{host}>;tag=alive\r\nTo: <sip:{host}:{port}>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    replayer = Replayer(host, port, transport, quiet_s=3.0, sentinel=sentinel)
    try:
        return replayer.replay(request).status
    finally:
        replayer.close()
