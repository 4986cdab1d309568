"""One live call: the task that owns it, its durable session, and the agent's :class:`CallControl`.

Everything that happens to a call (SIP events, media ticks, timers, the agent's requests) goes
through this one task, in order (STYLE.md habit 5). Each becomes a session event: the session
machine decides, the store makes the step durable, and only then does this module carry out the
effects (clear playout, say a prompt, hang up, arm a timer).

The task composes the parts of the call, each in its own module: the session steps and the
effects waiting for their write (acting.py), the actions effects map onto (actions.py), SIP
events as session events (sip_events.py), the caller's turns and barge-in (turns.py), responses
and the session's prompts (responses.py), the hang-up (hangup.py), the session's timers
(timers.py), what the agent may call (control.py) and what it is told (notices.py).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future

from agents.base import Agent, AgentFactory, CallContext, MarkOutcome, takes_audio
from audio.playout import MarkCleared, MarkHeard, Playout, ResponseDrained
from session import events as sev
from session.durable import DurableSession
from session.machine import RETRY
from session.state import SessionState, Signaling
from session.store import LeaseLost, SessionStore, StoreError
from telephony import events as ev
from telephony.media_bridge import MediaChannel
from telephony.sip_message import mask_uri
from voicegate.call.acting import Persisted, SessionSteps
from voicegate.call.actions import CallActions
from voicegate.call.agent_guard import AgentCrashed, make_agent
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.callback_match import CALLER_KEY
from voicegate.call.clock import SessionClock
from voicegate.call.consult_speech import ConsultSpeech
from voicegate.call.control import AgentControl, AgentWork, ResumeCodeReady
from voicegate.call.hangup import HangingUp, HangupPlan
from voicegate.call.hold import HoldAudio
from voicegate.call.legs import OutboundLeg, unanswered_outcome
from voicegate.call.notices import AgentNotice, AgentNotices
from voicegate.call.rejoin import Verdict
from voicegate.call.responses import Responses
from voicegate.call.resume import CallResume
from voicegate.call.services import CallServices
from voicegate.call.sip_events import SipEvents
from voicegate.call.timers import SessionTimers, TimerFired
from voicegate.call.transfer import HANDOFF_TIMER, CallTransfer
from voicegate.call.turns import CallerTurns
from voicegate.tools.call_tools import CallTools, ToolDone, ToolRefused

# The names other layers use (voicegate/runtime.py, tests) stay importable from here.
__all__ = ["CallPhase", "CallServices", "HangupPlan", "LiveCall"]

log = logging.getLogger("voicegate.call")


class _Tick:
    """A media tick (``audio.tick_ms``): drain caller audio, notice drained playout."""


TICK = _Tick()


class LiveCall:
    def __init__(
        self,
        offer: ev.CallOffered,
        services: CallServices,
        agent_factory: AgentFactory,
        clock: SessionClock,
        outbound: OutboundLeg | None = None,
        rejoin: Verdict | None = None,
    ) -> None:
        self.offer = offer
        self.call_id = offer.call_id
        self.outbound = outbound
        # A caller back with the session's handle (voicegate/call/rejoin.py): the session was
        # taken over already, and ``offer.call_id`` is its id.
        self.rejoin = rejoin
        # Set by the runtime when the call was answered before its task started (a callback's
        # offer): its CallAnswered and MediaReady are in the queue already.
        self.answered_early = False
        self._last_touch: Future[LeaseLost | None] | None = None
        self._halt_status = 603  # the final answer to an unanswered INVITE when halted
        self._services = services
        self._agent_factory = agent_factory
        self._clock = clock
        self.events: asyncio.Queue[object] = asyncio.Queue()
        self._state = state = CallState(
            self.call_id, tenant=offer.tenant, outbound=outbound is not None
        )
        self.started_at = clock.now()
        self.answered_at: float | None = None
        self.codec = ""
        self.codec_rate: int | None = None
        self.done = asyncio.Event()
        # Set once the session's first event is durable (or the call is over without it).
        self.session_started = asyncio.Event()
        self._tick_queued = False
        self._stale_seen = 0
        self._stale_played_seen = 0
        post = self.events.put_nowait
        self._steps = steps = SessionSteps(
            state, services, clock, post=post, on_halt=self._stop_acting
        )
        self.tools = CallTools(
            self.call_id,
            services,
            apply=steps.apply,
            post=post,
            current_turn=state.current_turn,
            find_outstanding=state.outstanding,
            durable=lambda: steps.last_write,
            wall=clock.wall,
            in_task=steps.when_done,
        )
        self._timers = SessionTimers(clock, post)
        self._responses = Responses(
            state, services, steps, may_play=lambda: self._hangup.plan is None, post=post
        )
        steps.before_cut = self._responses.cut_for_session
        self._hangup = HangingUp(state, services, steps)
        self._turns = CallerTurns(state, services, steps, self._responses, self._hangup)
        self._sip = SipEvents(state, services, steps, self._responses, self._hangup)
        self._notices = AgentNotices(state, self.tools, post)
        self.resume = CallResume(state, services, steps, clock)
        self.transfer = CallTransfer(
            state, services, steps, self._hangup, self._timers, clock, self.resume
        )
        self.transfer.tell = self._notices.tell
        self.transfer.bridge.notify = self._notices.tell
        self._consult_speech = ConsultSpeech(post)
        self.transfer.bridge.synthesize = self._consult_speech.synthesize
        self.control = AgentControl(
            state,
            services,
            self._responses,
            self._hangup,
            self._turns,
            self.tools,
            self.transfer,
            steps,
            post,
        )
        actions = CallActions(
            state,
            services,
            clock,
            responses=self._responses,
            hangup=self._hangup,
            timers=self._timers,
            tools=self.tools,
            notices=self._notices,
            prompt_for=self.transfer.prompt,
        )
        self._hold = HoldAudio(state, self._responses)
        actions.on_said = self._hold.said
        steps.attach(actions)

    @property
    def tenant(self) -> str:
        return self.offer.tenant

    @property
    def phase(self) -> CallPhase:
        return self._state.phase

    @property
    def channel(self) -> MediaChannel | None:
        return self._state.channel

    @property
    def session(self) -> DurableSession | None:
        return self._state.session

    @property
    def agent(self) -> Agent | None:
        return self._state.agent

    @property
    def last_write(self) -> Future[None] | None:
        return self._steps.last_write

    # --- what /v1/calls shows -------------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        now = self._clock.now()
        channel = self.channel
        return {
            "call_id": self.call_id,
            "state": self.phase.value,
            "session_status": self.session.state.status() if self.session else None,
            "caller": mask_uri(self.offer.remote_uri),
            "called_user": self.offer.called_user,
            "tenant": self.offer.tenant,
            "transport": self.offer.transport,
            "codec": self.codec,
            "codec_rate": self.codec_rate,
            "media": self._sip.media_health,
            "rate": channel.rate if channel else None,
            # Frames the media port moved: 50 a second each way while the media clock keeps up.
            "frames_in": channel.rx_frames if channel else None,
            "frames_out": channel.playout.pulls if channel else None,
            "started_at": self.started_at,
            "answered_at": self.answered_at,
            "duration_s": round(now - self.started_at, 3),
            # An attended transfer's consultation: ringing, briefing, waiting (for the go-ahead),
            # handing_over or over; None without one (voicegate/call/consult.py).
            "consult": self.transfer.consult_stage(),
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

    def touch(self) -> None:
        """Heartbeat: tell the store this session's owner is alive (the reaper's signal)."""
        session = self.session
        if session is None or session.lease is None or session.state.terminal:
            return
        if self._steps.halted is not None:
            return
        lease, at = session.lease, self._clock.wall()

        def touch(store: SessionStore) -> LeaseLost | None:
            if store.touch(self.call_id, lease=lease, at=at):
                return None
            # Refused while the session is open here: another process took it over.
            held = store.get(self.call_id)
            return LeaseLost(self.call_id, lease, held.owner, held.lease_epoch) if held else None

        done = self._services.writer.submit(touch)
        self._last_touch = done
        done.add_done_callback(lambda f: self._steps.from_writer(self._touched, f))

    def _touched(self, done: Future[LeaseLost | None]) -> None:
        lost = None if done.exception() else done.result()
        if lost is not None:
            self._steps.lose_lease(lost)

    def resume_reused(self) -> None:
        """A used handle of this session came back: possibly stolen, so writes freeze until
        reconciled (session/away.py)."""
        self._steps.try_apply(sev.ResumeReused())

    @property
    def waiting_on_store(self) -> bool:
        """A step or the heartbeat of this call waits for the session store
        (voicegate/call/store_outage.py)."""
        touching = self._last_touch is not None and not self._last_touch.done()
        return (self._steps.waiting_on_store or touching) and self._steps.halted is None

    def give_up_on_store(self, why: StoreError) -> None:
        """Stop acting for the session: the store could not record its steps in time. A call
        not answered yet is refused with 503, so a front door tries another worker."""
        if self.phase is not CallPhase.ANSWERED:
            self._halt_status = 503
        self._steps.give_up(why)

    def stop_playback(self) -> None:
        """Cut the response being played (the runtime's shutdown notice goes next)."""
        self._responses.interrupt(reason="ending")

    def announce(self, prompt: str) -> float:
        """Play a system notice (not an agent response, so not subject to barge-in); returns
        its length in seconds (0 when the call has no audio to play it on)."""
        self._responses.say(prompt)
        channel = self._state.channel
        if channel is None or self.phase is not CallPhase.ANSWERED:
            return 0.0
        return len(self._services.prompt(prompt, channel.rate)) / channel.rate

    @property
    def answered(self) -> bool:
        return self.phase is CallPhase.ANSWERED

    def end(self, plan: HangupPlan, *, after_playout: bool, status: int = 603) -> None:
        """Hang up, recording ``plan`` as the session's outcome (the first plan given wins).

        With ``after_playout`` the BYE waits (at most
        :data:`~voicegate.call.hangup.MAX_HANGUP_WAIT_S`) until the queued audio has been sent,
        so a goodbye is heard; a later call without it hangs up at once.
        """
        self._hangup.end(plan, after_playout=after_playout, status=status)

    def _stop_acting(self) -> None:
        # The session halted (acting.py): timers and tool requests stop, and the dialog ends here
        # without a session event.
        self._timers.cancel_all()
        self.tools.cancel()
        if self.phase not in (CallPhase.ENDING, CallPhase.ENDED):
            self._state.phase = CallPhase.ENDING
            self._services.submit(ev.Hangup(self.call_id, status=self._halt_status))

    # --- the task -------------------------------------------------------------------------------

    async def run(self) -> None:
        if self.rejoin is not None:
            self._start_rejoined(self.rejoin)
        else:
            await self._start_session()
        services = self._services
        # The session is durable before the caller hears anything from us.
        await self._steps.settled()
        self.session_started.set()
        if self.outbound is not None:
            leg = self.outbound
            # A followed REFER's call is on its way already (pjsua's INVITE, telephony.refer).
            placing = self._hangup.plan is None and self.phase is CallPhase.RINGING
            if placing and not leg.referred_by:
                services.submit(
                    ev.Dial(
                        self.call_id,
                        leg.target,
                        leg.headers,
                        caller_id=leg.caller_id,
                        tenant=self.offer.tenant,
                    )
                )
        elif self.answered_early:
            pass  # answered while a callback was offered (voicegate/call/callbacks.py)
        elif services.answer_after_s > 0:
            asyncio.get_running_loop().call_later(services.answer_after_s, self._answer)
        else:
            self._answer()
        try:
            while self.phase is not CallPhase.ENDED:
                item = await self.events.get()
                try:
                    await self._handle(item)
                except AgentCrashed as crash:
                    self._agent_failed(crash)
                except StoreError:
                    # A lost lease or a failed write was handled where it was found (_halt):
                    # the call is hanging up, and this loop waits for the dialog's end.
                    if self._steps.halted is None:
                        raise
            await self._steps.settled()
        finally:
            self._timers.cancel_all()
            self.tools.cancel()
            self._consult_speech.cancel_all()
            if self.phase is not CallPhase.ENDED:
                # Cancelled (shutdown past its deadline): the outcome is still recorded.
                self._finish_without_dialog("server stopped before the call ended")
            self.session_started.set()
            self.done.set()

    def _start_rejoined(self, rejoin: Verdict) -> None:
        """The session taken over for this call: record the rejoin (its next signaling
        generation); the session reconciles before anything new runs (session/away.py)."""
        session = rejoin.session
        assert session is not None and session.lease is not None
        self._state.session = session
        # What the session settled before: asking for one of those keys is a duplicate.
        self.tools.remember(rejoin.results)
        generation = session.state.signaling_generation + 1
        via = self.offer.resume.via if self.offer.resume else ""
        caller = mask_uri(self.offer.remote_uri)
        if rejoin.callback:
            # Back after a drop (session/callback.py): by number and key press, not by handle.
            via = "callback"
            self._steps.apply(sev.CalledBack(generation, caller, rejoin.with_code))
        else:
            self._steps.apply(sev.CallRejoined(generation, caller, via))
        self.resume.current = rejoin.successor
        self._services.metrics.calls_offered.inc()
        self._services.metrics.calls_active.inc()
        log.info(
            "call.rejoined",
            extra={
                "call_id": self.call_id,
                "generation": generation,
                "via": via,
                "epoch": session.lease.epoch,
                "caller": mask_uri(self.offer.remote_uri),
            },
        )

    async def _start_session(self) -> None:
        services = self._services
        caller = mask_uri(self.offer.remote_uri)
        caller_key = services.caller_key(self.offer) if self.outbound is None else ""
        meta: dict[str, object] = {
            # An outbound leg's remote party is the one called (voicegate/call/legs.py).
            ("callee" if self.outbound else "caller"): caller,
            "called_user": self.offer.called_user,
            "transport": self.offer.transport,
            "sip_call_id": self.offer.sip_call_id,
            # A call transferred in: the centre's User-to-User and X- headers, bounded and
            # validated on the SIP thread (telephony.inbound_context).
            **self.offer.context,
        }
        if caller_key:
            # Matches a callback after a drop (voicegate/call/callback_match.py): a keyed digest.
            meta[CALLER_KEY] = caller_key
        tenant = self.offer.tenant
        offered: sev.Event = sev.CallOffered(
            caller=caller, called_user=self.offer.called_user, policy=services.policy(tenant)
        )
        if self.outbound is not None:
            meta["direction"] = "outbound"
            if self.outbound.referred_by:
                meta["referred_by"] = self.outbound.referred_by  # RFC 3515: a referenced call
            offered = sev.CallPlaced(caller, self.outbound.ring_timeout_s, services.policy(tenant))
        call_id, owner, at = self.call_id, services.owner, self.started_at
        lease = await asyncio.wrap_future(
            services.writer.submit(
                lambda store: store.create(call_id, owner=owner, meta=meta, at=at, tenant=tenant)
            )
        )
        self._state.session = DurableSession(None, SessionState(call_id), lease)
        self._steps.apply(offered)
        services.metrics.calls_offered.inc()
        services.metrics.calls_active.inc()
        # Context values stay out of the log (a centre may put anything in an X- header): their
        # names say enough there; the session's metadata has them.
        # The caller's digest says nothing to a reader either.
        hidden = ("context", "context_dropped", CALLER_KEY)
        said = {k: v for k, v in meta.items() if k not in hidden}
        context = self.offer.context.get("context")
        if isinstance(context, dict) and context:
            said["context_headers"] = sorted(context)
        log.info("call.offered", extra={"call_id": self.call_id, **said})
        self.resume.issue("start", lambda _handle: None)

    def _agent_failed(self, crash: AgentCrashed) -> None:
        """The agent raised: the session ends failed at stage agent and the caller is told; the
        agent hears nothing more but its on_end."""
        log.error(
            "agent.failed",
            extra={"call_id": self.call_id, "method": crash.method},
            exc_info=crash.error,
        )
        self._services.metrics.agent_failures.labels(crash.method).inc()
        self._steps.try_apply(sev.AgentFailed(str(crash)))

    def _answer(self) -> None:
        if self.phase is CallPhase.RINGING and self._hangup.plan is None:
            self._services.submit(ev.Answer(self.call_id))

    async def _handle(self, item: object) -> None:
        steps = self._steps
        if self.transfer.bridge.owns(getattr(item, "call_id", self.call_id)):
            self.transfer.bridge.on_leg_event(item)  # the leg of a bridged transfer
            return
        match item:
            case _Tick():
                self._tick_queued = False
                await self._on_tick()
            case TimerFired(name=name, generation=gen, attempt=attempt):
                self._timers.fired(name)
                if name == HANDOFF_TIMER:
                    self.transfer.handoff_timed_out()
                elif name == RETRY:
                    steps.try_apply(sev.RecoveryRetryDue(gen, attempt))
                else:
                    was = self._transferring()
                    steps.try_apply(sev.DeadlineFired(name, gen))
                    self.transfer.guard_fired(was)
            case ev.MediaReady(codec=codec, codec_rate=codec_rate, channel=channel):
                self.codec = codec
                self.codec_rate = codec_rate
                self._state.channel = channel
                # A new media channel starts at generation 0: bring it to the session's, so
                # nothing older can be admitted. (A re-INVITE that changes the codec keeps the
                # channel: it runs at the bridge's rate, not the codec's.)
                state = self._state.session_state
                if state is not None and channel.playout.generation < state.playback_generation:
                    channel.playout.interrupt(state.playback_generation)
                log.info(
                    "call.media",
                    extra={
                        "call_id": self.call_id,
                        "codec": codec,
                        "codec_rate": codec_rate,
                        "rate": channel.rate,
                    },
                )
                await self._maybe_start_agent()
            case ev.CallAnswered():
                if self.phase is CallPhase.RINGING and steps.try_apply(sev.CallAnswered()):
                    self._state.phase = CallPhase.ANSWERED
                    self.answered_at = self._clock.now()
                    log.info("call.answered", extra={"call_id": self.call_id})
                    if self.outbound is not None:
                        self._services.metrics.outbound_calls.labels("answered").inc()
                    await self._maybe_start_agent()
            case ev.DtmfReceived(digit=digit, method=method):
                self._services.metrics.dtmf_digits.labels(method).inc()
                await self._turns.on_dtmf(digit)
            case ev.CallEnded():
                self.transfer.caller_left(self._transferring() and item.by == "caller")
                self._sip.ended(item)
                self._finish(item.status)
                # Marks the end cut are reported cleared before the agent hears of the end.
                if self.channel is not None:
                    await self._playback_events(self.channel.playout)
                await self._notices.call_ended()
            case MarkOutcome():
                await self._notices.mark(item)
            case ToolDone():
                await self._notices.tool_done(item)
            case ev.MediaHealthChanged(health=health):
                self._sip.media_health_changed(health)
            case ev.ReinviteStarted():
                self._sip.reinvite_started()
            case ev.ReinviteFinished(ok=ok):
                self._sip.reinvite_finished(ok)
            case ev.TransferStatus():
                self.transfer.status(item)
            case ev.InboundRefer(status=status, target=target):
                followed = status < 300
                self._services.metrics.inbound_refers.labels(
                    "followed" if followed else "refused"
                ).inc()
                log.info(
                    "call.inbound_refer",
                    extra={"call_id": self.call_id, "status": status, "target": target},
                )
            case ev.DialogProbed():
                self._sip.dialog_probed(item)
            case AgentNotice():
                await self._notices.deliver(item)
            case Persisted(then=then, done=done):
                then(done)
            case ToolRefused(result=result):
                await self._notices.tool_result(result)
            case ResumeCodeReady(code=code):
                await self._notices.resume_code(code)
            case AgentWork(run=run):
                run()  # the agent's own guard catches what it raises (agents/remote/adapter.py)
            case _:
                log.debug("call.ignored_event", extra={"call_id": self.call_id, "ev": repr(item)})

    def _transferring(self) -> bool:
        state = self._state.session_state
        return state is not None and state.signaling is Signaling.TRANSFERRING

    async def _maybe_start_agent(self) -> None:
        channel = self.channel
        if self.agent is not None or channel is None or self.phase is not CallPhase.ANSWERED:
            return
        context = CallContext(
            call_id=self.call_id,
            called_user=self.offer.called_user,
            caller=mask_uri(self.offer.remote_uri),
            codec=self.codec,
            rate=channel.rate,
            tenant=self.offer.tenant,
        )
        agent = self._state.agent = make_agent(self._agent_factory, context, self.control)
        self._turns.agent_takes_audio = channel.wants_pcm = takes_audio(agent.inner)
        if self.rejoin is not None:
            # Reclaim, don't resend (seed 004): what exists is read back, nothing is re-run.
            await agent.on_rejoined(self.rejoin.heard_last, self.rejoin.results)
        else:
            await agent.on_start()

    async def _on_tick(self) -> None:
        channel = self.channel
        if channel is None:
            return
        channel.collect()
        await self._turns.drain_inbound(channel)
        if self._turns.barge_in_near:
            # Asked after this drain, not at the tick: the frame that decides the barge-in is
            # then at most one short tick away.
            self._services.quicken_media_tick()
        playout = channel.playout
        metrics = self._services.metrics
        if playout.stale_dropped_frames != self._stale_seen:
            metrics.stale_frames.inc(playout.stale_dropped_frames - self._stale_seen)
            self._stale_seen = playout.stale_dropped_frames
        if playout.stale_played_frames != self._stale_played_seen:
            metrics.stale_frames_played.inc(playout.stale_played_frames - self._stale_played_seen)
            self._stale_played_seen = playout.stale_played_frames
        await self._playback_events(playout)
        self.transfer.bridge.tick()  # an attended transfer's brief on the consult leg
        self._hold.on_tick()
        self._hangup.on_tick()

    async def _playback_events(self, playout: Playout) -> None:
        for event in playout.poll():
            match event:
                case MarkHeard(response_id=response_id, mark_id=mark_id):
                    await self._notices.mark(MarkOutcome(response_id, mark_id, "played"))
                case MarkCleared(response_id=response_id, mark_id=mark_id):
                    await self._notices.mark(MarkOutcome(response_id, mark_id, "cleared"))
                case ResponseDrained(response_id=response_id, heard_ms=heard_ms):
                    self._responses.drained(response_id, heard_ms)

    def _finish_without_dialog(self, reason: str) -> None:
        if self.session is not None and not self.session.state.terminal:
            self._steps.try_apply(sev.ServerHangup("canceled", reason))
        self._finish()

    def _finish(self, status: int = 0) -> None:
        services = self._services
        self.transfer.bridge.release()
        if self.outbound is not None and self.answered_at is None:
            outcome = unanswered_outcome(
                self._state.session_state, status, self._hangup.plan is not None
            )
            services.metrics.outbound_calls.labels(outcome.value).inc()
        self._state.phase = CallPhase.ENDED
        services.metrics.calls_active.dec()
        ended = self.session.state.ended if self.session else None
        if ended is not None:
            services.metrics.calls.labels(ended.terminal_state).inc()
        self._responses.ended()
        channel = self.channel
        if channel is not None:
            playout = channel.playout
            services.metrics.media_frames.labels("in").inc(channel.rx_frames)
            services.metrics.media_frames.labels("out").inc(playout.audio_frames)
            services.metrics.playout_underruns.inc(playout.underruns)
            if self._responses.response_id is not None or playout.playing is not None:
                playout.interrupt(playout.generation + 1)
        log.info(
            "call.ended",
            extra={
                "call_id": self.call_id,
                "terminal_state": ended.terminal_state if ended else None,
                "reason": ended.reason if ended else None,
                "stage": ended.stage if ended else None,
            },
        )
