"""One live call: the task that owns it, its durable session, and the agent's :class:`CallControl`.

Everything that happens to a call (SIP events, media ticks, timers, the agent's requests) goes
through this one task, in order (STYLE.md habit 5). Each becomes a session event: the session
machine decides, the store makes the step durable, and only then does this module carry out the
effects (clear playout, say a prompt, hang up, arm a timer).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from agents.base import Agent, AgentFactory, CallContext, ToolResult, takes_audio
from audio.barge_in import BargeIn, BargeInConfig, latency_ms, onset_ns
from audio.inbound import InboundPipeline
from audio.playout import MarkHeard, ResponseDrained
from audio.vad import SpeechStarted, SpeechStopped, VadConfig
from session import effects as fx
from session import events as sev
from session.durable import DurableSession
from session.machine import RETRY, IllegalTransition
from session.state import Outstanding, SessionState
from session.store import LeaseLost, SessionStore, StoreError
from session.store.writer import StoreWriter
from telephony import events as ev
from telephony.media_bridge import MediaChannel
from telephony.sip_message import mask_uri
from voicegate.call.clock import SessionClock
from voicegate.call.executor import execute, split_in_process
from voicegate.observe.metrics import Metrics
from voicegate.tools.call_tools import CallTools, ToolDone, ToolRefused, ToolServices

log = logging.getLogger("voicegate.call")

# How long a hang-up waits for queued audio to be heard before it goes ahead anyway.
MAX_HANGUP_WAIT_S = 30.0


class _Tick:
    """A media tick (``audio.tick_ms``): drain caller audio, notice drained playout."""


TICK = _Tick()


@dataclass(frozen=True, slots=True)
class _AgentNotice:
    """A NotifyAgent effect, delivered to the agent from the call's task."""

    what: str
    detail: str


@dataclass(frozen=True, slots=True)
class _Persisted:
    """A write finished on the store's writer thread; ``then`` runs in the call's task."""

    then: Callable[[Future[Any]], None]
    done: Future[Any]


@dataclass(frozen=True, slots=True)
class _TimerFired:
    name: str
    generation: int
    attempt: int


class CallPhase(enum.Enum):
    RINGING = "ringing"
    ANSWERED = "answered"
    ENDING = "ending"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class HangupPlan:
    """A hang-up we start: how the session should record it, once the BYE can go."""

    outcome: str  # completed or canceled
    reason: str


class CallServices(ToolServices, Protocol):
    """What a live call needs from the process around it."""

    store: SessionStore
    writer: StoreWriter
    metrics: Metrics
    answer_after_s: float
    owner: str

    def submit(self, command: ev.SipCommand) -> None: ...

    def prompt(self, name: str, rate: int) -> NDArray[np.int16]: ...

    def policy(self) -> dict[str, float]: ...

    def audio_settings(self) -> tuple[int, VadConfig, BargeInConfig]: ...

    def record_effects(self, effects: list[fx.Effect]) -> None: ...


