"""A remote agent as an :class:`agents.base.Agent`: the call runs it like any other agent.

Each handler the call invokes becomes a protocol message (docs/agent-protocol.md); each message
the agent sends becomes a request of the call's :class:`~agents.base.CallControl`. The mapping
keeps voicegate's promises on the wire:

- A response is a handle. The agent's ``response_id`` maps to the handle ``call.respond()`` gave;
  a chunk for an unknown id, or for a handle that died (interrupted, superseded, canceled, ended),
  is dropped and counted, never played.
- A tool call goes through ``call.request_tool`` with an idempotency key derived from the
  session and the agent's ``call_id`` (agents/remote/tool_calls.py); the same ``call_id`` again
  (after a resume, say) is answered with the original result, or ``pending``: never a second
  execution (seed 004, "duplicate guard").
- A link that drops is an interruption of the call (``call.link_lost()``); a resume ends it
  (``call.link_restored()``); a link that does not come back ends the call
  (``call.link_failed()``), the caller told.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.base import (
    CUT_BY_CALLER,
    Agent,
    CallContext,
    CallControl,
    ConsultEvent,
    GateChange,
    MarkOutcome,
    PlaybackCut,
    Response,
    ToolResult,
    TransferUpdate,
)
from agents.remote.dial import LinkConfig, tls_context
from agents.remote.link import Link
from agents.remote.metrics import RemoteAgentMetrics
from agents.remote.protocol import VERSION, Codec, ProtocolError, encode_caller_audio
from agents.remote.tool_calls import ToolCalls
from audio.frame import Frame
from audio.playout import PlayoutFull
from audio.resample import resample

log = logging.getLogger("voicegate.agent.remote")

FEATURES = ("marks", "tools", "resume", "dtmf", "speech_events", "consult", "false_interruptions")


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    link: LinkConfig
    agent_rate: int  # caller audio and agent audio on the wire (audio.agent_rate)
    playout_max_ms: int


@dataclass(slots=True)
class _Remote:
    """One of the agent's responses: its handle."""

    handle: Response


class RemoteAgentFactory:
    """``agent.kind = "remote"``: a :class:`RemoteAgent` per call."""

    def __init__(self, settings: RemoteSettings, metrics: RemoteAgentMetrics) -> None:
        self.settings = settings
        self.metrics = metrics

    def __call__(self, context: CallContext, call: CallControl) -> Agent:
        return RemoteAgent(context, call, self.settings, self.metrics)


