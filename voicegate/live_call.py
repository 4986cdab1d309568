"""One live call: the task that owns it, and the :class:`CallControl` its agent uses.

Everything that happens to a call (SIP events, 20 ms ticks, the agent's requests) goes through this
one task, in order, so the call has one owner (STYLE.md habit 5). How the call ended decides its one
terminal state, which is recorded before anyone else is told.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from agents.base import Agent, AgentFactory, CallContext
from audio.frame import Frame
from session.call_records import CallRecordStore
from telephony import events as ev
from telephony.media_bridge import MediaChannel
from telephony.sip_message import mask_uri
from voicegate.metrics import Metrics

log = logging.getLogger("voicegate.call")

# A playout queue longer than this is an agent bug, not a long prompt.
MAX_PLAYOUT_S = 120
# How long a hang-up waits for queued audio to be heard before it goes ahead anyway.
MAX_HANGUP_WAIT_S = 30.0


class PlayoutFull(RuntimeError):
    pass


class _Tick:
    """Sentinel event: 20 ms have passed; drain caller audio."""


TICK = _Tick()


class CallPhase(enum.Enum):
    RINGING = "ringing"
    ANSWERED = "answered"
    ENDING = "ending"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class EndIntent:
    """What a hang-up *we* start means, recorded when the BYE is confirmed."""

    terminal_state: str
    reason: str
    stage: str | None = None


class CallServices(Protocol):
    """What a live call needs from the process around it."""

    store: CallRecordStore
    metrics: Metrics
    answer_after_s: float

    def submit(self, command: ev.SipCommand) -> None: ...

    def prompt(self, name: str, rate: int) -> NDArray[np.int16]: ...


class LiveCall:
    def __init__(
        self,
        offer: ev.CallOffered,
        services: CallServices,
        agent_factory: AgentFactory,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.offer = offer
        self.call_id = offer.call_id
        self._services = services
        self._agent_factory = agent_factory
        self._wall = wall_clock
        self.events: asyncio.Queue[ev.SipEvent | _Tick] = asyncio.Queue()
        self.phase = CallPhase.RINGING
        self.started_at = wall_clock()
        self.answered_at: float | None = None
        self.codec = ""
        self.channel: MediaChannel | None = None
        self.agent: Agent | None = None
        self._tick_queued = False
        self._frames_in = 0
        self._end_intent: EndIntent | None = None
        self._hangup_pending_since: float | None = None
        self.done = asyncio.Event()

    # --- what /v1/calls shows -------------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        now = self._wall()
        return {
            "call_id": self.call_id,
            "state": self.phase.value,
            "caller": mask_uri(self.offer.remote_uri),
            "called_user": self.offer.called_user,
            "transport": self.offer.transport,
            "codec": self.codec,
            "rate": self.channel.rate if self.channel else None,
            "started_at": self.started_at,
            "answered_at": self.answered_at,
            "duration_s": round(now - self.started_at, 3),
        }

    # --- fed by the runtime ---------------------------------------------------------------------

    def deliver(self, event: ev.SipEvent) -> None:
        self.events.put_nowait(event)

    def tick(self) -> None:
        # At most one tick waits in the queue: a slow call skips ticks instead of piling them up;
        # the inbound ring keeps the audio.
        if not self._tick_queued and self.phase is not CallPhase.ENDED:
            self._tick_queued = True
            self.events.put_nowait(TICK)

    # --- CallControl ----------------------------------------------------------------------------

    @property
    def rate(self) -> int:
        return self.channel.rate if self.channel else 8000

    def play(self, samples: NDArray[np.int16]) -> None:
        channel = self.channel
        if channel is None or self.phase is not CallPhase.ANSWERED:
            return
        pcm = np.ascontiguousarray(samples, dtype="<i2").tobytes()
        size = channel.frame_size
        if len(pcm) % size:
            pcm += bytes(size - len(pcm) % size)
        frames = len(pcm) // size
        if len(channel.outbound) + frames > MAX_PLAYOUT_S * 50:
            raise PlayoutFull(f"call {self.call_id}: playout would exceed {MAX_PLAYOUT_S} s")
        channel.outbound.extend(pcm[i : i + size] for i in range(0, len(pcm), size))

    def play_prompt(self, name: str) -> None:
        self.play(self._services.prompt(name, self.rate))

    def stop_playback(self) -> None:
        if self.channel is not None:
            self.channel.outbound.clear()

    def hangup(self, reason: str, *, after_playout: bool = True) -> None:
        self.end(EndIntent("completed", reason), after_playout=after_playout)

    def end(self, intent: EndIntent, *, after_playout: bool, status: int = 603) -> None:
        """Hang up, recording ``intent`` as the outcome (the first intent given wins).

        With ``after_playout`` the BYE waits (at most :data:`MAX_HANGUP_WAIT_S`) until the queued
        audio has been sent, so a goodbye is heard; a later call without it hangs up at once.
        """
        if self.phase in (CallPhase.ENDING, CallPhase.ENDED):
            return
        if self._end_intent is None:
            self._end_intent = intent
        channel = self.channel
        if after_playout and self.phase is CallPhase.ANSWERED and channel and channel.outbound:
            if self._hangup_pending_since is None:
                self._hangup_pending_since = time.monotonic()
            return
        self.phase = CallPhase.ENDING
        self._services.submit(ev.Hangup(self.call_id, status=status))

    # --- the task -------------------------------------------------------------------------------

    async def run(self) -> None:
        services = self._services
        services.store.offered(
            call_id=self.call_id,
            sip_call_id=self.offer.sip_call_id,
            remote=mask_uri(self.offer.remote_uri),
            called_user=self.offer.called_user,
            transport=self.offer.transport,
            at=self.started_at,
        )
        services.metrics.calls_offered.inc()
        services.metrics.calls_active.inc()
        log.info(
            "call.offered",
            extra={
                "call_id": self.call_id,
                "caller": mask_uri(self.offer.remote_uri),
                "called_user": self.offer.called_user,
                "transport": self.offer.transport,
            },
        )
        # The record is durable before the caller hears anything from us.
        if services.answer_after_s > 0:
            asyncio.get_running_loop().call_later(services.answer_after_s, self._answer)
        else:
            self._answer()
        try:
            while self.phase is not CallPhase.ENDED:
                event = await self.events.get()
                await self._handle(event)
        finally:
            if self.phase is not CallPhase.ENDED:
                # Cancelled (shutdown past its deadline): the call's outcome is still recorded.
                self._finish("canceled", "server stopped before the call ended", "shutdown")
            self.done.set()

    def _answer(self) -> None:
        if self.phase is CallPhase.RINGING and self._end_intent is None:
            self._services.submit(ev.Answer(self.call_id))

    async def _handle(self, event: ev.SipEvent | _Tick) -> None:
        match event:
            case _Tick():
                self._tick_queued = False
                await self._on_tick()
            case ev.MediaReady(codec=codec, channel=channel):
                self.codec = codec
                self.channel = channel
                log.info(
                    "call.media",
                    extra={"call_id": self.call_id, "codec": codec, "rate": channel.rate},
                )
                await self._maybe_start_agent()
            case ev.CallAnswered():
                if self.phase is CallPhase.RINGING:
                    self.phase = CallPhase.ANSWERED
                    self.answered_at = self._wall()
                    self._services.store.answered(self.call_id, self.answered_at)
                    log.info("call.answered", extra={"call_id": self.call_id})
                    await self._maybe_start_agent()
            case ev.DtmfReceived(digit=digit, method=method):
                self._services.metrics.dtmf_digits.labels(method).inc()
                if self.agent is not None and self.phase is CallPhase.ANSWERED:
                    await self.agent.on_dtmf(digit)
            case ev.CallEnded():
                await self._on_ended(event)
            case _:
                log.debug("call.ignored_event", extra={"call_id": self.call_id, "ev": repr(event)})

    async def _maybe_start_agent(self) -> None:
        if self.agent is not None or self.channel is None or self.phase is not CallPhase.ANSWERED:
            return
        context = CallContext(
            call_id=self.call_id,
            called_user=self.offer.called_user,
            caller=mask_uri(self.offer.remote_uri),
            codec=self.codec,
            rate=self.channel.rate,
        )
        self.agent = self._agent_factory(context, self)
        await self.agent.on_start()

    async def _on_tick(self) -> None:
        channel = self.channel
        if channel is None:
            return
        inbound = channel.inbound
        samples_per_frame = channel.frame_size // 2
        while inbound:
            data = inbound.popleft()
            frame = Frame.from_pcm_bytes(data, channel.rate, self._frames_in * samples_per_frame)
            self._frames_in += 1
            if self.agent is not None and self.phase is CallPhase.ANSWERED:
                await self.agent.on_audio(frame)
        if self._hangup_pending_since is not None and self.phase is CallPhase.ANSWERED:
            waited = time.monotonic() - self._hangup_pending_since
            if not channel.outbound or waited > MAX_HANGUP_WAIT_S:
                self._hangup_pending_since = None
                self.phase = CallPhase.ENDING
                self._services.submit(ev.Hangup(self.call_id))

    async def _on_ended(self, ended: ev.CallEnded) -> None:
        if ended.by == "server" and self._end_intent is not None:
            intent = self._end_intent
        elif ended.by == "server":
            intent = EndIntent(
                "failed", f"ended by the server: {ended.status} {ended.reason}", "signaling"
            )
        elif ended.status in (200, 487):
            # 200: the caller's BYE; 487: the caller's CANCEL before we answered.
            if ended.answered:
                intent = EndIntent("completed", "caller hung up")
            else:
                intent = EndIntent("canceled", "caller hung up before answer")
        else:
            # PJSIP ended the dialog itself (no ACK, transport error, ...).
            intent = EndIntent(
                "failed", f"dialog failed: {ended.status} {ended.reason}", "signaling"
            )
        self._finish(intent.terminal_state, intent.reason, intent.stage)
        if self.agent is not None:
            try:
                await self.agent.on_end(intent.reason)
            except Exception:
                log.exception("agent.on_end failed", extra={"call_id": self.call_id})

    def _finish(self, terminal_state: str, reason: str, stage: str | None) -> None:
        services = self._services
        self.phase = CallPhase.ENDED
        recorded = services.store.ended(
            self.call_id,
            at=self._wall(),
            terminal_state=terminal_state,
            reason=reason,
            stage=stage,
        )
        services.metrics.calls_active.dec()
        if recorded:
            services.metrics.calls.labels(terminal_state).inc()
        if self.channel is not None:
            services.metrics.media_frames.labels("in").inc(self.channel.rx_frames)
            services.metrics.media_frames.labels("out").inc(self.channel.tx_audio_frames)
            services.metrics.playout_underruns.inc(self.channel.tx_underruns)
            self.channel.outbound.clear()
        log.info(
            "call.ended",
            extra={
                "call_id": self.call_id,
                "terminal_state": terminal_state,
                "reason": reason,
                "stage": stage,
            },
        )
