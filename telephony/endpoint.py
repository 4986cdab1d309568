"""The SIP thread: the one thread that owns pjsua2 in this process.

pjsua2's Endpoint is a process singleton and is not safe to call from other threads
(shared/notes/pjsua2.md, "Threading"), so this thread creates the library, polls it with
``libHandleEvents``, runs every pjsua2 callback, and executes the commands asyncio queues for it.
Events go the other way with ``loop.call_soon_threadsafe``. Nothing here decides a business
outcome: it answers, refuses and hangs up as told, and reports what happened.

Its helpers, one job each: telephony.library (configure, start), telephony.calls (pjsua2's
subclasses), telephony.refusals (refused INVITEs), telephony.port_pool (media ports).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pjsua2 as pj

from telephony import events as ev
from telephony.admission import Admission
from telephony.bridge import connect_bridge
from telephony.calls import SipAccount, SipCall, SipLibrary
from telephony.dial import place_call
from telephony.dialog_end import DialogKey, DialogTerminator, Lingering
from telephony.frame_copy import select_copier
from telephony.half_open import HalfOpen
from telephony.inbound_context import presented_handle, read_context
from telephony.library import (
    EndpointConfig,
    LogWriter,
    TelephonyStartError,
    account_config,
    start_library,
)
from telephony.media_bridge import MediaBridge
from telephony.media_health import MediaHealth
from telephony.offer_check import check_offer
from telephony.pjsip_log import stop_lines
from telephony.port_pool import PortPool
from telephony.refer import Refers
from telephony.refusals import Refusals
from telephony.sip_message import (
    arrived_over_tls,
    header_tag,
    mask_uri,
    request_user,
    source_address,
    via_transport,
)
from telephony.sip_wake import SipWaker
from telephony.srtp_offer import srtp_refusal, stream_is_srtp, warning_header
from telephony.strict_source import StrictSource
from telephony.thread_state import ThreadStatePins

# Importers of these names from this module predate the split (voicegate.runtime, voicegate.cli).
__all__ = ["EndpointConfig", "SipEndpoint", "TelephonyStartError"]

log = logging.getLogger("voicegate.sip")

_POLL_MS = 10
# With nothing due, the SIP thread blocks this long at most: SIP traffic and SipWaker's keep-alive
# wake it sooner. The bound only matters if a wake-up is lost.
_IDLE_WAIT_MS = 1000
_FOREIGN_COUNT_S = 1.0  # how often the media sockets' drop counters are read


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
        self._next_foreign_count = 0.0
        self._start_error: str | None = None
        self._stop = threading.Event()
        self._waker = SipWaker(config.sip_address, config.sip_port)
        self.admission = Admission(
            max_calls=config.max_calls,
            rate=config.max_setup_rate,
            numbers=config.numbers,
            route=config.route,
            tls_tenants=config.tls_tenants,
        )
        # SIP-thread state.
        self._ep: SipLibrary | None = None
        self._account: SipAccount | None = None
        self._plain_account: SipAccount | None = None
        self._log_writer: LogWriter | None = None
        # Every pjsua2 Call wrapper lives in exactly one of these until PJSIP reports it
        # DISCONNECTED, and is dropped right then (see on_call_state for why).
        self._calls: dict[str, SipCall] = {}
        self._refers = Refers(self.post, config.follow_refer, self._calls, config.max_calls)
        self._refusals = Refusals()
        self._half_open = HalfOpen(config.ack_timeout_s)
        self._lingering = Lingering()
        self._terminator: DialogTerminator | None = None
        self._ports = PortPool(
            config.clock_rate, config.playout_max_ms, self.thread_states, config.inbound_vad
        )

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

    def post(self, event: ev.SipEvent) -> None:
        """Hand ``event`` to asyncio (SIP thread only)."""
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
        copier = self._ports.copier
        assert copier is not None
        addresses = tuple(
            f"{proto}:{self.config.sip_address}:{self.config.sip_port}" for proto in ("udp", "tcp")
        ) + (
            (f"tls:{self.config.sip_address}:{self.config.tls_port}",)
            if self.config.tls_port
            else ()
        )
        ports = self._ports
        media_port = "c" if ports.c_ports else "python"
        self.post(ev.TransportsUp(addresses, copier.fast, media_port, ports.c_detector))
        self._ready.set()
        try:
            self._loop_until_stopped()
        finally:
            self._destroy_library()
            self.post(ev.TransportsDown("stopped"))

    def _loop_until_stopped(self) -> None:
        assert self._ep is not None
        next_health = time.monotonic()
        while not self._stop.is_set():
            self._ep.libHandleEvents(self._wait_ms(time.monotonic(), next_health))
            self._run_commands()
            now = time.monotonic()
            self._refusals.release_due(now)
            self._end_half_open(now)
            self._end_lingering(now)
            self._ports.recycle_due(now)
            if now >= next_health:
                next_health = now + self.config.health_poll_s
                self._poll_media_health(now)

    def _wait_ms(self, now: float, next_health: float) -> int:
        """How long the SIP thread may block: until the next thing of its own falls due."""
        due = now + _IDLE_WAIT_MS / 1000
        if self._calls:
            due = min(due, next_health)
        for other in (
            self._refusals.next_due(),
            self._ports.next_due(),
            self._half_open.next_due(),
            self._lingering.next_due(),
        ):
            if other is not None:
                due = min(due, other)
        return max(1, math.ceil((due - now) * 1000 - 1e-6))

    def _poll_media_health(self, now: float) -> None:
        """Read each call's received-packet counter; report gaps, returns and holds."""
        count_foreign = self.config.strict_source and now >= self._next_foreign_count
        if count_foreign:
            self._next_foreign_count = now + _FOREIGN_COUNT_S
        for call in self._calls.values():
            if call.media_index < 0 or not call.answered:
                continue
            if call.strict is not None:
                self._watch_source(call, call.strict, count_foreign)
            try:
                packets = call.getStreamStat(call.media_index).rtcp.rxStat.pkt
            except pj.Error:
                continue  # the stream is being replaced (re-INVITE); next poll sees the new one
            if call.health is None:
                call.health = MediaHealth(self.config.gap_threshold_s, now)
            change = call.health.observe(packets, now, held=call.held)
            if change is not None:
                self.post(ev.MediaHealthChanged(call.call_id, change.new.value, change.since))

    def _watch_source(self, call: SipCall, strict: StrictSource, count: bool) -> None:
        """Lock a learning call to the source of its first RTP; count what its filters drop."""
        if strict.learning:
            try:
                info = call.getMedTransportInfo(call.media_index)
            except pj.Error:
                return  # the stream is being replaced (re-INVITE)
            source, rtcp = str(info.srcRtpName), str(info.srcRtcpName)
            if source and not source.startswith("0.0.0.0") and strict.lock(source, rtcp):
                self.post(ev.MediaSourceLocked(call.call_id, source))
        elif count:
            foreign = strict.foreign_packets()
            if foreign:
                self.post(ev.ForeignRtp(call.call_id, foreign))

    def _start_library(self) -> None:
        cfg = self.config
        self._ep = ep = SipLibrary(self)
        self._log_writer = LogWriter()
        start_library(ep, cfg, self._log_writer)
        self._ports.copier = copier = select_copier(pj.ByteVector, allow_fast=cfg.fast_copy)
        if not copier.fast and cfg.fast_copy:
            log.warning("fast frame copy failed verification; using the slow copy")
        if cfg.media_port == "c":
            self._ports.start_c_ports()
        self._account = SipAccount(self)
        self._account.create(account_config(cfg), True)
        if cfg.srtp != "off":
            # DTLS offers go to an account without SRTP: a clean 488, not a crash
            # (telephony.srtp_offer.offers_dtls).
            self._plain_account = SipAccount(self)
            self._plain_account.create(account_config(cfg, srtp="off"), False)
            ep.plain_account_id = self._plain_account.getId()
        self._terminator = DialogTerminator.load()

    def _destroy_library(self) -> None:
        ep = self._ep
        if ep is None:
            return
        try:
            if self._calls or self._refusals:
                ep.hangupAllCalls()
                deadline = time.monotonic() + 2.0
                while (self._calls or self._refusals) and time.monotonic() < deadline:
                    ep.libHandleEvents(_POLL_MS)
            self._calls.clear()
            self._refusals.clear()
            if self._account is not None:
                self._account.shutdown()
            self._account = None
            if self._plain_account is not None:
                ep.plain_account_id = None
                self._plain_account.shutdown()
            self._plain_account = None
            ports = self._ports.release_all()
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
        finally:
            stop_lines()
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
            case ev.StoreAvailability(available=available):
                self.admission.store_unavailable = not available
            case ev.Answer(call_id=call_id, status=status):
                call = self._calls.get(call_id)
                if call is not None:
                    prm = pj.CallOpParam()
                    prm.statusCode = status
                    call.answer(prm)
            case ev.Rekey(call_id=call_id, new_call_id=new_call_id):
                # The session's previous call is gone from here before its id is reused: a
                # rejoin is refused as busy while the runtime still has a call of that session,
                # and the runtime drops a call only after PJSIP reported it DISCONNECTED.
                call = self._calls.get(call_id)
                if call is not None and new_call_id not in self._calls:
                    del self._calls[call_id]
                    call.call_id = new_call_id
                    self._calls[new_call_id] = call
            case ev.Hangup(call_id=call_id, status=status, reason=reason):
                call = self._calls.get(call_id)
                if call is not None and call.getId() == pj.PJSUA_INVALID_ID:
                    # A followed REFER's call that pjsua never placed (its INVITE could not
                    # leave: telephony.refer): no dialog to end, only its slot to give back.
                    del self._calls[call_id]
                    self.post(ev.CallEnded(call_id, "server", 503, "never placed", answered=False))
                elif call is not None and not call.local_hangup:
                    self._hang_up(call, status, reason)
            case ev.ProbeDialog(call_id=call_id, generation=generation, attempt=attempt):
                call = self._calls.get(call_id)
                if call is None or not call.answered or call.local_hangup:
                    # Ended, never answered, or we are hanging up: nobody waits for an answer.
                    log.debug("dialog probe dropped", extra={"call_id": call_id})
                    return
                call.probe(generation, attempt)
            case ev.Transfer(call_id=call_id, target=target, headers=headers):
                self._refers.send(self._calls.get(call_id), call_id, target, headers)
            case ev.Dial():
                self._dial(command)
            case ev.TransferReplaces(call_id=call_id, consult_id=consult_id):
                self._refers.send_replaces(
                    self._calls.get(call_id), self._calls.get(consult_id), call_id
                )

    def _dial(self, command: ev.Dial) -> None:
        refusal = place_call(
            self,
            self._account,
            self._calls,
            command,
            draining=self.admission.draining,
            max_calls=self.config.max_calls,
        )
        if refusal is not None:
            log.info("outbound call not placed", extra={"call_id": command.call_id, "why": refusal})
            self.post(ev.CallEnded(command.call_id, "server", 503, refusal, answered=False))

    def on_transfer_request(self, call: SipCall, prm: Any) -> None:
        self._refers.on_request(call, prm, self._account)

    def on_incoming(self, account: SipAccount, prm: Any) -> None:
        call = SipCall(self, account, prm.callId)
        whole = prm.rdata.wholeMsg
        info = call.getInfo()
        call.remote_uri = info.remoteUri
        call.remote_tag = header_tag(whole, "From") or ""
        now = time.monotonic()
        bad = check_offer(whole, media_ipv6=":" in self.config.media_address)
        if bad is not None:
            # PJSIP would abort the process on this offer when answering it: it is refused
            # before anything is answered (at the set-up rate, like any INVITE: admission).
            log.warning(
                "offer PJSIP cannot take",
                extra={
                    "status": bad.status,
                    "reason": bad.reason,
                    "remote": mask_uri(info.remoteUri),
                },
            )
        source = source_address(
            str(prm.rdata.srcAddress), whole, trust_header=self.config.trusted_source_header
        )
        over_tls = arrived_over_tls(
            info.localContact, whole, trust_header=self.config.trusted_source_header
        )
        decision = self.admission.decide(
            live_calls=len(self._calls),
            called_user=request_user(whole),
            now=now,
            source=source,
            bad_offer=bad,
            srtp_refusal=(
                srtp_refusal(whole, over_tls=over_tls) if self.config.srtp == "mandatory" else None
            ),
            over_tls=over_tls,
        )
        if decision.status is not None:
            self.post(ev.CallRefused(decision.status, decision.reason, info.remoteUri))
            log.info(
                "call refused",
                extra={
                    "status": decision.status,
                    "reason": decision.reason,
                    "remote": mask_uri(info.remoteUri),
                },
            )
            # Keep the wrapper alive until PJSIP reports the call gone.
            self._refusals.refuse(
                call,
                decision.status,
                not_before=decision.not_before,
                now=now,
                warning=warning_header(decision.warning) if decision.warning else "",
            )
            return
        call.accepted = True
        call.tenant = decision.tenant
        self._calls[call.call_id] = call
        ringing = pj.CallOpParam()
        ringing.statusCode = 180
        call.answer(ringing)
        self.post(
            ev.CallOffered(
                call_id=call.call_id,
                sip_call_id=info.callIdString,
                remote_uri=info.remoteUri,
                local_uri=info.localUri,
                called_user=request_user(whole),
                # Behind the front door the top Via is Kamailio's loopback hop: TLS is its word.
                transport="tls" if over_tls else via_transport(whole),
                context=read_context(whole).as_meta(),
                tenant=decision.tenant,
                resume=presented_handle(whole),
            )
        )

    def on_answer_sent(self, call: SipCall, response: str) -> None:
        if not call.accepted or call.call_id not in self._calls:
            return
        self._half_open.answered(call.call_id, time.monotonic())
        local_tag = header_tag(response, "To")
        if call.dialog is None and local_tag and call.remote_tag:
            call.dialog = DialogKey(call.getInfo().callIdString, local_tag, call.remote_tag)

    def _hang_up(self, call: SipCall, status: int, reason: str = "") -> None:
        """Hang ``call`` up; a dialog whose BYE then goes unanswered is ended locally later."""
        call.local_hangup = True
        prm = pj.CallOpParam()
        prm.statusCode = status
        if reason:
            prm.reason = reason
        dialog = call.dialog
        call.hangup(prm)
        if dialog is not None:
            self._lingering.ended(dialog, time.monotonic())

    def _end_lingering(self, now: float) -> None:
        if not self._lingering or self._terminator is None:
            return
        for key in self._lingering.due(now):
            match self._terminator.terminate(key):
                case "ended":
                    self.post(ev.DialogEndedLocally())
                case "answered":
                    self.post(ev.DialogLingers(key.call_id))

    def _end_half_open(self, now: float) -> None:
        """Calls whose ACK is overdue: hung up with a BYE, their slot freed."""
        if not self._half_open:
            return
        for call_id in self._half_open.due(now):
            call = self._calls.get(call_id)
            if call is None or call.answered:
                continue
            call.ack_timed_out = True
            self.post(ev.AckTimedOut(call_id, self._half_open.ack_timeout_s))
            log.warning("call has no ACK: hanging up", extra={"call_id": call_id})
            try:
                # 408: PJSIP sends the BYE now instead of holding it for the ACK.
                self._hang_up(call, 408, "ACK not received")
            except pj.Error as exc:
                # PJSIP's own Timer H (64*T1) still ends the call.
                log.warning("hang-up of a half-open call failed", extra={"error": exc.reason})

    def on_call_state(self, call: SipCall) -> None:
        info = call.getInfo()
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED and call.accepted and not call.answered:
            call.answered = True
            self._half_open.done(call.call_id)
            if call.ack_timed_out:
                return  # the BYE is out: this ACK came too late to keep the call
            self.post(ev.CallAnswered(call.call_id))
        elif info.state == pj.PJSIP_INV_STATE_DISCONNECTED:
            self._half_open.done(call.call_id)
            self._detach_media(call)
            if call.strict is not None:
                call.strict.release()
                call.strict = None
            # Drop the wrapper now, while PJSIP has not yet reused its call index: pjsua2's
            # ~Call() hangs up *whatever call holds its index* and clears that call's user data,
            # so a wrapper outliving its call would end the next caller's call.
            self._refusals.forget(call)
            if call.accepted and self._calls.pop(call.call_id, None) is not None:
                self.post(
                    ev.CallEnded(
                        call_id=call.call_id,
                        by="server" if call.local_hangup else "caller",
                        status=408 if call.ack_timed_out else info.lastStatusCode,
                        reason=(
                            f"no ACK for the 200 within {self._half_open.ack_timeout_s:g} s"
                            if call.ack_timed_out
                            else info.lastReason
                        ),
                        answered=call.answered,
                    )
                )

    def _strict_source(self, call: SipCall, index: int) -> None:
        """The call's media is (re)negotiated: learn its caller's RTP source (again)."""
        if not self.config.strict_source:
            return
        if call.strict is not None:
            call.strict.relearn()  # a re-INVITE may have moved the caller's media
            return
        info = call.getMedTransportInfo(index)
        strict = StrictSource(call.call_id, str(info.localRtpName), str(info.localRtcpName))
        if not strict.supported:
            log.warning(
                "media.source_unfiltered",
                extra={"call_id": call.call_id, "why": "IPv6 media is not filtered"},
            )
            return
        call.strict = strict

    def _bridge_media(self, call: SipCall) -> None:
        peer_id = call.bridge_to or call.bridged_with
        peer = self._calls.get(peer_id)
        if peer is None or peer.audio is None or call.audio is None:
            return
        leg, caller = (call, peer) if call.bridge_to else (peer, call)
        first = connect_bridge(caller, leg)
        if first:
            self.post(ev.Bridged(leg.call_id, caller.call_id))

    def _detach_media(self, call: SipCall) -> None:
        bridge, audio = call.bridge, call.audio
        call.bridge = call.audio = None
        if bridge is not None:
            self._ports.detach(bridge, audio)

    def on_media_state(self, call: SipCall) -> None:
        if not call.accepted:
            return
        info = call.getInfo()
        for media in info.media:
            if media.type != pj.PJMEDIA_TYPE_AUDIO:
                continue
            if media.status not in (pj.PJSUA_CALL_MEDIA_ACTIVE, pj.PJSUA_CALL_MEDIA_REMOTE_HOLD):
                continue
            stream = call.getStreamInfo(media.index)
            if self.config.srtp == "mandatory" and not stream_is_srtp(stream.proto):
                # A re-INVITE that took the call to plain RTP (telephony.srtp_offer).
                self._hang_up(call, 488, "SRTP required")
                return
            rate = int(stream.codecClockRate)
            call.media_index = media.index
            # a=sendonly / inactive from the caller: a hold, not a failure (media_health).
            call.held = media.status == pj.PJSUA_CALL_MEDIA_REMOTE_HOLD
            self._strict_source(call, media.index)
            audio = call.getAudioMedia(media.index)
            # A consult leg gets a port like any call: the person hears the brief on it
            # (voicegate/call/consult.py); the caller's own port never reaches it.
            if call.bridge_to or call.bridged_with:
                # A bridged transfer (telephony.bridge): the two calls' audio meet in the
                # conference bridge, with no port of ours in between.
                call.audio = audio
                self._bridge_media(call)
                return
            if call.bridge is None:
                # The port runs at the bridge's own rate, whatever the codec: the bridge then
                # converts the stream once each way, as it must anyway. A port at the codec's
                # rate (8 kHz for G.711 on a 16 kHz bridge) made it convert twice more per call
                # and tick, the costliest thing on the clock thread (perf, bench/capacity.py).
                call.bridge = self._ports.borrow()
            # The call's AudioMedia can change on every media update (notes, "Media health"):
            # reconnect each time.
            call.audio = audio
            call.bridge.connect(audio)
            self.post(ev.MediaReady(call.call_id, str(stream.codecName), rate, call.bridge.channel))
            if call.reinvite_pending:
                # The new stream's counter starts afresh; the health monitor reads any change of
                # it as packets arriving, so it keeps watching across the switch.
                call.reinvite_pending = False
                self.post(ev.ReinviteFinished(call.call_id, ok=True))
            return
