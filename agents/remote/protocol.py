"""The remote-agent protocol without I/O: message checks, seq/ack, replay, binary frames.

Everything here is pure: :class:`Codec` turns what came off the socket into checked messages or a
:class:`ProtocolError` that names the code to send back (docs/agent-protocol.md, "Errors"), and
changes nothing when it refuses; :class:`Outbox` and :class:`Inbox` keep the two halves of the
seq/ack contract (docs/agent-protocol.md, "seq and ack"); :class:`ErrorBudget` decides when a
misbehaving peer is closed. The WebSocket itself lives in link.py.

Sequenced messages advance the sender's ``seq`` by one and are kept until acked, for replay after
a resume; link-level messages (:data:`LINK_TYPES`) carry the sender's current seq without
advancing it and are never replayed (they belong to one socket). Binary frames are not sequenced:
caller audio is never replayed (a gap is reported as ``audio.gap``), and agent audio of a cut
response is dead anyway.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from agents.remote.schemas import SchemaError, validate

VERSION: Final = 1
SUBPROTOCOL: Final = "voicegate.agent.v1"
LINK_TYPES: Final = frozenset({"session.resume", "session.resumed", "ping", "pong", "ack"})
# Every message type voicegate sends and accepts; each has its schema in docs/schemas/<direction>/
# (tests/unit/test_agent_protocol.py keeps the three in step).
SENDS: Final = frozenset(
    {
        "session.start",
        "session.resume",
        "speech.started",
        "speech.stopped",
        "dtmf",
        "mark.outcome",
        "playback.interrupted",
        "playback.cleared",
        "playback.false_interruption",
        "gate",
        "transfer.progress",
        "consult.event",
        "output.stop",
        "tool.result",
        "media.lost",
        "media.restored",
        "audio.gap",
        "session.end",
        "error",
        "ping",
        "pong",
        "ack",
    }
)
ACCEPTS: Final = frozenset(
    {
        "session.accept",
        "session.resumed",
        "response.start",
        "response.done",
        "response.cancel",
        "mark",
        "tool.call",
        "hangup",
        "transfer",
        "consult.say",
        "consult.complete",
        "consult.cancel",
        "session.end",
        "error",
        "ping",
        "pong",
        "ack",
    }
)
# The codes of ``error`` (docs/agent-protocol.md, "Errors"): a closed vocabulary, the label of
# voicegate_agent_protocol_errors_total.
ERROR_CODES: Final = (
    "bad_json",
    "schema",
    "unknown_type",
    "too_large",
    "flood",
    "seq_gap",
    "unknown_response",
    "response_refused",
    "playout_full",
    "bad_frame",
    "handshake",
    "resume_refused",
    "replay_overflow",
    "internal",
)
MAX_TEXT_BYTES: Final = 64 * 1024
MAX_BINARY_BYTES: Final = 64 * 1024
DEFAULT_REPLAY_BOUND: Final = 512

# Binary frames (docs/agent-protocol.md, "Binary frames"), network byte order.
CALLER_AUDIO: Final = 0x01  # voicegate -> agent: kind, version, reserved u16, timestamp u64
AGENT_AUDIO: Final = 0x02  # agent -> voicegate: kind, version, id length u16, id, PCM16LE
_CALLER_HEADER: Final = struct.Struct("!BBHQ")
_AGENT_HEADER: Final = struct.Struct("!BBH")


class ProtocolError(Exception):
    """The peer sent something this side refuses. ``code`` is the error code sent back,
    ``ref_seq`` the refused message's seq (None when unreadable or binary), ``fatal`` whether
    the socket is closed after the error is sent. ``detail`` never quotes a token or audio.
    ``answer`` False: counted and charged to the error budget, but no error is sent (the rest
    of a flood: answering each would invite an ack per error, more flood)."""

    def __init__(
        self,
        code: str,
        detail: str,
        ref_seq: int | None = None,
        fatal: bool = False,
        answer: bool = True,
    ):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.ref_seq = ref_seq
        self.fatal = fatal
        self.answer = answer

    def message(self) -> dict[str, Any]:
        """The ``error`` message body (without seq and ack)."""
        return {
            "type": "error",
            "code": self.code,
            "ref_seq": self.ref_seq,
            "fatal": self.fatal,
            "detail": self.detail[:300],
        }


@dataclass(frozen=True, slots=True)
class AgentChunk:
    """Audio of one of the agent's responses: PCM16 at the negotiated rate."""

    response_id: str
    samples: NDArray[np.int16]


