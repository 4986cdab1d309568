"""integrations/pipecat: the link's token, seq/ack and replay, and the serializer's turns.

The link is checked against voicegate's own token maker (agents/remote/), and against a real
aiohttp socket pair for replay; the serializer with real Pipecat frames.
"""

from __future__ import annotations

import json
import struct
import time
from typing import Any

import pytest
from pipecat.frames.frames import (
    InputAudioRawFrame,
    InputDTMFFrame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
)

from agents.remote.auth import make_token
from integrations.pipecat.frames import VoicegateMessageFrame
from integrations.pipecat.link import Link, SeqGap, verify_token
from integrations.pipecat.serializer import ProtocolError, VoicegateFrameSerializer

SECRET = "a-secret-of-sixteen-or-more"
URL = "ws://127.0.0.1:8766/agent"


def test_a_token_voicegate_made_names_its_session_and_nothing_else_passes() -> None:
    token = make_token(SECRET, "call-1", URL, now=time.time())
    assert verify_token(SECRET, f"Bearer {token}", URL) == "call-1"
    assert verify_token("another-secret-of-16+", f"Bearer {token}", URL) is None
    assert verify_token(SECRET, f"Bearer {token}", "ws://elsewhere/agent") is None
    assert verify_token(SECRET, f"Bearer {token}", URL, now=time.time() + 3600) is None
    for bad in ("", "Bearer", "Bearer v1.x", "Bearer v1.!!.!!", f"Bearer v2{token[2:]}"):
        assert verify_token(SECRET, bad, URL) is None, bad


class Socket:
    """A socket that records what was sent (the link's own logic is what is under test)."""

    def __init__(self) -> None:
        self.closed = False
        self.texts: list[dict[str, Any]] = []

    async def send_str(self, data: str) -> None:
        self.texts.append(json.loads(data))

    async def send_bytes(self, data: bytes) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


async def test_messages_are_kept_until_acked_and_replayed_with_their_own_seq() -> None:
    link = Link("call-1")
    first = Socket()
    await link.attach(first)
    for n in range(3):
        await link.send({"type": "mark", "response_id": "r1", "mark_id": f"m{n}"})
    assert [m["seq"] for m in first.texts] == [1, 2, 3]
    assert link.take({"type": "ack", "seq": 4, "ack": 1}) is False  # a link message
    assert link.unacked == 2
    assert link.detach(first) and not link.up.is_set()
    await link.send({"type": "response.done", "response_id": "r1"})  # while down: kept
    second = Socket()
    await link.attach(second)
    await link.replay(acked=2)
    assert [(m["seq"], m["type"]) for m in second.texts] == [(3, "mark"), (4, "response.done")]
    await link.send_link({"type": "ack"})
    assert second.texts[-1] == {"type": "ack", "seq": 4, "ack": 0}  # a link message: no seq


async def test_voicegates_replays_are_skipped_and_a_gap_is_refused() -> None:
    link = Link("call-1")
    assert link.take({"type": "gate", "seq": 1, "ack": 0}) is True
    assert link.take({"type": "gate", "seq": 1, "ack": 0}) is False  # replayed
    assert link.take({"type": "pong", "seq": 1, "ack": 0}) is False
    with pytest.raises(SeqGap):
        link.take({"type": "gate", "seq": 3, "ack": 0})
    assert link.taken == 1


async def test_a_new_resume_token_kills_the_old_one() -> None:
    link = Link("call-1")
    old = link.new_resume_token()
    assert link.resume_token_matches(old)
    new = link.new_resume_token()
    assert link.resume_token_matches(new) and not link.resume_token_matches(old)
    assert not link.resume_token_matches(None)


def _chunk_id(data: bytes | str | None) -> str:
    assert isinstance(data, bytes)
    kind, version, length = struct.unpack_from("!BBH", data)
    assert (kind, version) == (2, 1)
    return data[4 : 4 + length].decode()


async def test_each_turn_is_a_response_and_late_audio_keeps_its_turns_id() -> None:
    serializer = VoicegateFrameSerializer(rate=8000)
    start = await serializer.serialize(TTSStartedFrame(context_id="ctx-a"))
    assert json.loads(str(start)) == {"type": "response.start", "response_id": "r1"}
    audio = TTSAudioRawFrame(audio=bytes(320), sample_rate=8000, num_channels=1, context_id="ctx-a")
    assert _chunk_id(await serializer.serialize(audio)) == "r1"
    # The caller barged in: voicegate cut r1; the bot's next turn starts.
    assert serializer.cut("r1") is True
    await serializer.serialize(TTSStartedFrame(context_id="ctx-b"))
    # A chunk of the cut turn, however late, is stamped r1 (voicegate drops it), never r2.
    late = TTSAudioRawFrame(audio=bytes(320), sample_rate=8000, num_channels=1, context_id="ctx-a")
    assert _chunk_id(await serializer.serialize(late)) == "r1"
    assert not serializer.is_alive("r1") and serializer.is_alive("r2")
    done = await serializer.serialize(TTSStoppedFrame(context_id="ctx-b"))
    assert json.loads(str(done)) == {"type": "response.done", "response_id": "r2"}


async def test_an_interruption_of_the_pipelines_own_cancels_what_the_caller_hears() -> None:
    serializer = VoicegateFrameSerializer(rate=8000)
    await serializer.serialize(TTSStartedFrame(context_id="a"))
    await serializer.serialize(TTSStoppedFrame(context_id="a"))  # done, still playing out
    cancel = await serializer.serialize(InterruptionFrame())
    assert json.loads(str(cancel)) == {"type": "response.cancel", "response_id": "r1"}
    assert await serializer.serialize(InterruptionFrame()) is None  # nothing left to cut
    # After voicegate's own cut (a barge-in), the pipeline's interruption sends nothing.
    await serializer.serialize(TTSStartedFrame(context_id="b"))
    serializer.cut("r2")
    assert await serializer.serialize(InterruptionFrame()) is None


async def test_audio_outside_a_turn_is_not_sent() -> None:
    serializer = VoicegateFrameSerializer(rate=8000)
    audio = TTSAudioRawFrame(audio=bytes(320), sample_rate=8000, num_channels=1)
    assert await serializer.serialize(audio) is None
    assert serializer.dropped_outside_turn == 1


async def test_what_voicegate_sends_becomes_frames() -> None:
    serializer = VoicegateFrameSerializer(rate=16000)
    audio = await serializer.deserialize(struct.pack("!BBHQ", 1, 1, 0, 320) + bytes(640))
    assert isinstance(audio, InputAudioRawFrame)
    assert (audio.sample_rate, audio.num_frames) == (16000, 320)
    key = await serializer.deserialize(json.dumps({"type": "dtmf", "digit": "#"}))
    assert isinstance(key, InputDTMFFrame) and key.button.value == "#"
    letter = await serializer.deserialize(json.dumps({"type": "dtmf", "digit": "A"}))
    assert isinstance(letter, VoicegateMessageFrame)
    started = await serializer.deserialize(json.dumps({"type": "speech.started"}))
    assert isinstance(started, UserStartedSpeakingFrame)
    gate = await serializer.deserialize(json.dumps({"type": "gate", "state": "frozen"}))
    assert isinstance(gate, VoicegateMessageFrame) and gate.message["state"] == "frozen"
    for bad in (b"\x01", struct.pack("!BBHQ", 2, 1, 0, 0), "not json", "[1]", '{"no": "type"}'):
        with pytest.raises(ProtocolError):
            await serializer.deserialize(bad)
