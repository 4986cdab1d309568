"""The caller's turns: caller audio through VAD to the agent, barge-in, and DTMF turns.

Caller speech is a turn started at its onset and committed when it stops; a key press is a
whole turn at once. Speech or a key over the agent's response cuts it (audio/barge_in.py).
"""

from __future__ import annotations

import logging
import time

from audio.barge_in import BargeIn, latency_ms, onset_ns
from audio.inbound import InboundPipeline
from audio.vad import SpeechStarted, SpeechStopped
from session import events as sev
from telephony.media_bridge import MediaChannel
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.hangup import HangingUp
from voicegate.call.responses import Responses
from voicegate.call.services import CallServices

log = logging.getLogger("voicegate.call")


class CallerTurns:
    def __init__(
        self,
        state: CallState,
        services: CallServices,
        steps: SessionSteps,
        responses: Responses,
        hangup: HangingUp,
    ) -> None:
        self._state = state
        self._services = services
        self._steps = steps
        self._responses = responses
        self._hangup = hangup
        self._turns = 0
        self._frames_in = 0
        agent_rate, vad, barge = services.audio_settings()
        self._agent_rate = agent_rate
        self._vad_config = vad
        self._barge = BargeIn(barge)
        self._inbound: InboundPipeline | None = None
        # Set when the agent starts: whether it wants the caller's audio at all.
        self.agent_takes_audio = False
        self._speech_turn: str | None = None
        self._speech_onset_ms = 0.0
        # True while the agent handles a key press: a tool request made then is approved by it.
        self.in_dtmf = False

    async def drain_inbound(self, channel: MediaChannel) -> None:
        """Caller audio: VAD and barge-in at the call's rate, then the agent's frames."""
        inbound = channel.inbound
        if not inbound:
            return
        state = self._state
        if state.media_released:
            inbound.clear()
            return
        pipeline = self._inbound
        if pipeline is None or pipeline.call_rate != channel.rate:
            pipeline = self._inbound = InboundPipeline(
                channel.rate, self._agent_rate, self._vad_config
            )
        metrics = self._services.metrics
        samples_per_frame = channel.frame_size // 2
        answered = state.agent is not None and state.phase is CallPhase.ANSWERED
        while inbound:
            data = inbound.popleft()
            timestamp = self._frames_in * samples_per_frame
            self._frames_in += 1
            spent = pipeline.total_ns
            result = pipeline.process(data, timestamp, for_agent=self.agent_takes_audio)
            metrics.frame_pipeline.observe((pipeline.total_ns - spent) / 1e9)
            if not answered:
                continue
            decision = self._barge.on_frame(
                result.vad_event, result.speech_ms, channel.playout.playing
            )
            if decision is not None and decision.response_id == self._responses.response_id:
                self._barge_in("speech", decision.onset_timestamp, timestamp + samples_per_frame)
            await self._on_vad(result.vad_event)
            if state.agent is not None and result.frame_for_agent is not None:
                await state.agent.on_audio(result.frame_for_agent)

    def _barge_in(self, reason: str, onset: int, detected_at: int) -> None:
        channel = self._state.channel
        assert channel is not None
        detected_ns = time.monotonic_ns()
        heard = self._responses.interrupt()
        if heard is None:
            return
        metrics = self._services.metrics
        metrics.barge_ins.labels(reason).inc()
        if reason == "speech":
            started = onset_ns(detected_ns, onset, detected_at, channel.rate)
            latency = latency_ms(started, channel.playout.last_audio_pull_ns)
            metrics.barge_in_latency.observe(latency / 1000)
        log.info(
            "call.barge_in",
            extra={"call_id": self._state.call_id, "reason": reason, "heard_ms": heard},
        )

    async def _on_vad(self, event: SpeechStarted | SpeechStopped | None) -> None:
        """Caller speech is a caller turn: started at onset, committed when it stops."""
        agent = self._state.agent
        if event is None or agent is None:
            return
        if isinstance(event, SpeechStarted):
            self._turns += 1
            turn_id = f"t{self._turns}"
            if self._steps.try_apply(sev.TurnStarted(turn_id)):
                self._speech_turn = turn_id
            self._speech_onset_ms = event.timestamp_ms
            await agent.on_speech_started()
        elif self._speech_turn is not None:
            turn_id, self._speech_turn = self._speech_turn, None
            if self._steps.try_apply(sev.TurnCommitted(turn_id)):
                await agent.on_speech_turn(round(event.timestamp_ms - self._speech_onset_ms))

    async def on_dtmf(self, digit: str) -> None:
        state = self._state
        agent = state.agent
        if agent is None or state.phase is not CallPhase.ANSWERED or self._hangup.plan is not None:
            return
        channel = state.channel
        if channel is not None:
            # DTMF barge-in (audio.barge_in_dtmf): the key cuts the response before the agent
            # even sees it.
            now_ts = self._frames_in * (channel.frame_size // 2)
            decision = self._barge.on_dtmf(now_ts, channel.playout.playing)
            if decision is not None and decision.response_id == self._responses.response_id:
                self._barge_in("dtmf", decision.onset_timestamp, decision.onset_timestamp)
        if self._speech_turn is not None:
            # The caller pressed a key: whatever they were saying is a finished turn.
            speech_turn, self._speech_turn = self._speech_turn, None
            self._steps.try_apply(sev.TurnCommitted(speech_turn))
        # A key press is a whole caller turn: started and committed at once.
        self._turns += 1
        turn_id = f"t{self._turns}"
        if not self._steps.try_apply(sev.TurnStarted(turn_id)):
            return
        faults = self._services.faults
        faults.reached("before_turn_commit")
        self._steps.apply(sev.TurnCommitted(turn_id))
        faults.reached("after_turn_commit")
        self.in_dtmf = True
        try:
            await agent.on_dtmf(digit)
        finally:
            self.in_dtmf = False