class RemoteAgent(Agent):
    def __init__(
        self,
        context: CallContext,
        call: CallControl,
        settings: RemoteSettings,
        metrics: RemoteAgentMetrics,
    ) -> None:
        super().__init__(context, call)
        self.settings = settings
        self.metrics = metrics
        self.link = Link(settings.link, context.call_id, self, metrics)
        self._codec = Codec("from_agent")
        self._task: asyncio.Task[None] | None = None
        self._responses: dict[str, _Remote] = {}  # the agent's response id -> its handle
        self._ids: dict[str, str] = {}  # voicegate's response id -> the agent's
        self._last_cut: dict[str, Any] | None = None  # what the caller heard of the last cut
        # The agent's id of the response the last barge-in cut: the one a false interruption
        # is about (voicegate/call/turns.py judges only the latest speech cut).
        self._barged: str | None = None
        # Whether the agent listed false_interruptions in session.accept: an agent written
        # before the message existed is never sent it.
        self._hears_false = False
        self._tools = ToolCalls(context.call_id)
        self._gap: tuple[int, int] | None = None  # (first timestamp missed, samples missed)
        self._speaking = False
        self._restarting = False  # a session.start after a refused resume is on its way
        # consult.event goes only to an agent whose session.accept listed the feature consult
        # (an agent of before it never gets a type it does not know).
        self.consult_events = False

    # --- the call's side: handlers become messages --------------------------------------------

    async def on_start(self) -> None:
        self.link.send(self._start(resumed=False))
        self._task = asyncio.get_running_loop().create_task(self.link.run())

    async def on_rejoined(self, heard_last: str, results: Sequence[ToolResult]) -> None:
        # A caller sent back to this session on a new call (docs/tenants.md, "Coming back"):
        # a new agent session, resumed (no greeting), told what the caller heard last and what
        # became of the session's tool calls, read back from the store (never run again). Its
        # call ids are new requests: their keys must not meet the earlier calls' keys.
        self._tools.rejoined()
        start = self._start(resumed=True)
        start["rejoined"] = {
            "heard_last": heard_last[:300],
            "results": [
                {"tool": r.tool, "outcome": r.outcome, "detail": dict(r.detail)} for r in results
            ],
        }
        self.link.send(start)
        self._task = asyncio.get_running_loop().create_task(self.link.run())

    def _start(self, resumed: bool) -> dict[str, Any]:
        c = self.context
        return {
            "type": "session.start",
            "session_id": c.call_id,
            "versions": [VERSION],
            "audio": {
                "encodings": ["pcm16"],
                "rates": [self.settings.agent_rate],
                "frame_ms": 20,
            },
            "features": list(FEATURES),
            "call": {
                "called_user": c.called_user,
                "caller": c.caller,
                "codec": c.codec,
                "rate": c.rate,
            },
            "playout_max_ms": self.settings.playout_max_ms,
            "resumed": resumed,
            "last_heard": self._last_cut,
        }

    async def on_dtmf(self, digit: str) -> None:
        self.link.send({"type": "dtmf", "digit": digit})

    async def on_audio(self, frame: Frame) -> None:
        if self.link.is_open:
            if self._gap is not None:
                start, samples = self._gap
                self._gap = None
                self.link.send({"type": "audio.gap", "start_ts": start, "samples": samples})
            if self.link.send_audio(encode_caller_audio(frame.timestamp, frame.samples)):
                return
        # Never replayed (docs/agent-protocol.md, "Caller audio"): counted as one gap.
        start, samples = self._gap or (frame.timestamp, 0)
        self._gap = (start, samples + len(frame.samples))

    async def on_speech_started(self) -> None:
        self._speaking = True
        self.link.send({"type": "speech.started"})

    async def on_speech_turn(self, duration_ms: int) -> None:
        self._speaking = False
        self.link.send({"type": "speech.stopped", "duration_ms": duration_ms})

    async def on_playback_cut(self, cut: PlaybackCut) -> None:
        # A cut by the caller or the agent is an interruption; one the session made (lost
        # media, a transfer, the link, a timeout, the end) is a clear. Both say what was heard.
        rid = self._ids.get(cut.response_id)
        if rid is None:
            return
        self._last_cut = {"response_id": rid, "heard_ms": cut.heard_ms}
        if cut.reason == "barge_in":
            self._barged = rid
        by_caller = cut.reason in CUT_BY_CALLER
        kind = {"type": "playback.interrupted"} if by_caller else {"type": "playback.cleared"}
        self.link.send(
            {
                **kind,
                "response_id": rid,
                "generation": cut.generation,
                "heard_ms": cut.heard_ms,
                "marks_cleared": list(cut.marks_cleared),
                "reason": cut.reason,
            }
        )

    async def on_false_interruption(self, heard_ms: int) -> None:
        rid, self._barged = self._barged, None
        if rid is not None and self._hears_false:
            self.link.send(
                {"type": "playback.false_interruption", "response_id": rid, "heard_ms": heard_ms}
            )

    async def on_gate(self, change: GateChange) -> None:
        self.link.send(
            {
                "type": "gate",
                "state": change.state,
                "previous": change.previous,
                "reason": change.reason[:300],
            }
        )

    async def on_transfer(self, update: TransferUpdate) -> None:
        self._transfer_progress(update.state, update.status, update.detail)

    def _transfer_progress(self, state: str, status: int = 0, detail: str = "") -> None:
        self.link.send(
            {"type": "transfer.progress", "state": state, "status": status, "detail": detail[:300]}
        )

    async def on_consultation(self, event: ConsultEvent) -> None:
        if self.consult_events:
            self._consult_event(event.kind, event.digit, event.say_id, event.outcome, event.detail)

    def _consult_event(
        self, kind: str, digit: str = "", say_id: str = "", outcome: str = "", detail: str = ""
    ) -> None:
        fields = {"digit": digit, "say_id": say_id, "outcome": outcome, "detail": detail[:300]}
        body = {k: v for k, v in fields.items() if v}
        self.link.send({"type": "consult.event", "kind": kind, **body})

    async def on_interrupted(self, interruption: str) -> None:
        self.link.send({"type": "media.lost", "interruption": interruption})

    async def on_resumed(self, interruptions: str) -> None:
        self.link.send({"type": "media.restored", "interruptions": interruptions})

    async def on_stop(self) -> None:
        self.link.send({"type": "output.stop"})

    async def on_mark(self, mark: MarkOutcome) -> None:
        rid = self._ids.get(mark.response_id)
        if rid is None:
            return
        self.link.send(
            {
                "type": "mark.outcome",
                "response_id": rid,
                "mark_id": mark.mark_id,
                "outcome": mark.outcome,
            }
        )

    async def on_tool_result(self, result: ToolResult) -> None:
        body = self._tools.result_message(result)
        if body is not None:
            self.link.send(body)

    async def on_end(self, reason: str) -> None:
        self.link.send({"type": "session.end", "reason": reason[:300]})
        self.link.close()
        task = self._task
        if task is not None and not task.done():
            # The link flushes session.end and closes; it is cut if it takes longer.
            asyncio.get_running_loop().call_later(2.0, task.cancel)

    # --- the link's side: messages become requests of the call ---------------------------------

    def check_accept(self, message: Mapping[str, Any]) -> None:
        audio = message["audio"]
        rate = self.settings.agent_rate
        if audio["rate"] != rate or audio["frame_bytes"] != rate // 50 * 2:
            raise ProtocolError(
                "handshake",
                f"audio must be pcm16 at {rate} Hz, 20 ms = {rate // 50 * 2} bytes a frame",
                message["seq"],
            )
        self.consult_events = "consult" in message.get("features", ())
        self._hears_false = "false_interruptions" in message["features"]

    # The link reports from its own task; everything it asks of the call runs on the call's task
    # (STYLE.md habit 5), in the order it arrived.

    def link_up(self, resumed: bool) -> None:
        if resumed or self._restarting:
            self._restarting = False
            self.call.call_soon(self.call.link_restored)

    def restart_message(self) -> dict[str, Any]:
        # A new agent session for the same call: its response and call ids start afresh, so
        # the old ones are forgotten and tool keys take a new epoch (pay-1 now is a new
        # request, not the old one). Results of the old session's calls still arrive.
        self._restarting = True
        self._responses.clear()
        self._ids.clear()
        self._barged = None
        self._tools.restart()
        return self._start(resumed=True)

    def resume_fields(self) -> dict[str, Any]:
        """What ``session.resume`` tells besides the token: the response the drop (or an earlier
        cut) ended and how much of it the caller heard, so an agent that lost its own record
        still knows where the caller is."""
        return {"last_heard": self._last_cut}

    def buffered_ms(self) -> int:
        return self.call.queued_ms

    def link_down(self) -> None:
        self.call.call_soon(self.call.link_lost)

    def link_gone(self, reason: str) -> None:
        self.call.call_soon(lambda: self.call.link_failed(reason))

    def on_message(self, message: Mapping[str, Any]) -> None:
        self.call.call_soon(lambda: self._guarded(self.handle_message, message))

    def on_chunk(self, data: bytes) -> None:
        self.call.call_soon(lambda: self._guarded(self.handle_chunk, data))

    def _guarded(self, handle: Callable[[Any], None], item: Any) -> None:
        """Run on the call's task: a refusal goes back to the agent in band; a bug of ours is
        logged and refused as ``internal``, never raised into the call."""
        if self.link.state == "closed":
            return
        try:
            handle(item)
        except ProtocolError as exc:
            self.link.refuse(exc)
        except Exception:
            log.exception("agent_link.internal_error", extra={"call_id": self.context.call_id})
            self.link.refuse(ProtocolError("internal", "voicegate could not handle it"))

    def handle_message(self, message: Mapping[str, Any]) -> None:
        seq = message["seq"]
        match message["type"]:
            case "response.start":
                rid = message["response_id"]
                if rid in self._responses:
                    raise ProtocolError("response_refused", f"response {rid} was used", seq)
                handle = self.call.respond()
                self._responses[rid] = _Remote(handle)
                self._ids[handle.id] = rid
                if not handle.alive:
                    # Its chunks will be dropped as dead; the agent hears why now.
                    raise ProtocolError(
                        "response_refused", f"no response now ({handle.ended})", seq
                    )
            case "response.done":
                self._remote(message).handle.done()
            case "response.cancel":
                self._remote(message).handle.cancel()
            case "mark":
                self._remote(message).handle.mark(message["mark_id"])
            case "transfer":
                refused = self.call.transfer(
                    message.get("target"),
                    mode=message.get("mode"),
                    complete=message.get("complete"),
                )
                if refused is not None:
                    # Nothing changed: the agent hears why (the target is not repeated).
                    self._transfer_progress("refused", 0, refused)
            case "consult.say":
                say_id = message.get("say_id", "")
                refused = self.call.consult_say(
                    message.get("text"), prompt=message.get("prompt"), say_id=say_id
                )
                if refused is not None:
                    # Not a protocol error (it spends no error budget): nothing changed, and why.
                    self._consult_event("refused", say_id=say_id, detail=refused)
            case "consult.complete":
                if (refused := self.call.consult_complete()) is not None:
                    self._consult_event("refused", detail=refused)
            case "consult.cancel":
                if (refused := self.call.consult_cancel()) is not None:
                    self._consult_event("refused", detail=refused)
            case "tool.call":
                self._tool_call(message)
            case "hangup":
                self.call.hangup(
                    message["reason"], after_playout=message.get("after_playout", True)
                )
            case "session.end":
                self.call.hangup(message["reason"])
            case other:
                raise ProtocolError("unknown_type", f"{other} is not handled here", seq)

    def handle_chunk(self, data: bytes) -> None:
        chunk = self._codec.decode_agent_audio(data)
        remote = self._responses.get(chunk.response_id)
        if remote is None:
            self.metrics.agent_chunks_dropped.labels("unknown_response").inc()
            raise ProtocolError("unknown_response", "audio for a response never started")
        samples = chunk.samples
        if self.call.rate != self.settings.agent_rate and len(samples):
            samples = resample(samples, self.settings.agent_rate, self.call.rate)
        try:
            played = remote.handle.play(samples)
        except PlayoutFull:
            raise ProtocolError(
                "playout_full",
                f"more than {self.settings.playout_max_ms} ms queued; send in real time",
            ) from None
        if not played:
            # A cut, superseded or ended response: never played (the handle counted the frames).
            self.metrics.agent_chunks_dropped.labels("dead_response").inc()

    def _remote(self, message: Mapping[str, Any]) -> _Remote:
        remote = self._responses.get(message["response_id"])
        if remote is None:
            raise ProtocolError("unknown_response", "no such response", message["seq"])
        return remote

    def _tool_call(self, message: Mapping[str, Any]) -> None:
        reply = self._tools.reclaim(message)
        if reply is not None:
            # Reclaim, don't resend (seed 004): the original outcome, or that it is running.
            self.metrics.tool_duplicates_prevented.labels(message["tool"]).inc()
            self.link.send(reply)
            return
        key = self._tools.new_key(message)
        self.call.request_tool(message["tool"], message["arguments"], key=key)


def remote_settings(
    url: str,
    secret: str,
    reconnect_deadline_s: float,
    ping_interval_s: float,
    max_protocol_errors: int,
    agent_rate: int,
    playout_max_s: float,
    ca_file: Path | None = None,
) -> RemoteSettings:
    """The remote agent's settings; :class:`~agents.remote.dial.CaFileError` (naming
    ``agent.ca_file``) if the CA file holds no usable certificate."""
    link = LinkConfig(
        url,
        secret,
        reconnect_deadline_s,
        ping_interval_s,
        max_protocol_errors,
        tls=tls_context(ca_file),
    )
    return RemoteSettings(link, agent_rate, round(playout_max_s * 1000))


__all__ = ["RemoteAgent", "RemoteAgentFactory", "RemoteSettings", "remote_settings"]
