"""Pipecat frames to and from voicegate's remote-agent protocol (docs/agent-protocol.md).

The serializer maps; it does not sequence. ``serialize`` returns a message body (JSON text
without ``seq`` and ``ack``) or a binary audio frame, and the transport's link numbers, keeps and
replays the messages. Its one piece of state is the bot's turns: every TTS turn
(``TTSStartedFrame`` to ``TTSStoppedFrame``) is one voicegate response, and every chunk of audio
is stamped with the response of the turn it belongs to (by the TTS ``context_id`` when the
service sets one), so a chunk of a turn that was cut is never played however late it comes:
voicegate drops audio of a dead response at admission.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from pipecat.audio.dtmf.types import KeypadEntry
from pipecat.frames.frames import (
    Frame,
    InputAudioRawFrame,
    InputDTMFFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.serializers.base_serializer import FrameSerializer

from integrations.pipecat.frames import VoicegateMessageFrame

CALLER_AUDIO = 1  # binary kind: voicegate to agent, 12-byte header
RESPONSE_AUDIO = 2  # binary kind: agent to voicegate, then the response id
_CALLER_HEADER = struct.Struct("!BBHQ")
_RESPONSE_HEADER = struct.Struct("!BBH")
_KEYS = frozenset(key.value for key in KeypadEntry)


class ProtocolError(ValueError):
    """voicegate sent something this side cannot read (it closes the socket; a resume follows)."""


@dataclass(slots=True)
class _Response:
    response_id: str
    context_id: str | None
    alive: bool = True  # voicegate plays its audio: until a cut, or done and played out
    done: bool = False  # response.done sent: no more audio of it
    played_out: bool = False  # its last audio reached the caller


class VoicegateFrameSerializer(FrameSerializer):
    """Frames to voicegate messages and back, with one response per bot turn."""

    def __init__(self, rate: int = 8000, prefix: str = "r", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rate = rate
        self._prefix = prefix  # response ids are prefix + a counter: never reused in a session
        self._count = 0
        self._recent: dict[str, _Response] = {}  # by response id, the latest 64
        self._current: _Response | None = None  # the open turn (TTS started, not stopped)
        self.dropped_outside_turn = 0  # audio sent with no turn open (not sent: see pipecat.md)

    @property
    def current_response(self) -> str | None:
        """The response of the open turn, if voicegate still plays it."""
        current = self._current
        return current.response_id if current is not None and current.alive else None

    def is_alive(self, response_id: str) -> bool:
        response = self._recent.get(response_id)
        return response is not None and response.alive and not response.done

    def cut(self, response_id: str) -> bool:
        """voicegate cut ``response_id``; True if it was alive until now (the bot was still
        making or sending it, or the caller still hearing it: the pipeline must stop it)."""
        response = self._recent.get(response_id)
        if response is None or not response.alive:
            return False
        response.alive = False  # (still the open turn: its late chunks keep its id)
        return True

    def done(self, response_id: str) -> None:
        response = self._recent.get(response_id)
        if response is not None:
            response.done = True

    def played_out(self, response_id: str) -> None:
        response = self._recent.get(response_id)
        if response is not None:
            response.played_out = True
            response.alive = False

    def response_for(self, frame: OutputAudioRawFrame) -> str | None:
        """The response a chunk belongs to: its TTS context's, else the open turn's."""
        context = frame.context_id if isinstance(frame, TTSAudioRawFrame) else None
        if context is not None:
            for response in reversed(self._recent.values()):
                if response.context_id == context:
                    return response.response_id
        return self._current.response_id if self._current is not None else None

    def audio(self, response_id: str, pcm: bytes) -> bytes:
        """A binary frame of response audio, stamped with its response."""
        rid = response_id.encode()
        return _RESPONSE_HEADER.pack(RESPONSE_AUDIO, 1, len(rid)) + rid + pcm

    def _open(self, context_id: str | None) -> _Response:
        self._count += 1
        if self._current is not None:
            self._current.alive = False  # a newer response supersedes it (voicegate agrees)
        response = _Response(f"{self._prefix}{self._count}", context_id)
        self._recent[response.response_id] = response
        if len(self._recent) > 64:  # only recent turns can still send late audio
            self._recent.pop(next(iter(self._recent)))
        self._current = response
        return response

    async def serialize(self, frame: Frame) -> str | bytes | None:
        if isinstance(frame, TTSStartedFrame):
            response = self._open(frame.context_id)
            return _text({"type": "response.start", "response_id": response.response_id})
        if isinstance(frame, OutputAudioRawFrame):
            response_id = self.response_for(frame)
            if response_id is None:
                self.dropped_outside_turn += 1
                return None
            return self.audio(response_id, frame.audio)
        if isinstance(frame, TTSStoppedFrame):
            current = self._current
            if current is None or (
                frame.context_id is not None
                and current.context_id is not None
                and frame.context_id != current.context_id
            ):
                return None  # the end of a turn that was already superseded
            self._current = None
            if not current.alive:
                return None  # cut: voicegate already ended it
            return _text({"type": "response.done", "response_id": current.response_id})
        if isinstance(frame, InterruptionFrame):
            # The pipeline interrupted the bot (its own turn logic): cut what the caller is
            # hearing, the open turn or the last one still playing out at voicegate.
            self._current = None
            playing = [r for r in self._recent.values() if r.alive and not r.played_out]
            if not playing:
                return None
            for response in playing:
                response.alive = False
            return _text({"type": "response.cancel", "response_id": playing[-1].response_id})
        return None  # EndFrame and CancelFrame: the transport hangs up (transport.py)

    async def deserialize(self, data: str | bytes) -> Frame | None:
        if isinstance(data, bytes):
            if len(data) < _CALLER_HEADER.size:
                raise ProtocolError(f"a binary frame of {len(data)} bytes")
            kind, version, _, _ = _CALLER_HEADER.unpack_from(data)
            if kind != CALLER_AUDIO or version != 1:
                raise ProtocolError(f"binary frame kind {kind} version {version}")
            return InputAudioRawFrame(
                audio=data[_CALLER_HEADER.size :], sample_rate=self.rate, num_channels=1
            )
        try:
            message = json.loads(data)
        except ValueError as exc:
            raise ProtocolError(f"not JSON: {exc}") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ProtocolError("a message without a type")
        kind = message["type"]
        if kind == "dtmf":
            digit = message.get("digit")
            if digit in _KEYS:
                return InputDTMFFrame(button=KeypadEntry(digit))
            return VoicegateMessageFrame(message=message)  # A-D: Pipecat's keypad has none
        if kind == "speech.started":
            return UserStartedSpeakingFrame()
        if kind == "speech.stopped":
            return UserStoppedSpeakingFrame()
        return VoicegateMessageFrame(message=message)


def _text(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"))
