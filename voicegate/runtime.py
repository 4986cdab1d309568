"""The composition root of one serving process: SIP thread, live calls, store, metrics.

The runtime routes what the SIP thread reports to the call it concerns, ticks every live call every
``audio.tick_ms``, and runs the staged shutdown. It holds no business logic: a call's outcome is
decided by its :class:`~voicegate.call.live_call.LiveCall`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import aiohttp
import numpy as np
from numpy.typing import NDArray

from agents.base import AgentFactory
from agents.demo import DemoAgent
from agents.loading import AgentLoadError, load_factory
from agents.remote.adapter import RemoteAgentFactory, remote_settings
from agents.remote.dial import CaFileError
from agents.speaking_demo import SpeakingDemoAgent, prepare_speech
from audio.barge_in import BargeInConfig
from audio.prompts import PromptLibrary, default_prompts_dir
from audio.vad import VadConfig
from config import Settings
from config.settings import AudioSettings, OutboundSettings, TransferSettings
from config.tenant_loader import tenants_of
from config.tenants import DEFAULT_TENANT
from config.tools import ToolSettings
from session import effects as fx
from session.reaper import expire_away, expire_dropped, reap_predecessors, reap_stale
from session.resume import ResumeRecord
from session.state import Policy
from session.store import SessionStore, SessionSummary
from session.store.location import StoreLocation
from session.store.postgres import Availability
from session.store.reader import StoreReader
from session.store.writer import StoreWriter
from session.vocabulary import RECEIPT_OUTCOMES, OwnerId, Terminal
from telephony import events as ev
from telephony.endpoint import EndpointConfig, SipEndpoint
from telephony.sip_message import mask_uri
from voicegate.call.call_state import CallPhase
from voicegate.call.callback_keys import CallbackKeys
from voicegate.call.callbacks import Callbacks
from voicegate.call.clock import SessionClock
from voicegate.call.hangup import HangupPlan
from voicegate.call.legs import OutboundLeg, PlaceRefused, new_leg_offer
from voicegate.call.live_call import LiveCall
from voicegate.call.rejoin import Verdict
from voicegate.call.rejoins import Rejoins
from voicegate.call.store_outage import StoreOutage
from voicegate.call.transfer import TransferRefused
from voicegate.faults import Faults
from voicegate.observe.metrics import Metrics
from voicegate.tools.client import BadAnswer, ToolClient
from voicegate.tools.startup_reconcile import settle_lapsed_drops, settle_predecessors

log = logging.getLogger("voicegate.runtime")

T = TypeVar("T")

# After the grace period, calls still up get a BYE without waiting for their prompt; this is how
# long the runtime then waits for PJSIP to confirm them gone.
_FORCED_END_WAIT_S = 3.0
# A tick this late is logged: a blocked loop delays barge-in and playout for every call here.
LOOP_BLOCKED_S = 0.25
# How often the metrics counted in process (voicegate/observe/batched.py) reach prometheus.
METRICS_FLUSH_S = 1.0
# The call rates every prompt is converted to at start-up (a broken file fails start-up, not a
# call); the pool's fork server loads them at the same rates before it forks the workers.
PROMPT_RATES = (8000, 16000)


def inbound_vad(a: AudioSettings) -> VadConfig:
    """The caller's voice activity detector, as ``[audio]`` sets it."""
    return VadConfig(
        aggressiveness=a.vad_aggressiveness,
        frame_ms=a.vad_frame_ms,
        onset_ms=a.vad_onset_ms,
        hangover_ms=a.vad_hangover_ms,
        detector=a.vad_detector,
        margin_db=a.vad_margin_db,
        window_ms=a.vad_window_ms,
        floor_rise_db_s=a.vad_floor_rise_db_per_s,
    )