class Codec:
    """Checks what one side receives. ``incoming`` is the direction this side reads:
    ``from_agent`` for voicegate, ``to_agent`` for an agent."""

    def __init__(self, incoming: str) -> None:
        self.incoming = incoming

    def decode_text(self, text: str) -> dict[str, Any]:
        """A message that is JSON, fits, and matches its schema; else :class:`ProtocolError`."""
        if len(text) > MAX_TEXT_BYTES or len(text.encode()) > MAX_TEXT_BYTES:
            raise ProtocolError("too_large", f"a text frame is at most {MAX_TEXT_BYTES} bytes")
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):
            raise ProtocolError("bad_json", "a text frame must be one JSON object") from None
        if not isinstance(message, dict):
            raise ProtocolError("bad_json", "a text frame must be one JSON object")
        seq = message.get("seq")
        ref = seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None
        try:
            validate(self.incoming, message)
        except SchemaError as exc:
            raise ProtocolError(exc.code, exc.detail, ref) from None
        return message

    def decode_agent_audio(self, data: bytes) -> AgentChunk:
        """An agent audio frame (voicegate's side)."""
        if len(data) > MAX_BINARY_BYTES:
            raise ProtocolError("too_large", f"a binary frame is at most {MAX_BINARY_BYTES} bytes")
        if len(data) < _AGENT_HEADER.size:
            raise ProtocolError("bad_frame", "a binary frame shorter than its header")
        kind, version, id_len = _AGENT_HEADER.unpack_from(data)
        if kind != AGENT_AUDIO or version != VERSION:
            raise ProtocolError("bad_frame", f"binary frame kind {kind} version {version}")
        start = _AGENT_HEADER.size
        pcm = data[start + id_len :]
        try:
            response_id = data[start : start + id_len].decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError("bad_frame", "the response id is not ASCII") from None
        if not 1 <= id_len <= 64 or len(response_id) != id_len or len(pcm) % 2:
            raise ProtocolError("bad_frame", "bad response id length or odd PCM length")
        return AgentChunk(response_id, np.frombuffer(pcm, dtype="<i2").astype(np.int16))


def encode_caller_audio(timestamp: int, samples: NDArray[np.int16]) -> bytes:
    """A caller audio frame: header, then PCM16 little-endian."""
    header = _CALLER_HEADER.pack(CALLER_AUDIO, VERSION, 0, timestamp)
    return header + np.asarray(samples, dtype="<i2").tobytes()


def decode_caller_audio(data: bytes) -> tuple[int, NDArray[np.int16]]:
    """(timestamp, samples) of a caller audio frame (an agent's side)."""
    if len(data) < _CALLER_HEADER.size:
        raise ProtocolError("bad_frame", "a binary frame shorter than its header")
    kind, version, _, timestamp = _CALLER_HEADER.unpack_from(data)
    if kind != CALLER_AUDIO or version != VERSION or (len(data) - _CALLER_HEADER.size) % 2:
        raise ProtocolError("bad_frame", f"binary frame kind {kind} version {version}")
    pcm = np.frombuffer(data[_CALLER_HEADER.size :], dtype="<i2").astype(np.int16)
    return timestamp, pcm


def encode_agent_audio(response_id: str, samples: NDArray[np.int16]) -> bytes:
    """An agent audio frame, tagged with its response id."""
    rid = response_id.encode("ascii")
    return (
        _AGENT_HEADER.pack(AGENT_AUDIO, VERSION, len(rid)) + rid + samples.astype("<i2").tobytes()
    )


class ReplayOverflow(Exception):
    """More un-acked messages than the bound: a resume could no longer replay them all."""


