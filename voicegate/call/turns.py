"""The caller's turns: caller audio through VAD to the agent, barge-in, and DTMF turns.

Caller speech is a turn once its segment holds ``audio.turn_min_speech_ms`` of speech (a shorter
burst is never a turn), committed when it stops; a key press is a whole turn at once. Speech or a
key over the agent's response cuts it (audio/barge_in.py). A speech cut is then judged (issue 21):
``confirmed`` once a caller turn is committed, ``false`` when ``audio.barge_in_false_window_ms``
pass on the caller's audio clock without one (and no turn is still being spoken); the agent is
told of a false one with what had been heard, so that it can pick up where it was cut.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from audio.barge_in import BargeIn, latency_ms, onset_ns
from audio.inbound import AgentAudio, InboundPipeline
from audio.vad import SpeechStarted, SpeechStopped, VadEvent
from session import events as sev
from telephony.media_bridge import MediaChannel
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.hangup import HangingUp
from voicegate.call.responses import Responses
from voicegate.call.services import CallServices

log = logging.getLogger("voicegate.call")


@dataclass(slots=True)
class _Cut:
    """A speech barge-in not yet judged: the response it cut, what had been heard of it, and the
    inbound sample index by which a caller turn must be committed."""

    response_id: str
    heard_ms: int
    deadline: int
    committed: bool = False


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
        # With the C port's detector: the channel its records count from, the frames counted
        # before that channel's first, and the agent's frames.
        self._detected: MediaChannel | None = None
        self._base = 0
        self._agent_audio: AgentAudio | None = None
        self._rec_overflow = 0
        # Set when the agent starts: whether it wants the caller's audio at all.
        self.agent_takes_audio = False
        self._speech_turn: str | None = None
        self._speech_onset_ms = 0.0
        self._in_segment = False
        self._cut: _Cut | None = None
        # True while the agent handles a key press: a tool request made then is approved by it.
        self.in_dtmf = False

    @property
    def barge_in_near(self) -> bool:
        """Caller speech may be starting over a response it could cut: the next frames decide a
        barge-in, so the runtime takes them at ``audio.barge_in_tick_ms``."""
        pipeline, channel = self._inbound, self._state.channel
        if channel is None:
            return False
        stirring = channel.stirring if channel.detecting else pipeline and pipeline.vad.stirring
        return bool(stirring) and self._barge.armed(channel.playout.playing)

    async def drain_inbound(self, channel: MediaChannel) -> None:
        """Caller audio: VAD and barge-in at the call's rate, then the agent's frames."""
        if channel.detecting:
            await self._drain_detected(channel)
            return
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
            now_ts = timestamp + samples_per_frame
            if decision is not None and decision.response_id == self._responses.response_id:
                self._barge_in("speech", decision.onset_timestamp, now_ts)
            await self._on_vad(result.vad_event, result.speech_ms)
            if self._cut is not None:
                await self._judge(now_ts)
            if state.agent is not None and result.frame_for_agent is not None:
                await state.agent.on_audio(result.frame_for_agent)

    async def _drain_detected(self, channel: MediaChannel) -> None:
        """:meth:`drain_inbound` when the C port ran the evidence detector on the clock thread:
        the same steps, taken only on the frames its records name (a speech start or stop, and
        where the segment's speech reaches the barge-in or turn threshold) and, for an agent
        that takes audio, on every frame. On the frames between, the per-frame steps would
        change nothing but the clock a pending cut is judged by, and that is judged here."""
        state = self._state
        channel.wants_pcm = self.agent_takes_audio
        if channel is not self._detected:
            if self._detected is not None and (self._in_segment or self._speech_turn):
                # The caller's media moved to a new port, whose detector starts afresh: the
                # segment under way on the old one ends here (its stop would never come).
                at = self._frames_in * (channel.frame_size // 2)
                stop = SpeechStopped(at, channel.rate, at)
                self._barge.on_frame(stop, 0, channel.playout.playing)
                await self._on_vad(stop, 0)
            self._detected = channel
            self._base = self._frames_in
            # Within a segment barge-in and caller turns act only where its speech reaches
            # their thresholds (BargeIn.on_frame, _on_vad): the frames in between change nothing.
            barge = self._barge.config
            channel.record_speech_at((barge.min_speech_ms, barge.turn_min_speech_ms))
        if channel.rec_overflow != self._rec_overflow:
            self._rec_overflow = channel.rec_overflow
            # asyncio fell more than 512 records behind: some speech starts or stops are lost.
            log.warning(
                "call.detector_records_lost",
                extra={"call_id": state.call_id, "lost": channel.rec_overflow},
            )
        timing = channel.take_timing()
        if timing:
            self._services.metrics.frame_pipeline.add(timing[:-1], timing[-1] / 1e9)
        records, channel.records = channel.records, []
        frames = list(channel.inbound)
        channel.inbound.clear()
        base = self._base
        end = base + channel.rx_frames
        previous = self._frames_in - 1
        self._frames_in = end
        if state.media_released or state.agent is None or state.phase is not CallPhase.ANSWERED:
            return
        spf = channel.frame_size // 2
        first_pcm = end - len(frames)
        i, n = 0, len(records)
        pcm_at = 0
        while True:
            # The next frame to visit: the next record's or the next agent frame's, whichever
            # comes first.
            g_rec = base + records[i] if i < n else end
            g_pcm = first_pcm + pcm_at if pcm_at < len(frames) else end
            g = min(g_rec, g_pcm)
            cut = self._cut
            if cut is not None and previous + 1 < g and (cut.committed or g * spf >= cut.deadline):
                # Settled on the first frame between records, as the per-frame loop did (a
                # key press commits a cut between frames), or when its window ends there.
                await self._judge((previous + 2) * spf if cut.committed else g * spf)
            if g >= end:
                return
            kind = speech_ms = 0
            event_ts = 0
            if g == g_rec:
                kind, event_ts, speech_ms = records[i + 1], records[i + 2], records[i + 3]
                i += 4
            pcm = None
            if g == g_pcm:
                pcm = frames[pcm_at]
                pcm_at += 1
            await self._visit(channel, g * spf, kind, base * spf + event_ts, speech_ms, pcm)
            previous = g

    async def _visit(
        self,
        channel: MediaChannel,
        timestamp: int,
        kind: int,
        event_ts: int,
        speech_ms: int,
        pcm: bytes | None,
    ) -> None:
        """One caller frame the detector's record (or the agent) needs acting on."""
        now_ts = timestamp + channel.frame_size // 2
        event: VadEvent | None = None
        if kind == 1:
            event = SpeechStarted(event_ts, channel.rate, now_ts)
        elif kind == 2:
            event = SpeechStopped(event_ts, channel.rate, now_ts)
        decision = self._barge.on_frame(event, speech_ms, channel.playout.playing)
        if decision is not None and decision.response_id == self._responses.response_id:
            self._barge_in("speech", decision.onset_timestamp, now_ts)
        await self._on_vad(event, speech_ms)
        if self._cut is not None:
            await self._judge(now_ts)
        agent = self._state.agent
        if pcm is not None and agent is not None:
            audio = self._agent_audio
            if audio is None or audio.call_rate != channel.rate:
                audio = self._agent_audio = AgentAudio(channel.rate, self._agent_rate)
            await agent.on_audio(audio.frame(pcm, timestamp))

    def _barge_in(self, reason: str, onset: int, detected_at: int) -> None:
        channel = self._state.channel
        assert channel is not None
        detected_ns = time.monotonic_ns()
        response_id = self._responses.response_id or ""
        heard = self._responses.interrupt()
        if heard is None:
            return
        metrics = self._services.metrics
        if reason == "speech":
            started = onset_ns(detected_ns, onset, detected_at, channel.rate)
            latency = latency_ms(started, channel.playout.last_audio_pull_ns)
            metrics.barge_in_latency.observe(latency / 1000)
            window = self._barge.config.false_window_ms * channel.rate // 1000
            self._cut = _Cut(response_id, heard, detected_at + window)
        else:
            # A key press is a committed caller turn at once: never a false interruption.
            metrics.barge_ins.labels(reason, "confirmed").inc()
        log.info(
            "call.barge_in",
            extra={"call_id": self._state.call_id, "reason": reason, "heard_ms": heard},
        )

    async def _on_vad(self, event: SpeechStarted | SpeechStopped | None, speech_ms: int) -> None:
        """A speech segment becomes a caller turn once it holds ``turn_min_speech_ms`` of speech
        (dated from its onset), and is committed when it stops; a shorter one is dropped."""
        agent = self._state.agent
        if agent is None:
            return
        if isinstance(event, SpeechStarted):
            self._in_segment = True
            self._speech_onset_ms = event.timestamp_ms
        if (
            self._in_segment
            and self._speech_turn is None
            and speech_ms >= self._barge.config.turn_min_speech_ms
        ):
            self._in_segment = False
            self._turns += 1
            turn_id = self._state.next_id("t", self._turns)
            if self._steps.try_apply(sev.TurnStarted(turn_id)):
                self._speech_turn = turn_id
                await agent.on_speech_started()
        if isinstance(event, SpeechStopped):
            self._in_segment = False
            if self._speech_turn is not None:
                turn_id, self._speech_turn = self._speech_turn, None
                if self._steps.try_apply(sev.TurnCommitted(turn_id)):
                    if self._cut is not None:
                        self._cut.committed = True
                    await agent.on_speech_turn(round(event.timestamp_ms - self._speech_onset_ms))

    async def _judge(self, now_ts: int) -> None:
        """Settle the pending speech cut: confirmed by a committed turn, false past its window
        with no turn committed or being spoken."""
        cut = self._cut
        assert cut is not None
        if cut.committed:
            outcome = "confirmed"
        elif now_ts >= cut.deadline and self._speech_turn is None:
            outcome = "false"
        else:
            return
        self._cut = None
        self._services.metrics.barge_ins.labels("speech", outcome).inc()
        self._steps.try_apply(sev.BargeInJudged(cut.response_id, outcome, cut.heard_ms))
        log.info(
            "call.barge_in_judged",
            extra={"call_id": self._state.call_id, "outcome": outcome, "heard_ms": cut.heard_ms},
        )
        agent = self._state.agent
        if outcome == "false" and agent is not None and self._hangup.plan is None:
            await agent.on_false_interruption(cut.heard_ms)

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
        self._in_segment = False
        if self._cut is not None:
            # The key press is the caller's committed turn: the speech cut before it was real.
            self._cut.committed = True
        # A key press is a whole caller turn: started and committed at once.
        self._turns += 1
        turn_id = self._state.next_id("t", self._turns)
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
