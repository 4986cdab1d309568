"""A Pipecat transport for one voicegate call: the bot's pipeline sees frames, never the link.

``VoicegateTransport`` is what a bot gets where a Twilio bot gets a ``FastAPIWebsocketTransport``
(docs/pipecat.md). Its input pushes the caller's audio, keys and voicegate's speech events, and
turns voicegate's cuts into Pipecat interruptions; its output turns each TTS turn into a
voicegate response, streamed in real time a little ahead of the caller, with a mark after each
word so that the words reach the assistant context only as voicegate reports them played. The
link (seq, ack, replay, resume) lives in link.py and the server (server.py) re-attaches a
redialled socket to the same transport, so a dropped link pauses the output and nothing else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    CancelFrame,
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMAssistantPushAggregationFrame,
    OutputAudioRawFrame,
    StartFrame,
    SystemFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import BaseTransport, TransportParams

from integrations.pipecat.frames import VoicegateResponseCutFrame
from integrations.pipecat.link import Link
from integrations.pipecat.serializer import VoicegateFrameSerializer
from integrations.pipecat.tools import ToolCalls

log = logging.getLogger("voicegate.pipecat")

CHUNK_MS = 20


class VoicegateParams(TransportParams):
    """Transport parameters; audio in and out are on by default (a phone call has both).

    ``lead_ms``: how far ahead of the caller the output streams (voicegate refuses audio past
    its ``playout_max_ms``, which caps it); ``word_marks``: a mark after each word of a turn,
    so the assistant context keeps what the caller heard (off: the whole turn's text as
    Pipecat's own transports keep it, what was sent rather than heard).
    """

    audio_in_enabled: bool = True
    audio_out_enabled: bool = True
    lead_ms: int = 200
    word_marks: bool = True


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What voicegate's ``session.start`` said about the call (the caller's number masked)."""

    session_id: str
    rate: int
    codec: str
    caller: str
    called_user: str
    resumed: bool
    last_heard: dict[str, Any] | None
    rejoined: dict[str, Any] | None
    playout_max_ms: int

    @classmethod
    def from_start(cls, start: dict[str, Any], rate: int) -> CallInfo:
        call = start.get("call") or {}
        return cls(
            session_id=str(start["session_id"]),
            rate=rate,
            codec=str(call.get("codec", "")),
            caller=str(call.get("caller", "")),
            called_user=str(call.get("called_user", "")),
            resumed=bool(start.get("resumed")),
            last_heard=start.get("last_heard"),
            rejoined=start.get("rejoined"),
            playout_max_ms=int(start.get("playout_max_ms", 1000)),
        )


class VoicegateInputTransport(BaseInputTransport):
    """The caller's side: audio, keys, speech events, and voicegate's cuts as interruptions."""

    def __init__(self, transport: VoicegateTransport, params: VoicegateParams, **kwargs: Any):
        super().__init__(params, **kwargs)
        self._transport = transport
        self._ready = False
        self._early: deque[Frame] = deque(maxlen=256)  # keys and events before the pipeline ran

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)
        self._ready = True
        while self._early:
            await self.push_frame(self._early.popleft())
        await self._transport.started()

    async def deliver(self, frame: Frame) -> None:
        """A frame from voicegate (keys, speech events, messages)."""
        if not self._ready:
            self._early.append(frame)
            return
        await self.push_frame(frame)

    async def deliver_audio(self, frame: InputAudioRawFrame) -> None:
        if self._ready:  # audio before the pipeline runs is gone (it is a live call)
            await self.push_audio_frame(frame)

    @property
    def ready(self) -> bool:
        return self._ready

    async def interrupt(self) -> None:
        """voicegate cut the bot's turn: the pipeline drops what it was still making of it."""
        if self._ready:
            await self.broadcast_interruption()  # type: ignore[no-untyped-call]


@dataclass(slots=True)
class _Held:
    """A frame on its way downstream after the transport, held in order behind its mark."""

    frame: Frame
    mark_id: str | None = None
    response_id: str | None = None
    span: tuple[float, float] = (0.0, 0.0)  # where its audio lies in the response, ms
    outcome: str | None = None  # played or cleared, once voicegate says