def endpoint_config(settings: Settings) -> EndpointConfig:
    sip, media = settings.sip, settings.media
    tenants = tenants_of(settings)
    pooled = settings.pool.workers > 1

    def follow_refer(tenant: str, target: str) -> bool:
        # Inbound REFER is policy (toll fraud): followed only when the call's tenant allows it
        # and its target.
        t = tenants.get(tenant)
        return t is not None and t.transfer.accept_inbound_refer and t.transfer.allows(target)

    return EndpointConfig(
        sip_address=sip.address,
        sip_port=sip.port,
        media_address=media.address,
        media_advertised_address=media.advertised_address,
        rtp_port_min=media.rtp_port_min,
        rtp_port_max=media.rtp_port_max,
        codecs=tuple(media.codecs),
        clock_rate=media.clock_rate,
        max_calls=settings.pool.calls_per_worker,
        max_setup_rate=sip.max_setup_rate,
        numbers=frozenset(sip.numbers),
        user_agent=sip.user_agent,
        pjsip_log_level=settings.log.pjsip_level,
        strict_source=media.strict_source_on,
        fast_copy=media.fast_frame_copy,
        media_port=media.port,
        inbound_vad=inbound_vad(settings.audio),
        gap_threshold_s=media.gap_threshold_s,
        session_expires_s=sip.session_expires_s,
        ack_timeout_s=sip.ack_timeout_s,
        playout_max_ms=round(settings.audio.playout_max_s * 1000),
        resample_quality=media.resample_quality,
        follow_refer=follow_refer
        if any(t.transfer.accept_inbound_refer for t in tenants)
        else None,
        route=tenants.route,
        # A pooled worker hears only its front door, which names the caller's source address.
        trusted_source_header=settings.pool.workers > 1 and settings.pool.front_door,
        # In a pool only the front door speaks TLS (docs/pool.md): a worker keeps its loopback
        # port, where the front door's X-Voicegate-Transport says which calls came over TLS.
        tls_port=0 if pooled else sip.tls_port,
        tls_cert_file="" if pooled else str(sip.tls_cert_file or ""),
        tls_key_file="" if pooled else str(sip.tls_key_file or ""),
        srtp=media.srtp,
        tls_tenants=frozenset(t.name for t in tenants if t.require_tls),
    )


def prompt_problems(settings: Settings) -> list[str]:
    """Prompts the config names that agent.prompts_dir does not hold, one line each naming the
    key and the fix (transfer.consult_brief, per tenant)."""
    prompts_dir = Path(settings.agent.prompts_dir or default_prompts_dir())
    library = PromptLibrary(prompts_dir)
    problems = []
    for tenant in tenants_of(settings):
        brief = tenant.transfer.consult_brief
        if brief and brief not in library:
            where = "transfer" if not settings.tenants else f"tenants.{tenant.name}.transfer"
            problems.append(
                f"{where}.consult_brief = {brief!r}: no {brief}.wav in {prompts_dir}: add the "
                "file, name another prompt, or set it empty for no brief"
            )
    return problems


def agent_factories(settings: Settings, metrics: Metrics | None = None) -> dict[str, AgentFactory]:
    """Each tenant's agent factory; raises AgentLoadError naming the key if one is unusable."""
    factories = {}
    for tenant in tenants_of(settings):
        try:
            factories[tenant.name] = agent_factory(
                dataclasses.replace(settings, agent=tenant.agent), metrics
            )
        except AgentLoadError as exc:
            if tenant.name == DEFAULT_TENANT and not settings.tenants:
                raise
            raise AgentLoadError(f"[tenants.{tenant.name}.agent]: {exc}") from exc
    return factories


def agent_factory(settings: Settings, metrics: Metrics | None = None) -> AgentFactory:
    """The factory of the configured agent; raises AgentLoadError naming the key if unusable."""
    if settings.agent.kind == "python":
        return load_factory(settings.agent.factory)
    if settings.agent.kind == "remote":
        a = settings.agent
        try:
            remote = remote_settings(
                a.url,
                a.secret,
                a.reconnect_deadline_s,
                a.ping_interval_s,
                a.max_protocol_errors,
                settings.audio.agent_rate,
                settings.audio.playout_max_s,
                a.ca_file,
            )
        except CaFileError as exc:
            raise AgentLoadError(str(exc)) from None
        return RemoteAgentFactory(remote, metrics or Metrics())
    if settings.agent.kind == "demo":
        return SpeakingDemoAgent if settings.agent.speech else DemoAgent
    raise ValueError(f"agent.kind {settings.agent.kind!r} has no implementation")


