"""The SIP thread: the one thread that owns pjsua2 in this process.

pjsua2's Endpoint is a process singleton and is not safe to call from other threads
(shared/notes/pjsua2.md, "Threading"), so this thread creates the library, polls it with
``libHandleEvents``, runs every pjsua2 callback, and executes the commands asyncio queues for it.
Events go the other way with ``loop.call_soon_threadsafe``. Nothing here decides a business
outcome: it answers, refuses and hangs up as told, and reports what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pjsua2 as pj

from audio.playout import Playout
from telephony import events as ev
from telephony.admission import Admission
from telephony.c_media_port import (
    BridgeError,
    CMediaPort,
    CPortLibrary,
    CPortUnavailable,
    self_test,
)
from telephony.frame_copy import Copier, select_copier
from telephony.media_bridge import MediaBridge, MediaChannel
from telephony.media_health import MediaHealth
from telephony.sip_message import mask_uri, request_user, via_transport
from telephony.sip_wake import SipWaker
from telephony.thread_state import ThreadStatePins

log = logging.getLogger("voicegate.sip")

_POLL_MS = 10
# With nothing due, the SIP thread blocks this long at most: SIP traffic and SipWaker's keep-alive
# wake it sooner. The bound only matters if a wake-up is lost.
_IDLE_WAIT_MS = 1000
# Media ports of ended calls are kept this long after DISCONNECTED: the media clock thread may
# still call them back during the current tick (notes: "Lifetimes and the GIL").
_GRAVEYARD_S = 2.0
_CODEC_IDS = {"PCMU": "PCMU/8000/1", "PCMA": "PCMA/8000/1", "G722": "G722/16000/1"}


# A port on the bridge: pjsua2's Python port, or the C one (telephony.c_media_port).
MediaPort = MediaBridge | CMediaPort


class TelephonyStartError(RuntimeError):
    """The SIP stack could not start (address in use, bad address, ...)."""


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """What the SIP thread needs, flattened from the settings so this layer does not import them."""

    sip_address: str
    sip_port: int
    media_address: str
    media_public_address: str
    rtp_port_min: int
    rtp_port_max: int
    codecs: tuple[str, ...]
    clock_rate: int
    max_calls: int
    max_setup_rate: float
    numbers: frozenset[str]
    user_agent: str
    pjsip_log_level: int = 1
    fast_copy: bool = True
    gap_threshold_s: float = 1.0
    session_expires_s: int = 1800
    playout_max_ms: int = 60_000
    health_poll_s: float = 0.2
    resample_quality: int = 8
    media_port: str = "c"


class _LogWriter(pj.LogWriter):  # type: ignore[misc]
    _LEVELS = (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)

    def write(self, entry: Any) -> None:
        level = self._LEVELS[min(entry.level, len(self._LEVELS) - 1)]
        logging.getLogger("pjsip").log(level, entry.msg.rstrip())


class _Account(pj.Account):  # type: ignore[misc]
    def __init__(self, owner: SipEndpoint) -> None:
        super().__init__()
        self._owner = owner

    def onIncomingCall(self, prm: Any) -> None:
        self._owner._on_incoming(self, prm)


class _Endpoint(pj.Endpoint):  # type: ignore[misc]
    def __init__(self, owner: SipEndpoint) -> None:
        super().__init__()
        self._owner = owner

    def onRejectedIncomingCall(self, prm: Any) -> None:
        # PJSIP's own refusals, made before any call object exists. Above all 486 when every call
        # slot is taken: uaConfig.maxCalls is sip.max_calls (clamped to the wheel's
        # PJSUA_MAX_CALLS), so PJSIP enforces our ceiling statelessly, before opening any socket.
        reason = "capacity" if prm.statusCode == 486 else f"pjsip_{prm.statusCode}"
        self._owner._post(ev.CallRefused(prm.statusCode, reason, prm.remoteInfo))


class _Call(pj.Call):  # type: ignore[misc]
    def __init__(self, owner: SipEndpoint, account: _Account, index: int) -> None:
        super().__init__(account, index)
        self.owner = owner
        self.call_id = uuid.uuid4().hex
        self.accepted = False
        self.answered = False
        self.local_hangup = False
        self.bridge: MediaPort | None = None
        self.audio: Any = None
        self.media_index = -1
        self.held = False
        self.reinvite_pending = False
        self.health: MediaHealth | None = None
        self.remote_uri = ""

    def onCallState(self, prm: Any) -> None:
        self.owner._on_call_state(self)

    def onCallMediaState(self, prm: Any) -> None:
        self.owner._on_media_state(self)

    def onCallRxReinvite(self, prm: Any) -> None:
        if self.accepted and self.answered:
            self.reinvite_pending = True
            self.owner._post(ev.ReinviteStarted(self.call_id))

    def onCallTsxState(self, prm: Any) -> None:
        # A re-INVITE we answered with an error leaves the old media in place (RFC 6141);
        # onCallMediaState then never comes, so the failure is reported from here.
        if not self.reinvite_pending:
            return
        tsx = prm.e.body.tsxState.tsx
        if tsx.method == "INVITE" and tsx.role == pj.PJSIP_ROLE_UAS and tsx.statusCode >= 300:
            self.reinvite_pending = False
            self.owner._post(ev.ReinviteFinished(self.call_id, ok=False))

    def onDtmfDigit(self, prm: Any) -> None:
        if self.accepted:
            method = "rfc2833" if prm.method == pj.PJSUA_DTMF_METHOD_RFC2833 else "sip-info"
            self.owner._post(ev.DtmfReceived(self.call_id, prm.digit, method))


class SipEndpoint:
    """Runs pjsua2 on its own thread; asyncio talks to it with :meth:`submit` and events."""

    def __init__(
        self,
        config: EndpointConfig,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[ev.SipEvent], None],
    ) -> None:
        self.config = config
        self._loop = loop
        self._on_event = on_event
        self.thread_states = ThreadStatePins()
        self._commands: queue.SimpleQueue[ev.SipCommand | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="sip", daemon=True)
        self._ready = threading.Event()
        self._start_error: str | None = None
        self._stop = threading.Event()
        self._waker = SipWaker(config.sip_address, config.sip_port)
        self.admission = Admission(
            max_calls=config.max_calls, rate=config.max_setup_rate, numbers=config.numbers
        )
        # SIP-thread state.
        self._ep: _Endpoint | None = None
        self._account: _Account | None = None
        self._log_writer: _LogWriter | None = None
        self._copier: Copier | None = None
        # Every pjsua2 Call wrapper lives in exactly one of these until PJSIP reports it
        # DISCONNECTED, and is dropped right then (see _on_call_state for why).
        self._calls: dict[str, _Call] = {}
        self._refusing: dict[str, _Call] = {}
        self._held: list[tuple[float, _Call, int]] = []
        # Ports of ended calls wait here a moment, then go back to the free pool. Every port runs
        # at the bridge's rate (media.clock_rate), so any free port serves any call.
        self._graveyard: list[tuple[float, MediaPort]] = []
        self._free_ports: list[MediaPort] = []
        self._all_ports: list[MediaPort] = []
        # Set when calls get C ports (media.port = "c" and the start-up check passed).
        self._c_ports: tuple[CPortLibrary, int] | None = None

    # --- asyncio side -------------------------------------------------------------------------

    async def start(self, within_s: float = 15.0) -> None:
        """Start the SIP thread; return once transports are bound, raise if they cannot be."""
        self._thread.start()
        ready = await asyncio.to_thread(self._ready.wait, within_s)
        if not ready:
            raise TelephonyStartError(f"the SIP stack did not start within {within_s:.0f} s")
        if self._start_error is not None:
            raise TelephonyStartError(self._start_error)

    def submit(self, command: ev.SipCommand) -> None:
        """Queue a command for the SIP thread and wake it (telephony.sip_wake)."""
        self._commands.put(command)
        self._waker.wake()

    async def stop(self, within_s: float = 10.0) -> None:
        """Hang up whatever is left, destroy the library and join the thread."""
        self._stop.set()
        self._commands.put(None)
        self._waker.wake()
        await asyncio.to_thread(self._thread.join, within_s)
        self._waker.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # --- SIP thread ---------------------------------------------------------------------------

    def _post(self, event: ev.SipEvent) -> None:
        # RuntimeError: the loop is closed; the process is going down and nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._on_event, event)

    def _run(self) -> None:
        try:
            self._start_library()
        except pj.Error as exc:
            self._start_error = f"{exc.title}: {exc.reason} ({exc.srcFile}:{exc.srcLine})"
            self._destroy_library()
            self._ready.set()
            return
        assert self._copier is not None
        addresses = tuple(
            f"{proto}:{self.config.sip_address}:{self.config.sip_port}" for proto in ("udp", "tcp")
        )
        self._post(
            ev.TransportsUp(addresses, self._copier.fast, "c" if self._c_ports else "python")
        )
        self._ready.set()
        try:
            self._loop_until_stopped()
        finally:
            self._destroy_library()
            self._post(ev.TransportsDown("stopped"))

    def _loop_until_stopped(self) -> None:
        assert self._ep is not None
        next_health = time.monotonic()
        while not self._stop.is_set():
            self._ep.libHandleEvents(self._wait_ms(time.monotonic(), next_health))
            self._run_commands()
            now = time.monotonic()
            self._release_due(now)
            if now >= next_health:
                next_health = now + self.config.health_poll_s
                self._poll_media_health(now)

    def _wait_ms(self, now: float, next_health: float) -> int:
        """How long the SIP thread may block: until the next thing of its own falls due."""
        due = now + _IDLE_WAIT_MS / 1000
        if self._calls:
            due = min(due, next_health)
        if self._held:
            due = min(due, min(item[0] for item in self._held))
        if self._graveyard:
            due = min(due, self._graveyard[0][0])
        return max(1, math.ceil((due - now) * 1000 - 1e-6))

    def _poll_media_health(self, now: float) -> None:
        """Read each call's received-packet counter; report gaps, returns and holds."""
        for call in self._calls.values():
            if call.media_index < 0 or not call.answered:
                continue
            try:
                packets = call.getStreamStat(call.media_index).rtcp.rxStat.pkt
            except pj.Error:
                continue  # the stream is being replaced (re-INVITE); next poll sees the new one
            if call.health is None:
                call.health = MediaHealth(self.config.gap_threshold_s, now)
            change = call.health.observe(packets, now, held=call.held)
            if change is not None:
                self._post(ev.MediaHealthChanged(call.call_id, change.new.value, change.since))

    def _start_library(self) -> None:
        cfg = self.config
        self._ep = ep = _Endpoint(self)
        ep.libCreate()
        ep_cfg = pj.EpConfig()
        ep_cfg.uaConfig.threadCnt = 0
        ep_cfg.uaConfig.mainThreadOnly = True
        ep_cfg.uaConfig.maxCalls = cfg.max_calls
        ep_cfg.uaConfig.userAgent = cfg.user_agent
        self._log_writer = _LogWriter()
        ep_cfg.logConfig.writer = self._log_writer
        ep_cfg.logConfig.level = cfg.pjsip_log_level
        ep_cfg.logConfig.consoleLevel = 0
        ep_cfg.logConfig.msgLogging = cfg.pjsip_log_level >= 4
        ep_cfg.medConfig.clockRate = cfg.clock_rate
        ep_cfg.medConfig.sndClockRate = cfg.clock_rate
        ep_cfg.medConfig.noVad = True
        ep_cfg.medConfig.quality = cfg.resample_quality
        ep_cfg.medConfig.ptime = 20
        ep_cfg.medConfig.audioFramePtime = 20
        ep.libInit(ep_cfg)
        # No sound card: the null device drives the conference bridge's 20 ms clock.
        ep.audDevManager().setNullDev()
        ipv6 = ":" in cfg.sip_address
        for kind in (
            pj.PJSIP_TRANSPORT_UDP6 if ipv6 else pj.PJSIP_TRANSPORT_UDP,
            pj.PJSIP_TRANSPORT_TCP6 if ipv6 else pj.PJSIP_TRANSPORT_TCP,
        ):
            tcfg = pj.TransportConfig()
            tcfg.port = cfg.sip_port
            tcfg.boundAddress = cfg.sip_address
            ep.transportCreate(kind, tcfg)
        ep.libStart()
        self._set_codec_priorities(ep)
        self._copier = select_copier(pj.ByteVector, allow_fast=cfg.fast_copy)
        if not self._copier.fast and cfg.fast_copy:
            log.warning("fast frame copy failed verification; using the slow copy")
        if cfg.media_port == "c":
            self._start_c_ports()
        host = f"[{cfg.sip_address}]" if ipv6 else cfg.sip_address
        acc_cfg = pj.AccountConfig()
        acc_cfg.idUri = f"sip:voicegate@{host}:{cfg.sip_port}"
        media_tp = acc_cfg.mediaConfig.transportConfig
        media_tp.boundAddress = cfg.media_address
        media_tp.publicAddress = cfg.media_public_address or cfg.media_address
        media_tp.port = cfg.rtp_port_min
        media_tp.portRange = cfg.rtp_port_max - cfg.rtp_port_min
        # RFC 4028: offered and accepted when the caller supports it; PJSIP refreshes when it is
        # the refresher and ends the dialog (408, BYE) when no refresh comes.
        acc_cfg.callConfig.timerUse = pj.PJSUA_SIP_TIMER_OPTIONAL
        acc_cfg.callConfig.timerSessExpiresSec = cfg.session_expires_s
        acc_cfg.callConfig.timerMinSESec = 90
        self._account = _Account(self)
        self._account.create(acc_cfg, True)

    def _start_c_ports(self) -> None:
        """Use C ports if this build has them and two of them pass a frame across the bridge."""
        rate = self.config.clock_rate
        try:
            lib = CPortLibrary.load()
            pool = lib.pool("voicegate-ports")
            pair = [CMediaPort(lib, pool, f"vg-{i}-{rate}", rate) for i in range(2)]
            passed = self_test(lib, pair[0], pair[1])
        except (CPortUnavailable, BridgeError, OSError) as exc:
            log.warning("C media port unavailable, using the Python port: %s", exc)
            return
        if not passed:
            log.warning("C media port failed its bridge check, using the Python port")
            return
        self._c_ports = (lib, pool)
        for port in pair:
            port.attach(MediaChannel(rate, inbound_frames=1))
            self._all_ports.append(port)
            self._free_ports.append(port)

    def _set_codec_priorities(self, ep: _Endpoint) -> None:
        wanted = {_CODEC_IDS[name]: 255 - i for i, name in enumerate(self.config.codecs)}
        # telephone-event (RFC 2833) is not a codec entry; it is always offered.
        for info in ep.codecEnum2():
            ep.codecSetPriority(info.codecId, wanted.get(info.codecId, 0))

    def _destroy_library(self) -> None:
        ep = self._ep
        if ep is None:
            return
        try:
            if self._calls or self._refusing:
                ep.hangupAllCalls()
                deadline = time.monotonic() + 2.0
                while (self._calls or self._refusing) and time.monotonic() < deadline:
                    ep.libHandleEvents(_POLL_MS)
            self._held.clear()
            self._calls.clear()
            self._refusing.clear()
            if self._account is not None:
                self._account.shutdown()
            self._account = None
            ports, self._all_ports = self._all_ports, []
            # C ports are not freed (a few kB each): the bridge is gone, but a late ring call
            # from asyncio may still read them, which their epoch makes harmless.
            self._c_ports = None
            self._graveyard.clear()
            self._free_ports.clear()
            ep.libDestroy()
            # The conference and its ports are gone with the library: the Python wrappers must
            # not unregister them again (~AudioMediaPort after libDestroy asserts), so they give
            # up ownership of their C++ objects before they are dropped.
            for port in ports:
                if isinstance(port, MediaBridge):
                    port.thisown = False
            del ports
        except pj.Error as exc:
            log.error("pjsua2 shutdown error: %s", exc.info())
        self._ep = None

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command is None:
                return
            try:
                self._execute(command)
            except pj.Error as exc:
                log.warning(
                    "sip command failed", extra={"command": repr(command), "error": exc.reason}
                )

    def _execute(self, command: ev.SipCommand) -> None:
        match command:
            case ev.Drain():
                self.admission.draining = True
            case ev.Answer(call_id=call_id, status=status):
                call = self._calls.get(call_id)
                if call is not None:
                    prm = pj.CallOpParam()
                    prm.statusCode = status
                    call.answer(prm)
            case ev.Hangup(call_id=call_id, status=status, reason=reason):
                call = self._calls.get(call_id)
                if call is not None and not call.local_hangup:
                    call.local_hangup = True
                    prm = pj.CallOpParam()
                    prm.statusCode = status
                    if reason:
                        prm.reason = reason
                    call.hangup(prm)

    def _release_due(self, now: float) -> None:
        if self._held:
            due = [item for item in self._held if item[0] <= now]
            if due:
                self._held = [item for item in self._held if item[0] > now]
                for _, call, status in due:
                    if call.call_id in self._refusing:
                        self._refuse(call, status, retry_after=True)
        if self._graveyard and self._graveyard[0][0] <= now:
            for _, port in (item for item in self._graveyard if item[0] <= now):
                # Park it on a silent channel of its own until the next call borrows it.
                port.attach(MediaChannel(port.rate, inbound_frames=1))
                self._free_ports.append(port)
            self._graveyard = [item for item in self._graveyard if item[0] > now]

    def _refuse(self, call: _Call, status: int, *, retry_after: bool = False) -> None:
        prm = pj.CallOpParam()
        prm.statusCode = status
        if retry_after:
            header = pj.SipHeader()
            header.hName = "Retry-After"
            header.hValue = "1"
            prm.txOption.headers.append(header)
        call.local_hangup = True
        try:
            call.hangup(prm)
        except pj.Error as exc:
            log.debug("refusal failed: %s", exc.reason)

    def _on_incoming(self, account: _Account, prm: Any) -> None:
        call = _Call(self, account, prm.callId)
        whole = prm.rdata.wholeMsg
        info = call.getInfo()
        call.remote_uri = info.remoteUri
        now = time.monotonic()
        decision = self.admission.decide(
            live_calls=len(self._calls), called_user=request_user(whole), now=now
        )
        if decision.status is not None:
            self._post(ev.CallRefused(decision.status, decision.reason, info.remoteUri))
            log.info(
                "call refused",
                extra={
                    "status": decision.status,
                    "reason": decision.reason,
                    "remote": mask_uri(info.remoteUri),
                },
            )
            # Keep the wrapper alive until PJSIP reports the call gone.
            self._refusing[call.call_id] = call
            if decision.not_before > now:
                self._held.append((decision.not_before, call, decision.status))
            else:
                self._refuse(call, decision.status, retry_after=decision.status == 503)
            return
        call.accepted = True
        self._calls[call.call_id] = call
        ringing = pj.CallOpParam()
        ringing.statusCode = 180
        call.answer(ringing)
        self._post(
            ev.CallOffered(
                call_id=call.call_id,
                sip_call_id=info.callIdString,
                remote_uri=info.remoteUri,
                local_uri=info.localUri,
                called_user=request_user(whole),
                transport=via_transport(whole),
            )
        )

    def _on_call_state(self, call: _Call) -> None:
        info = call.getInfo()
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED and call.accepted and not call.answered:
            call.answered = True
            self._post(ev.CallAnswered(call.call_id))
        elif info.state == pj.PJSIP_INV_STATE_DISCONNECTED:
            self._detach_media(call)
            # Drop the wrapper now, while PJSIP has not yet reused its call index: pjsua2's
            # ~Call() hangs up *whatever call holds its index* and clears that call's user data,
            # so a wrapper outliving its call would end the next caller's call.
            self._refusing.pop(call.call_id, None)
            if self._held:
                self._held = [item for item in self._held if item[1] is not call]
            if call.accepted and self._calls.pop(call.call_id, None) is not None:
                self._post(
                    ev.CallEnded(
                        call_id=call.call_id,
                        by="server" if call.local_hangup else "caller",
                        status=info.lastStatusCode,
                        reason=info.lastReason,
                        answered=call.answered,
                    )
                )

    def _borrow_port(self) -> MediaPort:
        rate = self.config.clock_rate
        channel = MediaChannel(rate, playout=Playout(rate, self.config.playout_max_ms))
        port: MediaPort
        if self._free_ports:
            port = self._free_ports.pop()
            port.attach(channel)
            return port
        name = f"vg-{len(self._all_ports)}-{rate}"
        if self._c_ports is not None:
            port = CMediaPort(*self._c_ports, name, rate)
            port.attach(channel)
        else:
            assert self._copier is not None
            port = MediaBridge(name, channel, self._copier, self.thread_states)
            port.create()
        self._all_ports.append(port)
        return port

    def _detach_media(self, call: _Call) -> None:
        bridge, audio = call.bridge, call.audio
        call.bridge = call.audio = None
        if bridge is None:
            return
        if audio is not None:
            bridge.disconnect(audio)
        self._graveyard.append((time.monotonic() + _GRAVEYARD_S, bridge))

    def _on_media_state(self, call: _Call) -> None:
        if not call.accepted:
            return
        info = call.getInfo()
        for media in info.media:
            if media.type != pj.PJMEDIA_TYPE_AUDIO:
                continue
            if media.status not in (pj.PJSUA_CALL_MEDIA_ACTIVE, pj.PJSUA_CALL_MEDIA_REMOTE_HOLD):
                continue
            stream = call.getStreamInfo(media.index)
            rate = int(stream.codecClockRate)
            call.media_index = media.index
            # a=sendonly / inactive from the caller: a hold, not a failure (media_health).
            call.held = media.status == pj.PJSUA_CALL_MEDIA_REMOTE_HOLD
            audio = call.getAudioMedia(media.index)
            if call.bridge is None:
                # The port runs at the bridge's own rate, whatever the codec: the bridge then
                # converts the stream once each way, as it must anyway. A port at the codec's
                # rate (8 kHz for G.711 on a 16 kHz bridge) made it convert twice more per call
                # and tick, the costliest thing on the clock thread (perf, bench/capacity.py).
                call.bridge = self._borrow_port()
            # The call's AudioMedia can change on every media update (notes, "Media health"):
            # reconnect each time.
            call.audio = audio
            call.bridge.connect(audio)
            self._post(
                ev.MediaReady(call.call_id, str(stream.codecName), rate, call.bridge.channel)
            )
            if call.reinvite_pending:
                # The new stream's counter starts afresh; the health monitor reads any change of
                # it as packets arriving, so it keeps watching across the switch.
                call.reinvite_pending = False
                self._post(ev.ReinviteFinished(call.call_id, ok=True))
            return