class Outbox:
    """The sending half: stamps seq and ack, keeps sequenced messages until the peer acks them.

    ``bound`` caps the un-acked messages; past it :class:`ReplayOverflow` is raised rather than
    dropping one silently (a replay with a hole would break the gapless promise).
    """

    def __init__(self, bound: int = DEFAULT_REPLAY_BOUND) -> None:
        self.bound = bound
        self.seq = 0  # the last sequenced seq sent
        self._unacked: deque[dict[str, Any]] = deque()

    def stamp(self, body: Mapping[str, Any], ack: int) -> dict[str, Any]:
        """The message to send for ``body``; a sequenced one is kept for replay."""
        message = dict(body)
        if message["type"] in LINK_TYPES:
            message.update(seq=self.seq, ack=ack)
            return message
        if len(self._unacked) >= self.bound:
            raise ReplayOverflow(f"{len(self._unacked)} messages un-acked (bound {self.bound})")
        self.seq += 1
        message.update(seq=self.seq, ack=ack)
        self._unacked.append(message)
        return message

    def acked(self, ack: int) -> None:
        """The peer has everything up to ``ack``: forget it. An ack beyond what was sent is the
        peer's error (the caller checks with :meth:`check_ack` first)."""
        while self._unacked and self._unacked[0]["seq"] <= ack:
            self._unacked.popleft()

    def check_ack(self, ack: int, ref_seq: int | None) -> None:
        if ack > self.seq:
            raise ProtocolError(
                "schema", f"ack {ack} is beyond the last seq sent ({self.seq})", ref_seq
            )

    def replay(self, ack: int, current_ack: int) -> list[dict[str, Any]]:
        """The messages the peer has not seen (seq > ``ack``), re-stamped with our current ack,
        in order. The seqs do not change: the peer skips what it already has."""
        self.acked(ack)
        return [{**m, "ack": current_ack} for m in self._unacked]

    @property
    def unacked(self) -> int:
        return len(self._unacked)


class Inbox:
    """The receiving half: the last seq taken in order. A duplicate (a replay overlapping what
    arrived before the drop) is skipped; a gap is a fatal ``seq_gap`` (a resume repairs it)."""

    def __init__(self) -> None:
        self.seq = 0

    def take(self, message: Mapping[str, Any]) -> bool:
        """True if ``message`` is new and in order; False for a duplicate or a link message."""
        seq: int = message["seq"]
        if message["type"] in LINK_TYPES:
            # Its seq is the sender's last sequenced one, which may still be on its way (a
            # session.resumed precedes the replay): it orders nothing.
            return False
        if seq <= self.seq:
            return False
        if seq != self.seq + 1:
            raise ProtocolError(
                "seq_gap", f"seq {seq} after {self.seq}: messages are missing", seq, fatal=True
            )
        self.seq = seq
        return True


class ErrorBudget:
    """Bad input is refused one message at a time; past ``limit`` errors the peer is closed."""

    def __init__(self, limit: int = 20) -> None:
        self.limit = limit
        self.count = 0

    def spend(self) -> bool:
        """Count one error; True when the budget is exhausted (close the socket)."""
        self.count += 1
        return self.count >= self.limit


MAX_TEXT_PER_S: Final = 200  # a peer sending more JSON messages than this in a second is flooding


class FloodGuard:
    """Text messages per one-second window; past :data:`MAX_TEXT_PER_S` each is refused
    (``flood``) and spends the error budget, so a flood ends in a close, never a backlog. Only the
    first refusal of a window is answered: an agent that acks each error it gets (as it should)
    would otherwise keep its own flood going."""

    def __init__(self, limit: int = MAX_TEXT_PER_S) -> None:
        self.limit = limit
        self._start = 0.0
        self._count = 0

    def check(self, now: float) -> None:
        if now - self._start >= 1.0:
            self._start, self._count = now, 0
        self._count += 1
        if self._count > self.limit:
            raise ProtocolError(
                "flood",
                f"more than {self.limit} messages in a second",
                answer=self._count == self.limit + 1,
            )


class RoundTrip:
    """Our pings and their pongs: the link's round-trip time (only the latest ping counts)."""

    def __init__(self) -> None:
        self.rtt_ms: float | None = None
        self._id = 0
        self._sent: dict[int, float] = {}

    def ping(self, now: float) -> dict[str, Any]:
        """The next ``ping`` body, sent at ``now``."""
        self._id += 1
        self._sent = {self._id: now}
        return {"type": "ping", "id": self._id}

    def pong(self, ping_id: int, now: float) -> float | None:
        """The round trip in ms of the ping ``ping_id`` answered at ``now`` (None if stale)."""
        sent = self._sent.pop(ping_id, None)
        if sent is None:
            return None
        self.rtt_ms = round((now - sent) * 1000, 1)
        return self.rtt_ms