class Runtime:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        clock: SessionClock | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._clock = clock or SessionClock()
        self._wall = self._clock.wall
        data_dir = Path(settings.storage.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.location = location = StoreLocation.of(settings.storage)
        # Shared by this process's store objects: whether the database answers, since when.
        self.availability = availability = Availability()
        # Every write leaves the event loop, in order (session/store/writer.py); the writer's
        # store waits out a database that is away, so nothing queued is lost. Opening it checks
        # the schema (SchemaTooOld / SchemaTooNew: voicegate migrate).
        self.writer = StoreWriter(lambda: location.open(retry=True, availability=availability))
        # And so does every read (session/store/reader.py): a reader fails fast instead.
        self.reader = StoreReader(lambda: location.open(availability=availability))
        # While the store is away: new calls get 503, live calls walk seed 004's ladder.
        self.outage = StoreOutage(
            lambda: self.calls.values(),
            settings.storage.unavailable_deadline_s,
            self.metrics.store_outage_calls_ended.inc,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        availability.watch(self._store_changed)
        self.metrics.store_up.set(1)
        # "<worker>/<incarnation>": a restarted worker knows its predecessor's sessions are dead.
        self.owner = OwnerId(settings.session.worker_name, uuid.uuid4().hex[:12]).format()
        prompts_dir = settings.agent.prompts_dir or default_prompts_dir()
        self._prompts = PromptLibrary(Path(prompts_dir))
        self.tenants = tenants_of(settings)
        self._agent_factories = agent_factories(settings, self.metrics)
        if SpeakingDemoAgent in self._agent_factories.values():
            # A decoder for each call this process can hold, built now on the recognition
            # thread: building one during a call holds the GIL for 15 to 25 ms.
            prepare_speech(settings.pool.calls_per_worker)
        self.answer_after_s = settings.sip.answer_after_s
        self.resume_ttl_s = settings.session.resume_ttl_s
        # A crash window after a write is after it is durable: flush the writer first.
        self.faults = Faults(settings.faults.crash_at, before_crash=self.writer.flush)
        self.tools: Mapping[str, ToolSettings] = {tool.name: tool for tool in settings.tools}
        # Each tool's alerting series exist at 0 from the start, so that an alert on the first
        # increase sees it (a series born at 1 has no increase to Prometheus).
        for name in self.tools:
            self.metrics.tool_sends_repeated.labels(name)
            self.metrics.tool_receipt_conflicts.labels(name)
            self.metrics.tool_duplicates_prevented.labels(name)
            for outcome in (*RECEIPT_OUTCOMES, "refused"):
                self.metrics.tool_calls.labels(name, outcome)
            for bad in BadAnswer:
                self.metrics.tool_bad_answers.labels(name, bad)
        self.reconcile_timeout_s = settings.session.reconcile_timeout_s
        self.status_attempts = settings.session.status_attempts
        self._http: aiohttp.ClientSession | None = None
        self.tool_client: ToolClient
        self.calls: dict[str, LiveCall] = {}
        # Bridge legs (voicegate/call/bridge.py): leg id -> the call it belongs to, until the
        # leg's dialog has ended. Each holds a call slot.
        self.legs: dict[str, str] = {}
        # Calls that present a resume handle (voicegate/call/rejoins.py).
        self.rejoins = Rejoins(self, self._start_rejoined, self._wall)
        # Callers back after a drop (voicegate/call/callbacks.py), when the window is on.
        self.callback_keys = (
            CallbackKeys.in_directory(data_dir) if settings.session.callback_window_s > 0 else None
        )
        self.callbacks = (
            Callbacks(self, self.callback_keys, self._start_called_back, self._clock.now)
            if self.callback_keys is not None
            else None
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self.sip: SipEndpoint | None = None
        self.sip_ready = False
        self.draining = False
        self._ticker: asyncio.TimerHandle | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._store_watch: asyncio.Task[None] | None = None
        self._next_tick = 0.0
        self._tick_s = settings.audio.tick_ms / 1000
        self._barge_in_tick_s = settings.audio.barge_in_tick_ms / 1000
        self._tick_at = 0.0  # when the last tick was due
        self._quickened = False  # the armed tick was pulled in by quicken_media_tick
        self._flush_at = 0.0  # loop time of the next write of the batched metrics

    # --- CallServices ---------------------------------------------------------------------------

    def submit(self, command: ev.SipCommand) -> None:
        if self.sip is not None:
            self.sip.submit(command)

    def prompt(self, name: str, rate: int) -> NDArray[np.int16]:
        return self._prompts.get(name, rate)

    def audio_settings(self) -> tuple[int, VadConfig, BargeInConfig]:
        a = self.settings.audio
        vad = inbound_vad(a)
        barge = BargeInConfig(
            enabled=a.barge_in,
            min_speech_ms=a.barge_in_min_speech_ms,
            dtmf=a.barge_in_dtmf,
            turn_min_speech_ms=a.turn_min_speech_ms,
            false_window_ms=a.barge_in_false_window_ms,
        )
        return a.agent_rate, vad, barge

    def transfer_for(self, tenant: str) -> TransferSettings:
        return self.tenants[tenant].transfer

    def outbound_for(self, tenant: str) -> OutboundSettings:
        """The ``[outbound]`` settings of ``tenant`` (``[tenants.<name>.outbound]`` over the
        top-level section); the top level's for a tenant nobody declared."""
        found = self.tenants.get(tenant)
        return found.outbound if found is not None else self.settings.outbound

    def policy(self, tenant: str) -> dict[str, float]:
        s = self.settings.session
        policy = Policy(
            recovery_timeout_s=s.recovery_timeout_s,
            max_duration_s=s.max_duration_s,
            no_input_s=s.no_input_s,
            no_input_grace_s=s.no_input_grace_s,
            transfer_timeout_s=self.transfer_for(tenant).notify_timeout_s,
            resume_ttl_s=s.resume_ttl_s,
            callback_window_s=s.callback_window_s,
        )
        return dataclasses.asdict(policy)

    def record_effects(self, effects: list[fx.Effect]) -> None:
        """Metrics that follow from what sessions did (the log already holds the effects)."""
        m = self.metrics
        for effect in effects:
            match effect:
                case fx.Finished(terminal_state=terminal, stage=stage):
                    m.sessions_ended.labels(terminal).inc()
                    if terminal == Terminal.TIMED_OUT:
                        m.deadline_endings.labels(stage or "unknown").inc()
                    if terminal == Terminal.NEEDS_HUMAN:
                        # The stage says why: reconciliation (unknown outcome), hangup, transfer.
                        m.needs_human.labels(stage or "unknown").inc()
                case fx.GateChanged(frozen_s=frozen_s) if frozen_s > 0:
                    m.gate_frozen_seconds.inc(frozen_s)
                case fx.RecoveryFinished(interruptions=kinds, outcome=outcome, duration_s=d):
                    kind = "+".join(kinds)
                    m.recoveries.labels(kind, outcome).inc()
                    m.recovery_duration.labels(kind).observe(d)
                case fx.TransferEnded(mode=mode, outcome=outcome, duration_s=d) if mode:
                    # (A checkpoint from before transfers were a phase of their own has no mode.)
                    m.transfer_duration.labels(mode, outcome).observe(d)
                case fx.StaleEventIgnored(event_type=event_type):
                    m.stale_events.labels(event_type).inc()
                case _:
                    pass

    async def read(self, job: Callable[[SessionStore], T]) -> T:
        """``job(store)`` on a reader thread: no store call runs on the event loop."""
        return await asyncio.wrap_future(self.reader.submit(job))

    async def write(self, job: Callable[[SessionStore], T]) -> T:
        """``job(store)`` on the writer thread, after every write submitted before it."""
        return await asyncio.wrap_future(self.writer.submit(job))

    def _store_changed(self, available: bool) -> None:
        # From the store thread that noticed: hand it to the loop (gone after shutdown).
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._on_store_changed, available)

    def _on_store_changed(self, available: bool) -> None:
        self.metrics.store_up.set(1 if available else 0)
        self.submit(ev.StoreAvailability(available))
        if available:
            log.warning("store.available", extra={"store": self.location.describe()})
        else:
            self.metrics.store_outages.inc()
            log.error("store.unavailable", extra={"store": self.location.describe()})
        self.outage.check(self.store_down_for())

    async def _watch_store(self) -> None:
        """Every half second while the store is away: the live calls' ladder of honesty."""
        while True:
            await asyncio.sleep(0.5)
            down_for = self.store_down_for()
            if down_for is not None:
                self.metrics.store_unavailable_seconds.inc(0.5)
            self.outage.check(down_for)

    def store_down_for(self) -> float | None:
        """Seconds since the session store stopped answering; None while it answers."""
        return self.availability.down_for()

    async def record_resume(self, record: ResumeRecord) -> None:
        await asyncio.wrap_future(self.writer.submit(lambda store: store.record_handle(record)))
        self.metrics.resume_issued.labels("api").inc()

    async def settle_lapsed_drops(self) -> None:
        """A dropped caller who never called back: what its write came to is asked by key
        before the session may end (expire_dropped waits for it). Only on the sweeps, never on
        an API read: a status query may take session.reconcile_timeout_s."""
        settled = await settle_lapsed_drops(
            self.write, self.tool_client, self.tools, me=self.owner,
            attempts=self.status_attempts, deadline_s=self.reconcile_timeout_s,
            record_effects=self.record_effects, on_outcome=self._count_reconciled,
            now=self._wall,
        )  # fmt: skip
        if settled:
            log.warning("reconcile.lapsed_drops", extra={"settled": settled})

    async def reap(self, *, now: float | None = None) -> list[str]:
        """Finalise sessions whose process stopped (seed 004's reaper); safe to call any time.
        The writes run on the store's writer thread, never on the event loop."""
        me, at, after_s = self.owner, now or self._wall(), self.settings.session.reap_after_s
        reaped = await asyncio.wrap_future(
            self.writer.submit(
                lambda store: reap_stale(store, me=me, now=at, stale_after_s=after_s)
            )
        )
        if reaped:
            self.metrics.sessions_reaped.labels("stale").inc(len(reaped))
            self.metrics.sessions_ended.labels(Terminal.FAILED).inc(len(reaped))
        await self.expire_parked(now=at)
        return reaped

    async def expire_parked(self, *, now: float | None = None) -> None:
        """End the parked sessions whose time is over: on every heartbeat (a cheap listing),
        so an away or dropped session ends within session.heartbeat_s of its deadline."""
        me, at = self.owner, now or self._wall()
        # Transferred sessions nobody came back to (session/away.py): completed, not reaped.
        expired = await asyncio.wrap_future(
            self.writer.submit(lambda store: expire_away(store, me=me, now=at))
        )
        if expired:
            self.metrics.sessions_ended.labels(Terminal.COMPLETED).inc(len(expired))
        # Dropped sessions nobody called back (session/callback.py): timed out, as at the drop.
        # Each with its own ending: timed_out after media lost, failed after its process died.
        lapsed: list[str | None] = await asyncio.wrap_future(
            self.writer.submit(lambda store: _endings(store, expire_dropped(store, me=me, now=at)))
        )
        for terminal_state in lapsed:
            self.metrics.sessions_ended.labels(terminal_state or Terminal.TIMED_OUT).inc()

    # --- lifecycle ------------------------------------------------------------------------------

    def _http_session(self) -> aiohttp.ClientSession:
        # The two crash windows inside an HTTP exchange hook into aiohttp's tracing: the request
        # body has been written to the socket; the provider's response has begun to arrive
        # (it commits before it answers) but voicegate has not read or recorded it.
        trace = aiohttp.TraceConfig()

        def is_tool_request(ctx: object) -> bool:
            request = getattr(ctx, "trace_request_ctx", None)
            return isinstance(request, dict) and "key" in request

        async def on_chunk_sent(
            session: aiohttp.ClientSession, ctx: object, params: object
        ) -> None:
            if is_tool_request(ctx):
                self.faults.reached("after_request_send")

        async def on_request_end(
            session: aiohttp.ClientSession, ctx: object, params: object
        ) -> None:
            if is_tool_request(ctx):
                self.faults.reached("after_provider_commit")

        trace.on_request_chunk_sent.append(on_chunk_sent)
        trace.on_request_end.append(on_request_end)
        return aiohttp.ClientSession(trace_configs=[trace])

    def _count_reconciled(self, tool: str, outcome: str) -> None:
        self.metrics.reconciliations.labels(outcome).inc()
        self.metrics.tool_calls.labels(tool, outcome).inc()

    async def start(self) -> None:
        """Settle and finalise what a dead predecessor left open, then start taking calls."""
        self._loop = asyncio.get_running_loop()
        self._http = self._http_session()
        self.tool_client = ToolClient(self._http, self.metrics)
        settled = await settle_predecessors(
            self.write,
            self.tool_client,
            self.tools,
            prefix=OwnerId.prefix(self.settings.session.worker_name),
            me=self.owner,
            attempts=self.status_attempts,
            deadline_s=self.reconcile_timeout_s,
            record_effects=self.record_effects,
            on_outcome=self._count_reconciled,
            now=self._clock.now,
        )
        if settled:
            log.warning("reconcile.startup", extra={"settled": settled})
        worker, me, at = self.settings.session.worker_name, self.owner, self._wall()
        predecessors = await self.write(
            lambda store: reap_predecessors(store, worker=worker, me=me, now=at)
        )
        if predecessors:
            self.metrics.sessions_reaped.labels("predecessor").inc(len(predecessors))
            # The reaper ends every session it finalises as failed (stage "process").
            self.metrics.sessions_ended.labels(Terminal.FAILED).inc(len(predecessors))
            log.warning("sessions.reaped_at_startup", extra={"count": len(predecessors)})
        await self.settle_lapsed_drops()
        await self.reap()
        # Load the prompts now so a broken prompt file fails start-up, not a call.
        for rate in PROMPT_RATES:
            self._prompts.load_all(rate)
        loop = asyncio.get_running_loop()
        self.sip = SipEndpoint(endpoint_config(self.settings), loop, self._on_sip_event)
        await self.sip.start()
        self._arm_ticker()
        self._housekeeping = asyncio.create_task(self._keep_house(), name="housekeeping")
        self._store_watch = asyncio.create_task(self._watch_store(), name="store-watch")

    async def _keep_house(self) -> None:
        """Heartbeat the live sessions and end the parked ones whose time is over; now and then,
        reap sessions whose process is gone."""
        session = self.settings.session
        sweep_every = max(1, int(session.reap_after_s / 4 / session.heartbeat_s))
        beats = 0
        while True:
            await asyncio.sleep(session.heartbeat_s)
            for call in list(self.calls.values()):
                call.touch()
            beats += 1
            if beats % sweep_every == 0:
                await self.settle_lapsed_drops()
                await self.reap()
            else:
                await self.expire_parked()

    def _arm_ticker(self) -> None:
        if self._ticker is None:
            loop = asyncio.get_running_loop()
            self._next_tick = loop.time() + self._tick_s
            self._ticker = loop.call_at(self._next_tick, self._tick)

    def _tick(self) -> None:
        self._ticker = None
        if not self.calls:
            # Idle: no wake-ups until the next call (a pool has many idle workers).
            return
        loop = asyncio.get_running_loop()
        for call in self.calls.values():
            call.tick()
        # How late this tick ran is how long something held the loop (every call's audio
        # decisions wait behind it); measured on the tick, so it costs no wake-up of its own.
        now = loop.time()
        lag = now - self._next_tick
        self.metrics.loop_lag.observe(max(lag, 0.0))
        if lag > LOOP_BLOCKED_S:
            log.warning("loop.blocked", extra={"late_ms": round(lag * 1000, 1)})
        self.metrics.media_ticks.labels("barge_in" if self._quickened else "steady").inc()
        if now >= self._flush_at:
            self.metrics.frame_pipeline.flush()
            self._flush_at = now + METRICS_FLUSH_S
        self._quickened = False
        self._tick_at = self._next_tick
        # Re-arm on the grid; if the loop stalled, skip the missed ticks rather than firing them
        # in a burst (the inbound ring holds the audio meanwhile).
        self._next_tick += self._tick_s
        if self._next_tick < now:
            self._next_tick = now + self._tick_s
        self._ticker = loop.call_at(self._next_tick, self._tick)

    def quicken_media_tick(self) -> None:
        # A long tick saves a wake-up per tick per process and costs up to a tick of barge-in
        # latency: while some caller may be starting to talk over a response (a few hundred ms
        # now and then), the tick after this one comes barge_in_tick_ms after it instead.
        due = self._tick_at + self._barge_in_tick_s
        if self._ticker is None or due >= self._next_tick:
            return
        self._ticker.cancel()
        self._next_tick = due
        self._quickened = True
        self._ticker = asyncio.get_running_loop().call_at(due, self._tick)

    def _on_sip_event(self, event: ev.SipEvent) -> None:
        match event:
            case ev.TransportsUp(
                addresses=addresses, fast_copy=fast, media_port=port, c_detector=c_detector
            ):
                self.sip_ready = True
                self.metrics.sip_ready.set(1)
                self.metrics.fast_frame_copy.set(1 if fast else 0)
                self.metrics.c_media_port.set(1 if port == "c" else 0)
                self.metrics.c_detector.set(1 if c_detector else 0)
                log.info(
                    "sip.ready",
                    extra={
                        "addresses": list(addresses),
                        "fast_copy": fast,
                        "media_port": port,
                        "c_detector": c_detector,
                    },
                )
            case ev.TransportsDown(reason=reason):
                self.sip_ready = False
                self.metrics.sip_ready.set(0)
                log.info("sip.down", extra={"reason": reason})
            case ev.CallRefused(status=status, reason=reason, remote_uri=remote):
                self.metrics.calls_refused.labels(reason, str(status)).inc()
                log.info(
                    "call.refused",
                    extra={"status": status, "reason": reason, "caller": mask_uri(remote)},
                )
            case ev.CallOffered(resume=resume):
                if resume is not None:
                    self.rejoins.offered(event)
                elif self.callbacks is None or not self.callbacks.offered(event):
                    self._start_call(event)
            case ev.CallReferred():
                self._start_referred(event)
            case ev.DialogEndedLocally():
                self.metrics.dialogs_ended_locally.inc()
                log.info("sip.dialog_ended_locally", extra={"why": "nobody answered its BYE"})
            case ev.DialogLingers(sip_call_id=sip_call_id):
                log.debug(
                    "sip.dialog_lingers",
                    extra={
                        "sip_call_id": sip_call_id,
                        "why": "its BYE was answered; a subscription (a REFER's) keeps it",
                    },
                )
            case ev.AckTimedOut(call_id=call_id, after_s=after_s):
                self.metrics.calls_half_open.inc()
                log.warning("call.no_ack", extra={"call_id": call_id, "after_s": after_s})
            case ev.MediaSourceLocked(call_id=call_id, source=source):
                log.info("media.source_locked", extra={"call_id": call_id, "source": source})
            case ev.ForeignRtp(call_id=call_id, packets=packets):
                self.metrics.rtp_foreign_packets.inc(packets)
                log.warning(
                    "media.foreign_rtp",
                    extra={
                        "call_id": call_id,
                        "packets": packets,
                        "why": "RTP from a source other than the caller's: dropped unread",
                    },
                )
            case _:
                call_id = getattr(event, "call_id", "")
                call = self.calls.get(call_id)
                if call is None and call_id in self.rejoins:
                    call = self.rejoins.route(call_id, event)
                elif call is None and self.callbacks is not None and call_id in self.callbacks:
                    call = self.callbacks.route(call_id, event)
                elif call is None and call_id in self.legs:
                    # A bridge's leg: its call handles it (voicegate/call/bridge.py).
                    call = self.calls.get(self.legs[call_id])
                    if isinstance(event, ev.CallEnded):
                        del self.legs[call_id]
                if call is not None:
                    call.deliver(event)

    async def place_call(
        self,
        target: str,
        headers: tuple[tuple[str, str], ...] = (),
        *,
        tenant: str = DEFAULT_TENANT,
    ) -> str | PlaceRefused:
        """Place an outbound call to ``target`` (voicegate/call/legs.py) for ``tenant``, whose
        agent answers it: its session id once its session is durable (so ``/v1/sessions/{id}``
        finds it; the INVITE follows), else why not."""
        if self.tenants.get(tenant) is None:
            # An open API (no keys) over tables that declare no "default" tenant.
            return PlaceRefused(
                403, f"no tenant {tenant!r} to place the call for: use a tenant's API key"
            )
        outbound = self.outbound_for(tenant)
        if not outbound.allows(target):
            return PlaceRefused(403, "target is not in outbound.allowed_targets", "target")
        if self.draining or not self.sip_ready:
            return PlaceRefused(503, "the server is not taking calls (draining or starting)")
        max_calls = self.settings.pool.calls_per_worker
        if self.free_slots() < 1:
            held = max_calls - self.free_slots()
            return PlaceRefused(
                503, f"no free call slot: {held} of {max_calls} call slots are held here"
            )
        offer = dataclasses.replace(new_leg_offer(target), tenant=tenant)
        leg = OutboundLeg(target, outbound.ring_timeout_s, headers, outbound.caller_id)
        call = self._start_call(offer, leg)
        await call.session_started.wait()  # set by the call's task however it ends (_run_call)
        if call.session is None:
            return PlaceRefused(503, "the call's session could not be started (see the log)")
        return offer.call_id

    def _start_referred(self, event: ev.CallReferred) -> None:
        """A followed inbound REFER's new call gets a session and its tenant's agent, like a
        call of POST /v1/calls whose INVITE pjsua already sent (voicegate/call/legs.py)."""
        offer = dataclasses.replace(
            new_leg_offer(event.target), call_id=event.call_id, tenant=event.tenant
        )
        outbound = self.outbound_for(event.tenant)
        leg = OutboundLeg(event.target, outbound.ring_timeout_s, referred_by=event.referred_by)
        self._start_call(offer, leg)

    def free_slots(self) -> int:
        offering = len(self.callbacks) if self.callbacks is not None else 0
        return self.settings.pool.calls_per_worker - len(self.calls) - len(self.legs) - offering

    def caller_key(self, offer: ev.CallOffered) -> str:
        return self.callbacks.caller_key(offer) if self.callbacks is not None else ""

    def adopt_leg(self, leg_id: str, call_id: str) -> None:
        self.legs[leg_id] = call_id

    def _start_rejoined(self, offer: ev.CallOffered, verdict: Verdict) -> LiveCall:
        return self._start_call(offer, rejoin=verdict)

    def _start_called_back(
        self, offer: ev.CallOffered, verdict: Verdict | None, early: tuple[ev.SipEvent, ...]
    ) -> LiveCall:
        """A call that was offered a callback: it continues the dropped session (``verdict``)
        or starts a new one, with what PJSIP reported meanwhile (its answer and media)."""
        call = self._start_call(offer, rejoin=verdict)
        call.answered_early = any(isinstance(e, ev.CallAnswered) for e in early)
        for event in early:
            call.deliver(event)
        return call

    def _start_call(
        self,
        offer: ev.CallOffered,
        outbound: OutboundLeg | None = None,
        *,
        rejoin: Verdict | None = None,
    ) -> LiveCall:
        factory = self._agent_factories[offer.tenant]
        call = LiveCall(offer, self, factory, self._clock, outbound, rejoin)
        self.calls[call.call_id] = call
        self._arm_ticker()
        task = asyncio.create_task(self._run_call(call), name=f"call-{call.call_id[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.draining:
            call.end(
                HangupPlan("canceled", "server shutting down"), after_playout=False, status=503
            )
        return call

    async def _run_call(self, call: LiveCall) -> None:
        try:
            await call.run()
        except Exception:
            log.exception("call.crashed", extra={"call_id": call.call_id})
            call.end(HangupPlan("canceled", "internal error"), after_playout=False)
        finally:
            call.session_started.set()
            self.calls.pop(call.call_id, None)
            if not self.calls:
                # No tick runs until the next call: write this one's last frames now.
                self.metrics.frame_pipeline.flush()
            self.outage.forget(call.call_id)
            if call.rejoin is not None:
                self.rejoins.ended(call.call_id)
                if self.callbacks is not None:
                    self.callbacks.ended(call.call_id)

    def node_of(self, owner: str | None) -> str | None:
        return None  # one process is no cluster's node (voicegate/pool/cluster.py)

    def is_live(self, summary: SessionSummary) -> bool:
        return summary.session_id in self.calls

    def hang_up(self, call_id: str, reason: str) -> bool:
        """End a live call now (BYE, or a refusal if it is not answered yet); False if unknown."""
        call = self.calls.get(call_id)
        if call is None:
            return False
        # 480 Temporarily Unavailable for one still ringing; an answered call gets a BYE.
        call.end(HangupPlan("canceled", reason), after_playout=False, status=480)
        return True

    def transfer(
        self, call_id: str, target: str | None, mode: str | None, complete: str | None = None
    ) -> TransferRefused | None:
        """Start a transfer of a live call; None once under way, else why not (404 for a call
        that is not live here). ``complete``: an attended transfer's consult_complete for this
        transfer only."""
        call = self.calls.get(call_id)
        if call is None:
            return TransferRefused(404, "no such live call here", "call_id")
        return call.transfer.start(target, mode, complete)

    def consultation(self, call_id: str, action: str) -> TransferRefused | None:
        """Complete (``complete``) or call off (``cancel``) a live call's attended transfer
        while it consults the target; None once done, else why not (404: not live here)."""
        call = self.calls.get(call_id)
        if call is None:
            return TransferRefused(404, "no such live call here", "call_id")
        return call.transfer.complete() if action == "complete" else call.transfer.cancel()

    def live_calls(self) -> list[dict[str, object]]:
        return [call.snapshot() for call in self.calls.values()]

    async def shutdown(
        self, *, drain_s: float = 0.0, skip_drain: asyncio.Event | None = None
    ) -> None:
        """Staged shutdown: refuse new calls, let live calls finish for up to ``drain_s`` (or
        until ``skip_drain`` is set), then tell the callers still on the line and BYE them, then
        stop PJSIP.

        Every live call ends with a recorded terminal state: its own, or ``canceled`` (reason
        "server shutting down") within ``drain_s`` plus ``sip.shutdown_grace_s`` plus a few seconds.
        """
        if self.draining:
            return
        # New calls get 503 (a front door tries elsewhere) and /readyz turns 503.
        self.draining = True
        self.submit(ev.Drain())
        log.info("drain.begin", extra={"live_calls": len(self.calls)})
        if self.calls and drain_s > 0:
            waits: list[asyncio.Future[object]] = [
                asyncio.ensure_future(self._wait_calls_done(drain_s))
            ]
            if skip_drain is not None:
                waits.append(asyncio.ensure_future(skip_drain.wait()))
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()
            log.info("drain.end", extra={"live_calls": len(self.calls)})
        log.info("shutdown.begin", extra={"live_calls": len(self.calls)})
        intent = HangupPlan("canceled", "server shutting down")
        for call in list(self.calls.values()):
            if call.phase is CallPhase.ANSWERED:
                call.stop_playback()
                # A notice of the system, not an agent response: the caller's speech does not
                # barge in on it (it says why the call ends).
                call.announce("shutting_down")
                call.end(intent, after_playout=True)
            else:
                call.end(intent, after_playout=False, status=503)
        await self._wait_calls_done(self.settings.sip.shutdown_grace_s)
        for call in list(self.calls.values()):
            call.end(intent, after_playout=False)
        await self._wait_calls_done(_FORCED_END_WAIT_S)
        self.metrics.frame_pipeline.flush()
        await self.rejoins.stop()
        if self.callbacks is not None:
            await self.callbacks.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._ticker is not None:
            self._ticker.cancel()
        for keeper in (self._housekeeping, self._store_watch):
            if keeper is not None:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
        if self.sip is not None:
            await self.sip.stop()
        if self._http is not None:
            await self._http.close()
        if self.availability.down_for() is not None:
            # The database is away: what is still queued cannot be written. Stop waiting for it;
            # nothing acted on it (persist, then act), and whoever takes the sessions over
            # settles them from what is durable.
            log.error("shutdown.store_unavailable", extra={"store": self.location.describe()})
            self.availability.stopping.set()
        await asyncio.to_thread(self.writer.close)
        await asyncio.to_thread(self.reader.close)
        log.info("shutdown.done")

    async def _wait_calls_done(self, within_s: float) -> None:
        waiters = [call.done.wait() for call in self.calls.values()]
        if waiters:
            await asyncio.wait(
                [asyncio.ensure_future(w) for w in waiters], timeout=max(within_s, 0.0)
            )


def _endings(store: SessionStore, session_ids: list[str]) -> list[str | None]:
    summaries = [store.get(sid) for sid in session_ids]
    return [summary.terminal_state if summary else None for summary in summaries]