class VoicegateOutputTransport(BaseOutputTransport):
    """The bot's side: TTS turns become voicegate responses, streamed in real time."""

    def __init__(self, transport: VoicegateTransport, params: VoicegateParams, **kwargs: Any):
        super().__init__(params, **kwargs)
        self._transport = transport
        self._vg_params = params
        self._outbound: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None
        self._held: deque[_Held] = deque()
        self._marks = 0
        self._resampler = create_stream_resampler()
        self._paced: str | None = None  # the response being paced and its clock
        self._paced_start = 0.0
        self._paced_ms = 0.0
        self._speaking: str | None = None  # the response the caller is hearing, for Bot*Speaking
        self._queued_ms: dict[str, float] = {}  # audio of each response queued so far
        self._said_to: dict[str, float] = {}  # where the last text of each response ended
        self._heard: dict[str, int] = {}  # heard_ms of each cut response
        self._interrupting = 0  # interruptions on their way here (see expect_interruption)
        self._drained = asyncio.Event()

    @property
    def serializer(self) -> VoicegateFrameSerializer:
        return self._transport.serializer

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)
        if self._sender is None:
            self._sender = self.create_task(self._send_loop(), name="voicegate-sender")

    async def stop(self, frame: EndFrame) -> None:
        await self._drain()
        await self._transport.bot_ended(frame)
        await super().stop(frame)
        await self._stop_sender()

    async def cancel(self, frame: CancelFrame) -> None:
        self._clear()
        await self._transport.bot_ended(frame)
        await super().cancel(frame)
        await self._stop_sender()

    async def _stop_sender(self) -> None:
        if self._sender is not None:
            await self.cancel_task(self._sender)
            self._sender = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if direction is FrameDirection.DOWNSTREAM and not isinstance(frame, SystemFrame | EndFrame):
            # Everything the bot says, and every frame after it, goes out in order: audio and
            # turn boundaries to voicegate, the rest downstream behind the audio before it.
            # Which response a frame belongs to is settled now, as it arrives; the sender only
            # paces and sends.
            await self._call_processed(frame)
            serializer = self.serializer
            if isinstance(frame, TTSStartedFrame):
                self._outbound.put_nowait(("message", _body(await serializer.serialize(frame))))
                self._outbound.put_nowait(("release", (None, frame)))
            elif isinstance(frame, OutputAudioRawFrame):
                await self._enqueue_audio(frame)
            elif isinstance(frame, TTSStoppedFrame):
                response_id = serializer.current_response
                body = _body(await serializer.serialize(frame))
                self._outbound.put_nowait(("stopped", (response_id if body else None, frame)))
            elif isinstance(frame, TTSTextFrame):
                response_id = serializer.current_response
                span = (0.0, 0.0)
                if response_id is not None:
                    # A sentence's text comes behind its audio: it spans from the text before
                    # it to the audio queued so far.
                    end = self._queued_ms.get(response_id, 0.0)
                    span = (self._said_to.get(response_id, 0.0), end)
                    self._said_to[response_id] = end
                self._outbound.put_nowait(("text", (response_id, frame, span)))
            else:
                self._outbound.put_nowait(("release", (None, frame)))
            return
        if isinstance(frame, InterruptionFrame):
            await self._interrupted()
            await super().process_frame(frame, direction)
            # Downstream processors have the interruption ahead of anything released now:
            # what the caller heard of the cut turn is not reset away with its queue.
            self._interrupting = max(0, self._interrupting - 1)
            await self._release()
            return
        await super().process_frame(frame, direction)

    def expect_interruption(self) -> None:
        """voicegate cut the live turn and the input broadcasts the interruption: hold what
        would go downstream until it has passed here."""
        self._interrupting += 1

    async def _call_processed(self, frame: Frame) -> None:
        # FrameProcessor.process_frame does the bookkeeping every processor owes; the routing
        # here replaces BaseOutputTransport's media sender for everything the bot says.
        await super(BaseOutputTransport, self).process_frame(frame, FrameDirection.DOWNSTREAM)

    async def _enqueue_audio(self, frame: OutputAudioRawFrame) -> None:
        response_id = self.serializer.response_for(frame)
        if response_id is None:
            self.serializer.dropped_outside_turn += 1
            if self.serializer.dropped_outside_turn == 1:
                log.warning(
                    "pipecat.audio_outside_a_turn: audio with no TTS turn open is not sent "
                    "(wrap it in TTSStartedFrame/TTSStoppedFrame; docs/pipecat.md)"
                )
            return
        rate = self._transport.rate
        audio = frame.audio
        if frame.sample_rate != rate:
            audio = await self._resampler.resample(audio, frame.sample_rate, rate)
        step = rate * CHUNK_MS // 1000 * 2
        queued = self._queued_ms.get(response_id, 0.0) + len(audio) // 2 / rate * 1000
        self._queued_ms[response_id] = queued
        if len(self._queued_ms) > 64:
            self._queued_ms.pop(next(iter(self._queued_ms)))
            self._said_to.pop(next(iter(self._said_to)), None)
        for at in range(0, len(audio) - len(audio) % 2, step):
            self._outbound.put_nowait(("audio", (response_id, audio[at : at + step])))

    async def _interrupted(self) -> None:
        """The pipeline interrupted the turn: cut it at voicegate if it is still alive."""
        body = _body(await self.serializer.serialize(InterruptionFrame()))
        self._clear()
        if body is not None:
            await self._transport.link.send(body)

    def _clear(self) -> None:
        """Drop what was still to be said; frames that must not be lost go on downstream.

        The text of a sentence cut before its audio was all sent waits for voicegate's
        ``heard_ms``: the caller may have heard the start of it.
        """
        keep: list[tuple[str, Any]] = []
        while not self._outbound.empty():
            kind, item = self._outbound.get_nowait()
            if kind == "text" and item[0] is not None:
                self._held.append(_Held(item[1], None, item[0], item[2], outcome="cleared"))
            elif kind == "end" or (
                kind in ("release", "text", "stopped") and not item[1].interruptible
            ):
                keep.append((kind, item))
        for entry in keep:
            self._outbound.put_nowait(entry)
        self._paced = None

    async def _drain(self) -> None:
        """Wait until everything queued before now has gone out (the goodbye, its marks)."""
        self._drained.clear()
        self._outbound.put_nowait(("end", None))
        await self._drained.wait()

    async def _send_loop(self) -> None:
        link = self._transport.link
        while True:
            kind, item = await self._outbound.get()
            if kind == "audio":
                await self._send_chunk(*item)
            elif kind == "message" and item is not None:
                await link.send(item)
            elif kind == "text":
                await self._hold(item[1], item[0], item[2])
            elif kind == "stopped":
                response_id, frame = item
                await self._hold(frame, response_id if self._alive(response_id) else None)
            elif kind == "release":
                await self._hold(item[1], None)
            elif kind == "end":
                self._drained.set()

    def _alive(self, response_id: str | None) -> bool:
        return response_id is not None and self.serializer.is_alive(response_id)

    async def _send_chunk(self, response_id: str, audio: bytes) -> None:
        link = self._transport.link
        loop = asyncio.get_running_loop()
        if self._paced != response_id:
            self._paced, self._paced_start, self._paced_ms = response_id, loop.time(), 0.0
        lead = min(self._vg_params.lead_ms, self._transport.info.playout_max_ms // 2)
        ahead = self._paced_ms - (loop.time() - self._paced_start) * 1000
        if ahead > lead:
            await asyncio.sleep((ahead - lead) / 1000)
        if not link.up.is_set():
            await link.up.wait()  # the link dropped: voicegate cut this turn, a resume follows
            self._paced_start = loop.time() - self._paced_ms / 1000
        if await link.send_audio(self.serializer.audio(response_id, audio)):
            self._paced_ms += len(audio) / 2 / self._transport.rate * 1000
            if self._speaking != response_id and self._alive(response_id):
                self._speaking = response_id
                await self._bot_speaking(BotStartedSpeakingFrame)
            rate = self._transport.rate
            await self.push_frame(
                OutputAudioRawFrame(audio=audio, sample_rate=rate, num_channels=1)
            )

    async def _hold(
        self, frame: Frame, response_id: str | None, span: tuple[float, float] = (0.0, 0.0)
    ) -> None:
        """Send ``frame`` downstream once the audio before it has played (at once if none).

        A word's text waits for a mark after its audio; the end of a turn waits for a mark
        after all of it, then ``response.done``. A word voicegate reports cleared never goes
        on: the assistant context keeps what the caller heard.
        """
        mark_id = None
        marked = isinstance(frame, TTSStoppedFrame) or self._vg_params.word_marks
        text = isinstance(frame, TTSTextFrame)
        if text and response_id is not None and not self._alive(response_id):
            # Cut before its mark went out: heard_ms decides what of it the caller heard.
            self._held.append(_Held(frame, None, response_id, span, outcome="cleared"))
            await self._release()
            return
        if response_id is not None and marked:
            self._marks += 1
            mark_id = f"m{self._marks}"
            link = self._transport.link
            await link.send({"type": "mark", "response_id": response_id, "mark_id": mark_id})
            if isinstance(frame, TTSStoppedFrame):
                self.serializer.done(response_id)
                await link.send({"type": "response.done", "response_id": response_id})
        self._held.append(_Held(frame, mark_id, response_id, span))
        await self._release()

    async def mark_outcome(self, mark_id: str, outcome: str) -> None:
        for held in self._held:
            if held.mark_id == mark_id:
                held.outcome = outcome
        await self._release()

    async def _release(self) -> None:
        partial_turn = False
        while self._held and not self._interrupting:
            head = self._held[0]
            if head.mark_id is not None and head.outcome is None:
                break  # not played yet
            if isinstance(head.frame, TTSTextFrame) and head.outcome == "cleared":
                # Cut: the context keeps the part the caller heard, once voicegate says how
                # much that was (its cut message may come after the mark's outcome).
                heard = self._heard.get(head.response_id or "")
                if heard is None and not self._transport.ended:
                    break
                self._held.popleft()
                partial = _heard_part(head.frame.text, head.span, heard or 0)
                if partial:
                    await self.push_frame(dataclasses.replace(head.frame, text=partial))
                    partial_turn = True
                continue
            self._held.popleft()
            if isinstance(head.frame, TTSStoppedFrame) and head.response_id is not None:
                if head.outcome == "played":
                    self.serializer.played_out(head.response_id)
                if self._speaking == head.response_id:
                    self._speaking = None
                    await self._bot_speaking(BotStoppedSpeakingFrame)
            await self.push_frame(head.frame)
        if partial_turn:
            # The interruption already closed the assistant's turn: what was heard of the cut
            # sentence goes into the context as a message of its own.
            await self.push_frame(LLMAssistantPushAggregationFrame())

    async def response_cut(self, response_id: str, heard_ms: int) -> None:
        """voicegate cut a response: the caller stopped hearing the bot after ``heard_ms``."""
        self._heard[response_id] = heard_ms
        if len(self._heard) > 64:
            self._heard.pop(next(iter(self._heard)))
        if self._speaking == response_id:
            self._speaking = None
            await self._bot_speaking(BotStoppedSpeakingFrame)
        await self._release()

    async def call_ended(self) -> None:
        await self._release()  # nothing more will be heard: let the held frames go

    async def _bot_speaking(self, frame_cls: type[Frame]) -> None:
        await self.broadcast_frame(frame_cls)


def _heard_part(text: str, span: tuple[float, float], heard_ms: int) -> str:
    """The words of ``text`` the caller heard, its audio spanning ``span`` of the response."""
    start, end = span
    if heard_ms <= start or end <= start:
        return ""
    words = text.split()
    share = min(1.0, (heard_ms - start) / (end - start))
    return " ".join(words[: int(len(words) * share)])


def _body(payload: str | bytes | None) -> dict[str, Any] | None:
    if isinstance(payload, str):
        body: dict[str, Any] = json.loads(payload)
        return body
    return None


EventHandler = Callable[..., Awaitable[None]]


class VoicegateTransport(BaseTransport):
    """One voicegate call as a Pipecat transport (made by ``VoicegateServer`` for each call).

    Events (``@transport.event_handler(name)``): ``on_client_connected(transport, info)`` when
    the pipeline is running (greet the caller here), ``on_client_disconnected(transport,
    reason)`` when the call is over (cancel the task here), ``on_link_lost(transport)`` and
    ``on_link_resumed(transport)`` (informational: the transport handles both),
    ``on_message(transport, message)`` for every voicegate message (gate, transfer.progress, ...).
    """

    def __init__(
        self,
        link: Link,
        info: CallInfo,
        params: VoicegateParams | None = None,
        *,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.link = link
        self.info = info
        self.rate = info.rate
        self.params = params or VoicegateParams()
        self.params.audio_in_sample_rate = self.params.audio_in_sample_rate or info.rate
        self.params.audio_out_sample_rate = self.params.audio_out_sample_rate or info.rate
        self.serializer = VoicegateFrameSerializer(rate=info.rate)
        self.tools = ToolCalls(link)
        self.ended: str | None = None  # why the call ended, once voicegate says so
        self._hung_up = False
        self._input: VoicegateInputTransport | None = None
        self._output: VoicegateOutputTransport | None = None
        for event in (
            "on_client_connected",
            "on_client_disconnected",
            "on_link_lost",
            "on_link_resumed",
            "on_message",
        ):
            self._register_event_handler(event)

    def input(self) -> VoicegateInputTransport:
        if self._input is None:
            self._input = VoicegateInputTransport(self, self.params, name=self._input_name)
        return self._input

    def output(self) -> VoicegateOutputTransport:
        if self._output is None:
            self._output = VoicegateOutputTransport(self, self.params, name=self._output_name)
        return self._output

    # What the bot can ask of voicegate.

    async def transfer(
        self, target: str | None = None, mode: str | None = None, complete: str | None = None
    ) -> None:
        """Hand the caller to a person (docs/agent-protocol.md, "Transfers")."""
        body: dict[str, Any] = {"type": "transfer"}
        if target is not None:
            body["target"] = target
        if mode is not None:
            body["mode"] = mode
        if complete is not None:
            body["complete"] = complete
        await self.link.send(body)

    async def hang_up(self, reason: str = "the bot hung up", after_playout: bool = True) -> None:
        """BYE once what was said has played (an ``EndFrame`` does this too)."""
        if self._hung_up or self.ended is not None:
            return
        self._hung_up = True
        await self.link.send(
            {"type": "hangup", "reason": reason[:200], "after_playout": after_playout}
        )

    # Called by the pipeline's processors and the server.

    async def started(self) -> None:
        await self._call_event_handler("on_client_connected", self.info)

    async def bot_ended(self, frame: EndFrame | CancelFrame) -> None:
        """The pipeline ended: an EndFrame is the bot hanging up after its last words."""
        if isinstance(frame, EndFrame):
            await self.hang_up("the bot ended the call")
        else:
            await self.hang_up("the bot's pipeline was cancelled", after_playout=False)

    async def receive(self, message: dict[str, Any]) -> None:
        """A new sequenced message from voicegate, in order."""
        kind = message["type"]
        frame = await self.serializer.deserialize(json.dumps(message))
        if kind in ("playback.interrupted", "playback.cleared"):
            await self._cut(message)
        elif kind == "output.stop":
            current = self.serializer.current_response
            if current is not None and self.serializer.cut(current):
                await self.input().interrupt()
        elif kind == "mark.outcome":
            await self.output().mark_outcome(str(message["mark_id"]), str(message["outcome"]))
        elif kind == "tool.result":
            self.tools.result(message)
        elif kind == "session.end":
            self.ended = str(message.get("reason", "ended"))
            self.tools.ended()
            await self.output().call_ended()
        if frame is not None:
            await self.input().deliver(frame)
        await self._call_event_handler("on_message", message)
        if kind == "session.end":
            await self._call_event_handler("on_client_disconnected", self.ended)

    async def receive_audio(self, data: bytes) -> None:
        frame = await self.serializer.deserialize(data)
        if isinstance(frame, InputAudioRawFrame):
            await self.input().deliver_audio(frame)

    async def _cut(self, message: dict[str, Any]) -> None:
        response_id = str(message["response_id"])
        live = self.serializer.cut(response_id) and self.input().ready
        if live:
            self.output().expect_interruption()
        await self.output().response_cut(response_id, int(message.get("heard_ms", 0)))
        if live:
            await self.input().interrupt()
        await self.input().deliver(
            VoicegateResponseCutFrame(
                response_id=response_id,
                heard_ms=int(message.get("heard_ms", 0)),
                reason=str(message.get("reason", "")),
            )
        )

    async def link_lost(self) -> None:
        await self._call_event_handler("on_link_lost")

    async def link_resumed(self) -> None:
        await self.tools.reclaim()
        await self._call_event_handler("on_link_resumed")