class LiveCall:
    def __init__(
        self,
        offer: ev.CallOffered,
        services: CallServices,
        agent_factory: AgentFactory,
        clock: SessionClock,
    ) -> None:
        self.offer = offer
        self.call_id = offer.call_id
        self._services = services
        self._agent_factory = agent_factory
        self._clock = clock
        self.events: asyncio.Queue[object] = asyncio.Queue()
        self.phase = CallPhase.RINGING
        self.started_at = clock.now()
        self.answered_at: float | None = None
        self.codec = ""
        self.codec_rate: int | None = None
        self.channel: MediaChannel | None = None
        self.agent: Agent | None = None
        self.session: DurableSession | None = None
        self.done = asyncio.Event()
        self._tick_queued = False
        self._frames_in = 0
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._turns = 0
        self._responses = 0
        self._response_id: str | None = None
        self._response_open = False
        self._says = 0
        agent_rate, vad, barge = services.audio_settings()
        self._agent_rate = agent_rate
        self._vad_config = vad
        self._barge = BargeIn(barge)
        self._inbound: InboundPipeline | None = None
        self._agent_takes_audio = False
        self._stale_seen = 0
        self._speech_turn: str | None = None
        self._speech_onset_ms = 0.0
        self.media_health = "flowing"
        self._hangup: HangupPlan | None = None
        self._hangup_waiting_since: float | None = None
        self._in_dtmf = False
        self._halted: StoreError | None = None  # lease lost, or the store failed
        self._media_released = False
        self._results: dict[str, ToolResult] = {}
        self._acting: deque[tuple[Future[None] | None, list[fx.Effect]]] = deque()
        self.last_write: Future[None] | None = None
        self._hangup_status = 603
        self._loop = asyncio.get_running_loop()
        self.tools = CallTools(
            self.call_id,
            services,
            apply=self._apply,
            post=self.events.put_nowait,
            current_turn=self._current_turn,
            find_outstanding=self._outstanding,
            durable=lambda: self.last_write,
            wall=clock.wall,
        )

    # --- what /v1/calls shows -------------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        now = self._clock.now()
        return {
            "call_id": self.call_id,
            "state": self.phase.value,
            "session_status": self.session.state.status() if self.session else None,
            "caller": mask_uri(self.offer.remote_uri),
            "called_user": self.offer.called_user,
            "transport": self.offer.transport,
            "codec": self.codec,
            "codec_rate": self.codec_rate,
            "media": self.media_health,
            "rate": self.channel.rate if self.channel else None,
            # Frames the media port moved: 50 a second each way while the media clock keeps up.
            "frames_in": self.channel.rx_frames if self.channel else None,
            "frames_out": self.channel.playout.pulls if self.channel else None,
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

    def touch(self) -> None:
        """Heartbeat: tell the store this session's owner is alive (the reaper's signal)."""
        session = self.session
        if session is None or session.lease is None or session.state.terminal:
            return
        if self._halted is not None:
            return
        lease, at = session.lease, self._clock.wall()

        def touch(store: SessionStore) -> LeaseLost | None:
            if store.touch(self.call_id, lease=lease, at=at):
                return None
            # Refused while the session is open here: another process took it over.
            held = store.get(self.call_id)
            return LeaseLost(self.call_id, lease, held.owner, held.lease_epoch) if held else None

        done = self._services.writer.submit(touch)
        done.add_done_callback(lambda f: self._from_writer(self._touched, f))

    def _touched(self, done: Future[LeaseLost | None]) -> None:
        lost = None if done.exception() else done.result()
        if lost is not None:
            self._lose_lease(lost)

    # --- CallControl ----------------------------------------------------------------------------

    @property
    def rate(self) -> int:
        return self.channel.rate if self.channel else 8000

    def play(self, samples: NDArray[np.int16]) -> None:
        channel = self.channel
        if (
            channel is None
            or self.phase is not CallPhase.ANSWERED
            or self._hangup is not None
            or self._media_released
        ):
            return
        if not self._response_open and not self._start_response():
            return
        assert self._response_id is not None and self.session is not None
        generation = self.session.state.playback_generation
        # Admission checks the generation: a chunk of an older one never enters the queue.
        channel.playout.admit(self._response_id, generation, np.asarray(samples, dtype=np.int16))
        if self.tools.receipts_seen:
            # Seed 000's last crash window: response audio buffered for playout after a receipt.
            self._services.faults.reached("during_playout")

    def play_prompt(self, name: str) -> None:
        self.play(self._services.prompt(name, self.rate))

    def mark(self, mark_id: str) -> bool:
        """Place a mark after the audio queued so far; ``Agent.on_mark`` says when it was heard."""
        if self.channel is None or not self._response_open or self._response_id is None:
            return False
        return self.channel.playout.mark(self._response_id, mark_id)

    def stop_playback(self) -> None:
        self._interrupt_response()

    def _interrupt_response(self) -> int | None:
        """Cut the active response at once; the session records how much the caller heard."""
        response_id, channel, session = self._response_id, self.channel, self.session
        if response_id is None or channel is None or session is None:
            return None
        playout = channel.playout
        # Stop the audio first (the cut is exact), then make it durable: no frame of the old
        # generation leaves the bridge while the log is written.
        cut = playout.interrupt(max(playout.generation, session.state.playback_generation) + 1)
        heard = next((c.heard_ms for c in cut if c.response_id == response_id), None)
        if heard is None:
            heard = playout.heard_ms(response_id)
        self._response_id, self._response_open = None, False
        self._try(sev.ResponseInterrupted(response_id, heard))
        return heard

    def hangup(self, reason: str, *, after_playout: bool = True) -> None:
        self.end(HangupPlan("completed", reason), after_playout=after_playout)

    def request_tool(
        self, tool: str, arguments: Mapping[str, Any], *, key: str | None = None
    ) -> str:
        # Approval by key press: only a request made while handling the caller's DTMF counts.
        return self.tools.request(tool, arguments, key, approved=self._in_dtmf)

    def _current_turn(self) -> str:
        state = self.session.state if self.session else None
        return state.turn.turn_id if state and state.turn else ""

    def end(self, plan: HangupPlan, *, after_playout: bool, status: int = 603) -> None:
        """Hang up, recording ``plan`` as the session's outcome (the first plan given wins).

        With ``after_playout`` the BYE waits (at most :data:`MAX_HANGUP_WAIT_S`) until the queued
        audio has been sent, so a goodbye is heard; a later call without it hangs up at once.
        """
        if self.phase in (CallPhase.ENDING, CallPhase.ENDED):
            return
        if self._hangup is None:
            self._hangup = plan
        if after_playout and self.phase is CallPhase.ANSWERED and self._still_playing():
            if self._hangup_waiting_since is None:
                self._hangup_waiting_since = asyncio.get_running_loop().time()
            return
        self._hang_up_now(status)

    def _still_playing(self) -> bool:
        channel = self.channel
        return channel is not None and (
            channel.playout.queued_ms > 0 or channel.playout.playing is not None
        )

    def _hang_up_now(self, status: int = 603) -> None:
        assert self._hangup is not None
        self._hangup_waiting_since = None
        self._hangup_status = status
        session = self.session
        if (
            session is not None
            and not session.state.terminal
            and self._try(sev.ServerHangup(self._hangup.outcome, self._hangup.reason))
        ):
            return  # the session's HangUp effect sends the BYE once the ending is durable
        if self.phase not in (CallPhase.ENDING, CallPhase.ENDED):
            self.phase = CallPhase.ENDING
            self._services.submit(ev.Hangup(self.call_id, status=status))

    # --- the session ----------------------------------------------------------------------------

    def _apply(self, event: sev.Event) -> list[fx.Effect]:
        """Feed the session; effects run only after the step is durable."""
        session = self.session
        if session is None:
            return []
        if self._halted is not None:
            raise self._halted  # another process's now, or unwritable: write nothing
        try:
            effects, write = session.apply_through(self._services.writer, event, self._clock.now())
        except IllegalTransition as exc:
            self._services.metrics.session_events_rejected.labels(event.type).inc()
            log.warning(
                "session.rejected",
                extra={"call_id": self.call_id, "event_type": event.type, "why": exc.why},
            )
            raise
        except LeaseLost as exc:
            self._lose_lease(exc)
            raise
        if write is not None:
            self.last_write = write
        self._execute(effects, write)
        return effects

    def _execute(self, effects: list[fx.Effect], write: Future[None] | None) -> None:
        """In-process effects now; the rest once ``write`` (and every write before it) is
        durable, in log order: nothing reaches the caller, the agent, a provider or the SIP
        peer before the log says why."""
        self._services.record_effects(effects)
        now, later = split_in_process(effects)
        execute(now, self)
        if write is None and not later:
            return
        # Every write is watched, with or without effects waiting on it: a write that fails
        # (a lost lease, a broken disk) stops the call from acting on what was never recorded.
        self._acting.append((write, later))
        if write is not None and not write.done():
            write.add_done_callback(lambda f: self._from_writer(self._act, f))
        else:
            self._act()

    def _from_writer(self, then: Callable[[Future[Any]], None], done: Future[Any]) -> None:
        # Called on the writer thread: hand the result to the call's task, in order.
        self._loop.call_soon_threadsafe(self.events.put_nowait, _Persisted(then, done))

    def _act(self, _done: Future[Any] | None = None) -> None:
        """Carry out the deferred effects whose writes are durable, oldest first."""
        while self._acting:
            write, effects = self._acting[0]
            if write is not None and not write.done():
                return
            self._acting.popleft()
            failed = write.exception() if write is not None else None
            if failed is not None:
                self._write_failed(failed)
                continue
            try:
                execute(effects, self)
            except StoreError:
                pass  # _halt has stopped the call
            except IllegalTransition as exc:
                log.warning(
                    "session.effect_refused", extra={"call_id": self.call_id, "why": exc.why}
                )

    def _write_failed(self, exc: BaseException) -> None:
        """A step never became durable: its effects are dropped, and the call stops acting."""
        if isinstance(exc, LeaseLost):
            self._lose_lease(exc)
            return
        log.error("session.store_failed", extra={"call_id": self.call_id, "why": str(exc)})
        # Write nothing more: what the log holds is the truth the reaper finalises.
        failure = exc if isinstance(exc, StoreError) else StoreError(str(exc))
        self._halt(failure)

    async def _writes_settled(self) -> None:
        """Wait until every step so far is durable and its effects carried out."""
        while self._acting:
            write = self._acting[-1][0]
            if write is not None and not write.done():
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(write)
            self._act()

    def _try(self, event: sev.Event) -> bool:
        try:
            self._apply(event)
        except (IllegalTransition, StoreError):  # StoreError: _halt has stopped the call
            return False
        return True

    def _lose_lease(self, lost: LeaseLost) -> None:
        """The session was taken over (reaped, or moved to another worker): stop acting for it.

        Nothing more is written (every later step raises ``lost`` before reaching the store),
        timers and tool requests stop, and the dialog is ended here without a session event: the
        session's new owner records how it ends.
        """
        if self._halted is not None:
            return
        log.warning(
            "session.lease_lost",
            extra={
                "call_id": self.call_id,
                "session_id": lost.session_id,
                "owner": lost.owner,
                "epoch": lost.epoch,
                "lease_epoch": lost.lease.epoch,
            },
        )
        self._halt(lost)

    def _halt(self, why: StoreError) -> None:
        """Stop acting for the session: every later step raises ``why`` before it is written."""
        if self._halted is not None:
            return
        self._halted = why
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self.tools.cancel()
        if self.phase not in (CallPhase.ENDING, CallPhase.ENDED):
            self.phase = CallPhase.ENDING
            self._services.submit(ev.Hangup(self.call_id))

    # --- effects: each is carried out here (voicegate/call/executor.py maps them) --------------

    def clear_playout(self, generation: int) -> None:
        if self.channel is not None and generation > self.channel.playout.generation:
            self.channel.playout.interrupt(generation)
        # Nothing queued before the clear may continue: the next chunk opens a new response.
        self._response_id, self._response_open = None, False

    def cancel_response(self, response_id: str) -> None:
        if self._response_id == response_id:
            self._response_id, self._response_open = None, False

    def bind_response(self, response_id: str, generation: int) -> None:
        if self.channel is not None:
            self.channel.playout.begin(response_id, generation)

    def stop_generation(self) -> None:
        self.events.put_nowait(_AgentNotice("stop", ""))

    def gate_changed(self, old: str, new: str) -> None:
        log.info("session.gate", extra={"call_id": self.call_id, "old": old, "new": new})

    def recovery_started(self, generation: int, interruption: str, deadline: float) -> None:
        log.info(
            "recovery.started",
            extra={
                "call_id": self.call_id,
                "generation": generation,
                "interruption": interruption,
                "deadline_in_s": round(deadline - self._clock.now(), 3),
            },
        )

    def attempt_recovery(
        self, generation: int, attempt: int, interruptions: tuple[str, ...]
    ) -> None:
        # A re-INVITE or a transfer is its own SIP transaction and answers for itself; a media
        # gap has no transaction, so its attempt asks the dialog whether it still exists.
        log.info(
            "recovery.attempt",
            extra={"call_id": self.call_id, "generation": generation, "attempt": attempt},
        )
        if "media" in interruptions and self.phase is CallPhase.ANSWERED:
            self._probe_dialog(generation, attempt)

    def _probe_dialog(self, generation: int, attempt: int) -> None:
        # RFC 3261 section 11: an OPTIONS inside the dialog. A 481 or 408 (or no transport)
        # means the peer no longer has the dialog (section 12.2.1.2): RecoveryProbed ends the
        # session failed at once, instead of waiting out session.recovery_timeout_s. (PJSIP's
        # own dialog layer then sends the BYE 12.2.1.2 asks for; the session sends none.)
        self._services.submit(ev.ProbeDialog(self.call_id, generation, attempt))

    def recovery_finished(self, generation: int, outcome: str) -> None:
        log.info(
            "recovery.finished",
            extra={"call_id": self.call_id, "generation": generation, "outcome": outcome},
        )

    def schedule_timer(self, name: str, due: float, generation: int, attempt: int) -> None:
        self._arm(name, due, generation, attempt)

    def cancel_timer(self, name: str) -> None:
        handle = self._timers.pop(name, None)
        if handle is not None:
            handle.cancel()

    def reconcile(self, keys: tuple[str, ...]) -> None:
        self.tools.reconcile(keys, tool_of=self._tool_of)

    def send_tool_request(self, key: str) -> None:
        intent = self._outstanding(key)
        if intent is not None:
            self.tools.send(intent, self.tools.persist_intent(intent))

    def cancel_tool_calls(self, keys: tuple[str, ...]) -> None:
        self.tools.cancel(keys)

    def persist_outstanding(self, keys: tuple[str, ...]) -> None:
        state = self.session.state if self.session else None
        if state is None:
            return
        self.tools.persist_outstanding([o for o in state.outstanding if o.key in keys])

    def say(self, prompt: str, *, before_hangup: bool) -> None:
        self._say(prompt)

    def notify_agent(self, what: str, detail: str) -> None:
        # Agents are awaited from the call's own task, never from inside a step.
        self.events.put_nowait(_AgentNotice(what, detail))

    def release_media(self) -> None:
        # No more caller audio to VAD or the agent, and no agent audio admitted; what the
        # session itself queued (a goodbye) still plays before the BYE.
        self._media_released = True
        if self.channel is not None:
            self.channel.inbound.clear()

    def hang_up(self, reason: str, *, after_prompt: bool) -> None:
        if self.phase in (CallPhase.ENDING, CallPhase.ENDED):
            return
        self._hangup = self._hangup or HangupPlan("canceled", reason)
        if after_prompt and self._still_playing():
            # The prompt this step queued (Say) is heard before the BYE.
            self._hangup_waiting_since = asyncio.get_running_loop().time()
        else:
            self.phase = CallPhase.ENDING
            self._services.submit(ev.Hangup(self.call_id, status=self._hangup_status))

    def finished(self, terminal_state: str, reason: str, stage: str | None) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def stale_event_ignored(self, event_type: str, why: str) -> None:
        log.debug(
            "session.stale_event",
            extra={"call_id": self.call_id, "event_type": event_type, "why": why},
        )

    def _outstanding(self, key: str) -> Outstanding | None:
        state = self.session.state if self.session else None
        if state is None:
            return None
        return next((o for o in state.outstanding if o.key == key), None)

    def _tool_of(self, key: str) -> str:
        intent = self._outstanding(key)
        return intent.tool if intent else ""

    def announce(self, prompt: str) -> None:
        """Play a system notice (not an agent response, so not subject to barge-in)."""
        self._say(prompt)

    def _say(self, prompt: str) -> None:
        """A line the session machine wants the caller to hear (not an agent response)."""
        channel = self.channel
        if channel is None or self.phase is not CallPhase.ANSWERED:
            return
        playout = channel.playout
        if self._response_open and self._response_id is not None:
            playout.finish(self._response_id)
            self._response_open = False
        self._says += 1
        say_id = f"say{self._says}"
        playout.begin(say_id, playout.generation)
        playout.admit(say_id, playout.generation, self._services.prompt(prompt, channel.rate))
        playout.finish(say_id)

    def _arm(self, name: str, due: float, generation: int, attempt: int) -> None:
        previous = self._timers.pop(name, None)
        if previous is not None:
            previous.cancel()
        # Session time is the loop's clock plus a fixed offset: a wall-clock step moves nothing.
        self._timers[name] = asyncio.get_running_loop().call_at(
            self._clock.loop_time(due),
            self.events.put_nowait,
            _TimerFired(name, generation, attempt),
        )

    def _start_response(self) -> bool:
        """Open a new response; a finished one still draining is recorded as finished first."""
        if self._response_id is not None:
            self._close_response(self._response_id)
        self._responses += 1
        response_id = f"r{self._responses}"
        state = self.session.state if self.session else None
        turn_id = state.turn.turn_id if state and state.turn else ""
        # Its BindResponse effect opens the response in the playout, in the current generation.
        if not self._try(sev.ResponseStarted(response_id, turn_id)):
            return False
        self._response_id, self._response_open = response_id, True
        return True

    def _close_response(self, response_id: str) -> None:
        heard = self.channel.playout.heard_ms(response_id) if self.channel else 0
        self._response_id, self._response_open = None, False
        self._try(sev.ResponseFinished(response_id, heard))

    # --- the task -------------------------------------------------------------------------------

    async def run(self) -> None:
        services = self._services
        meta = {
            "caller": mask_uri(self.offer.remote_uri),
            "called_user": self.offer.called_user,
            "transport": self.offer.transport,
            "sip_call_id": self.offer.sip_call_id,
        }
        offered = sev.CallOffered(
            caller=meta["caller"], called_user=self.offer.called_user, policy=services.policy()
        )
        call_id, owner, at = self.call_id, services.owner, self.started_at
        lease = await asyncio.wrap_future(
            services.writer.submit(
                lambda store: store.create(call_id, owner=owner, meta=meta, at=at)
            )
        )
        self.session = DurableSession(services.store, SessionState(call_id), lease)
        self._apply(offered)
        services.metrics.calls_offered.inc()
        services.metrics.calls_active.inc()
        log.info("call.offered", extra={"call_id": self.call_id, **meta})
        # The session is durable before the caller hears anything from us.
        await self._writes_settled()
        if services.answer_after_s > 0:
            asyncio.get_running_loop().call_later(services.answer_after_s, self._answer)
        else:
            self._answer()
        try:
            while self.phase is not CallPhase.ENDED:
                item = await self.events.get()
                try:
                    await self._handle(item)
                except StoreError:
                    # A lost lease or a failed write was handled where it was found (_halt):
                    # the call is hanging up, and this loop waits for the dialog's end.
                    if self._halted is None:
                        raise
            await self._writes_settled()
        finally:
            for handle in self._timers.values():
                handle.cancel()
            self.tools.cancel()
            if self.phase is not CallPhase.ENDED:
                # Cancelled (shutdown past its deadline): the outcome is still recorded.
                self._finish_without_dialog("server stopped before the call ended")
            self.done.set()

    def _answer(self) -> None:
        if self.phase is CallPhase.RINGING and self._hangup is None:
            self._services.submit(ev.Answer(self.call_id))

    async def _handle(self, item: object) -> None:
        match item:
            case _Tick():
                self._tick_queued = False
                await self._on_tick()
            case _TimerFired(name=name, generation=gen, attempt=attempt):
                self._timers.pop(name, None)
                if name == RETRY:
                    self._try(sev.RecoveryRetryDue(gen, attempt))
                else:
                    self._try(sev.DeadlineFired(name, gen))
            case ev.MediaReady(codec=codec, codec_rate=codec_rate, channel=channel):
                self.codec = codec
                self.codec_rate = codec_rate
                self.channel = channel
                # A new media channel starts at generation 0: bring it to the session's, so
                # nothing older can be admitted. (A re-INVITE that changes the codec keeps the
                # channel: it runs at the bridge's rate, not the codec's.)
                state = self.session.state if self.session else None
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
                if self.phase is CallPhase.RINGING and self._try(sev.CallAnswered()):
                    self.phase = CallPhase.ANSWERED
                    self.answered_at = self._clock.now()
                    log.info("call.answered", extra={"call_id": self.call_id})
                    await self._maybe_start_agent()
            case ev.DtmfReceived(digit=digit, method=method):
                self._services.metrics.dtmf_digits.labels(method).inc()
                await self._on_dtmf(digit)
            case ev.CallEnded():
                await self._on_ended(item)
            case ToolDone():
                await self._on_tool_done(item)
            case ev.MediaHealthChanged(health=health):
                self._on_media_health(health)
            case ev.ReinviteStarted():
                if self.phase is CallPhase.ANSWERED:
                    self._response_id, self._response_open = None, False
                    self._try(sev.ReinviteStarted())
            case ev.ReinviteFinished(ok=ok):
                state = self.session.state if self.session else None
                if state is not None and state.recovery is not None:
                    self._try(sev.ReinviteFinished(state.recovery.generation, ok))
            case ev.DialogProbed(generation=gen, attempt=attempt, status=status, reason=reason):
                log.info(
                    "recovery.probed",
                    extra={"call_id": self.call_id, "status": status, "attempt": attempt},
                )
                self._try(sev.RecoveryProbed(gen, attempt, status, reason))
            case _AgentNotice():
                await self._notify_agent(item)
            case _Persisted(then=then, done=done):
                then(done)
            case ToolRefused(result=result):
                await self._tell_agent(result)
            case _:
                log.debug("call.ignored_event", extra={"call_id": self.call_id, "ev": repr(item)})

    def _on_media_health(self, health: str) -> None:
        """RTP stopped or came back (telephony.media_health): the session's media dimension."""
        self.media_health = health
        state = self.session.state if self.session else None
        if state is None or state.terminal or self.phase is not CallPhase.ANSWERED:
            return
        log.info("call.media_health", extra={"call_id": self.call_id, "health": health})
        if health == "interrupted":
            self._services.metrics.media_gaps.inc()
        if health == "interrupted" and state.media.value == "flowing":
            self._response_id, self._response_open = None, False
            self._try(sev.MediaLost())
        elif health in ("flowing", "held") and state.media.value == "interrupted":
            generation = state.recovery.generation if state.recovery else 0
            self._try(sev.MediaRestored(generation))

    async def _notify_agent(self, notice: _AgentNotice) -> None:
        """A NotifyAgent or StopGeneration effect, delivered from the call's task."""
        agent = self.agent
        if notice.what == "tool_receipt":
            # The receipt's result (with the provider's detail) was kept when it was recorded.
            result = self._results.pop(notice.detail.split(" ", 1)[0], None)
            if result is not None:
                await self._tell_agent(result)
            return
        if agent is None or self.phase is not CallPhase.ANSWERED:
            return
        match notice.what:
            case "interrupted":
                await agent.on_interrupted(notice.detail)
            case "resumed":
                await agent.on_resumed(notice.detail)
            case "response_interrupted":
                heard = notice.detail.rpartition("heard_ms=")[2]
                await agent.on_response_interrupted(int(heard) if heard.isdigit() else 0)
            case "stop":
                await agent.on_stop()
            case _:
                log.warning(
                    "agent.unknown_notice", extra={"call_id": self.call_id, "what": notice.what}
                )

    async def _on_tool_done(self, done: ToolDone) -> None:
        intent = self._outstanding(done.key)
        if intent is None or self.session is None or self.session.state.terminal:
            return
        # Recording it feeds the receipt to the session, whose NotifyAgent effect hands this
        # result to the agent (unless the receipt ended the session).
        self._results[done.key] = self.tools.record(done, intent.tool)

    async def _tell_agent(self, result: ToolResult) -> None:
        if self.agent is not None and self.phase is CallPhase.ANSWERED:
            await self.agent.on_tool_result(result)

    async def _on_dtmf(self, digit: str) -> None:
        if self.agent is None or self.phase is not CallPhase.ANSWERED or self._hangup is not None:
            return
        channel = self.channel
        if channel is not None:
            # DTMF barge-in (audio.barge_in_dtmf): the key cuts the response before the agent
            # even sees it.
            now_ts = self._frames_in * (channel.frame_size // 2)
            decision = self._barge.on_dtmf(now_ts, channel.playout.playing)
            if decision is not None and decision.response_id == self._response_id:
                self._barge_in("dtmf", decision.onset_timestamp, decision.onset_timestamp)
        if self._speech_turn is not None:
            # The caller pressed a key: whatever they were saying is a finished turn.
            speech_turn, self._speech_turn = self._speech_turn, None
            self._try(sev.TurnCommitted(speech_turn))
        # A key press is a whole caller turn: started and committed at once.
        self._turns += 1
        turn_id = f"t{self._turns}"
        if not self._try(sev.TurnStarted(turn_id)):
            return
        faults = self._services.faults
        faults.reached("before_turn_commit")
        self._apply(sev.TurnCommitted(turn_id))
        faults.reached("after_turn_commit")
        self._in_dtmf = True
        try:
            await self.agent.on_dtmf(digit)
        finally:
            self._in_dtmf = False

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
        self._agent_takes_audio = takes_audio(self.agent)
        await self.agent.on_start()

    async def _on_tick(self) -> None:
        channel = self.channel
        if channel is None:
            return
        channel.collect()
        await self._drain_inbound(channel)
        playout = channel.playout
        metrics = self._services.metrics
        if playout.stale_dropped_frames != self._stale_seen:
            metrics.stale_frames.inc(playout.stale_dropped_frames - self._stale_seen)
            self._stale_seen = playout.stale_dropped_frames
        # A response whose audio has all been queued and pulled is done: finish it (the last
        # partial frame is padded) and record it once it has drained.
        if self._response_open and self._response_id and playout.queued_ms == 0:
            playout.finish(self._response_id)
            self._response_open = False
        for event in playout.poll():
            match event:
                case MarkHeard(mark_id=mark_id):
                    if self.agent is not None and self.phase is CallPhase.ANSWERED:
                        await self.agent.on_mark(mark_id)
                case ResponseDrained(response_id=response_id, heard_ms=heard_ms):
                    if response_id == self._response_id and not self._response_open:
                        self._response_id = None
                        self._try(sev.ResponseFinished(response_id, heard_ms))
        if self._hangup_waiting_since is not None and self.phase is CallPhase.ANSWERED:
            waited = asyncio.get_running_loop().time() - self._hangup_waiting_since
            if not self._still_playing() or waited > MAX_HANGUP_WAIT_S:
                self._hang_up_now()

    async def _drain_inbound(self, channel: MediaChannel) -> None:
        """Caller audio: VAD and barge-in at the call's rate, then the agent's frames."""
        inbound = channel.inbound
        if not inbound:
            return
        if self._media_released:
            inbound.clear()
            return
        pipeline = self._inbound
        if pipeline is None or pipeline.call_rate != channel.rate:
            pipeline = self._inbound = InboundPipeline(
                channel.rate, self._agent_rate, self._vad_config
            )
        metrics = self._services.metrics
        samples_per_frame = channel.frame_size // 2
        answered = self.agent is not None and self.phase is CallPhase.ANSWERED
        while inbound:
            data = inbound.popleft()
            timestamp = self._frames_in * samples_per_frame
            self._frames_in += 1
            spent = pipeline.total_ns
            result = pipeline.process(data, timestamp, for_agent=self._agent_takes_audio)
            metrics.frame_pipeline.observe((pipeline.total_ns - spent) / 1e9)
            if not answered:
                continue
            decision = self._barge.on_frame(
                result.vad_event, result.speech_ms, channel.playout.playing
            )
            if decision is not None and decision.response_id == self._response_id:
                self._barge_in("speech", decision.onset_timestamp, timestamp + samples_per_frame)
            await self._on_vad(result.vad_event)
            if self.agent is not None and result.frame_for_agent is not None:
                await self.agent.on_audio(result.frame_for_agent)

    def _barge_in(self, reason: str, onset: int, detected_at: int) -> None:
        assert self.channel is not None
        detected_ns = time.monotonic_ns()
        heard = self._interrupt_response()
        if heard is None:
            return
        metrics = self._services.metrics
        metrics.barge_ins.labels(reason).inc()
        if reason == "speech":
            started = onset_ns(detected_ns, onset, detected_at, self.channel.rate)
            latency = latency_ms(started, self.channel.playout.last_audio_pull_ns)
            metrics.barge_in_latency.observe(latency / 1000)
        log.info(
            "call.barge_in",
            extra={"call_id": self.call_id, "reason": reason, "heard_ms": heard},
        )

    async def _on_vad(self, event: SpeechStarted | SpeechStopped | None) -> None:
        """Caller speech is a caller turn: started at onset, committed when it stops."""
        if event is None or self.agent is None:
            return
        if isinstance(event, SpeechStarted):
            self._turns += 1
            turn_id = f"t{self._turns}"
            if self._try(sev.TurnStarted(turn_id)):
                self._speech_turn = turn_id
            self._speech_onset_ms = event.timestamp_ms
            await self.agent.on_speech_started()
        elif self._speech_turn is not None:
            turn_id, self._speech_turn = self._speech_turn, None
            if self._try(sev.TurnCommitted(turn_id)):
                await self.agent.on_speech_turn(round(event.timestamp_ms - self._speech_onset_ms))

    async def _on_ended(self, ended: ev.CallEnded) -> None:
        session = self.session
        if session is not None and not session.state.terminal:
            if ended.by == "caller" and ended.status in (200, 487):
                # 200: the caller's BYE; 487: the caller's CANCEL before we answered.
                self._try(sev.CallerHangup())
            elif ended.status == 408 and "refresh" in ended.reason.lower():
                # RFC 4028 expiry: PJSIP's session timer ended the dialog.
                self._try(sev.SessionExpired(ended.reason))
            elif ended.by == "server" and self._hangup is not None:
                self._try(sev.ServerHangup(self._hangup.outcome, self._hangup.reason))
            else:
                self._try(sev.DialogFailed(ended.status, ended.reason))
        self._finish()
        if self.agent is not None:
            try:
                await self.agent.on_end(self._ending_reason())
            except Exception:
                log.exception("agent.on_end failed", extra={"call_id": self.call_id})

    def _ending_reason(self) -> str:
        ended = self.session.state.ended if self.session else None
        return ended.reason if ended else "call ended"

    def _finish_without_dialog(self, reason: str) -> None:
        if self.session is not None and not self.session.state.terminal:
            self._try(sev.ServerHangup("canceled", reason))
        self._finish()

    def _finish(self) -> None:
        services = self._services
        self.phase = CallPhase.ENDED
        services.metrics.calls_active.dec()
        ended = self.session.state.ended if self.session else None
        if ended is not None:
            services.metrics.calls.labels(ended.terminal_state).inc()
        if self.channel is not None:
            playout = self.channel.playout
            services.metrics.media_frames.labels("in").inc(self.channel.rx_frames)
            services.metrics.media_frames.labels("out").inc(playout.audio_frames)
            services.metrics.playout_underruns.inc(playout.underruns)
            if self._response_id is not None or playout.playing is not None:
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
