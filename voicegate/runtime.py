"""The composition root of one serving process: SIP thread, live calls, store, metrics.

The runtime routes what the SIP thread reports to the call it concerns, ticks every live call every
20 ms, and runs the staged shutdown. It holds no business logic: a call's outcome is decided by its
:class:`~voicegate.live_call.LiveCall`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from agents.base import AgentFactory
from agents.demo import DemoAgent
from audio.prompts import PromptLibrary, default_prompts_dir
from config import Settings
from session.call_records import CallRecordStore
from telephony import events as ev
from telephony.endpoint import EndpointConfig, SipEndpoint
from telephony.sip_message import mask_uri
from voicegate.live_call import CallPhase, EndIntent, LiveCall
from voicegate.metrics import Metrics

log = logging.getLogger("voicegate.runtime")

TICK_S = 0.020
# After the grace period, calls still up get a BYE without waiting for their prompt; this is how
# long the runtime then waits for PJSIP to confirm them gone.
_FORCED_END_WAIT_S = 3.0
STORE_FILE = "voicegate.sqlite3"


def endpoint_config(settings: Settings) -> EndpointConfig:
    sip, media = settings.sip, settings.media
    return EndpointConfig(
        sip_address=sip.address,
        sip_port=sip.port,
        media_address=media.address,
        media_public_address=media.public_address,
        rtp_port_min=media.rtp_port_min,
        rtp_port_max=media.rtp_port_max,
        codecs=tuple(media.codecs),
        clock_rate=media.clock_rate,
        max_calls=sip.max_calls,
        max_setup_rate=sip.max_setup_rate,
        numbers=frozenset(sip.numbers),
        user_agent=sip.user_agent,
        pjsip_log_level=settings.log.pjsip_level,
        fast_copy=media.fast_frame_copy,
    )


def agent_factory(settings: Settings) -> AgentFactory:
    if settings.agent.kind == "demo":
        return DemoAgent
    raise ValueError(f"agent.kind {settings.agent.kind!r} has no implementation")


class Runtime:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._wall = wall_clock
        data_dir = Path(settings.storage.data_dir)
        self.store = CallRecordStore(data_dir / STORE_FILE)
        prompts_dir = settings.agent.prompts_dir or default_prompts_dir()
        self._prompts = PromptLibrary(Path(prompts_dir))
        self._agent_factory = agent_factory(settings)
        self.answer_after_s = settings.sip.answer_after_s
        self.calls: dict[str, LiveCall] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.sip: SipEndpoint | None = None
        self.sip_ready = False
        self.draining = False
        self._ticker: asyncio.TimerHandle | None = None
        self._next_tick = 0.0

    # --- CallServices ---------------------------------------------------------------------------

    def submit(self, command: ev.SipCommand) -> None:
        if self.sip is not None:
            self.sip.submit(command)

    def prompt(self, name: str, rate: int) -> NDArray[np.int16]:
        return self._prompts.get(name, rate)

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Finalise what a dead predecessor left open, then start taking calls."""
        orphans = self.store.finalize_orphans(
            at=self._wall(), reason="the process serving the call exited before the call ended"
        )
        if orphans:
            self.metrics.orphans_finalized.inc(len(orphans))
            log.warning("calls.finalized_at_startup", extra={"count": len(orphans)})
        # Load the prompts now so a broken prompt file fails start-up, not a call.
        for rate in (8000, 16000):
            self._prompts.load_all(rate)
        loop = asyncio.get_running_loop()
        self.sip = SipEndpoint(endpoint_config(self.settings), loop, self._on_sip_event)
        await self.sip.start()
        self._next_tick = loop.time() + TICK_S
        self._ticker = loop.call_at(self._next_tick, self._tick)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        for call in self.calls.values():
            call.tick()
        # Re-arm on the fixed 20 ms grid; if the loop stalled, skip the missed ticks rather than
        # firing them in a burst (the inbound ring holds the audio meanwhile).
        self._next_tick += TICK_S
        now = loop.time()
        if self._next_tick < now:
            self._next_tick = now + TICK_S
        self._ticker = loop.call_at(self._next_tick, self._tick)

    def _on_sip_event(self, event: ev.SipEvent) -> None:
        match event:
            case ev.TransportsUp(addresses=addresses, fast_copy=fast):
                self.sip_ready = True
                self.metrics.sip_ready.set(1)
                self.metrics.fast_frame_copy.set(1 if fast else 0)
                log.info("sip.ready", extra={"addresses": list(addresses), "fast_copy": fast})
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
            case ev.CallOffered():
                self._start_call(event)
            case _:
                call = self.calls.get(getattr(event, "call_id", ""))
                if call is not None:
                    call.deliver(event)

    def _start_call(self, offer: ev.CallOffered) -> None:
        call = LiveCall(offer, self, self._agent_factory, self._wall)
        self.calls[call.call_id] = call
        task = asyncio.create_task(self._run_call(call), name=f"call-{call.call_id[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.draining:
            call.end(
                EndIntent("canceled", "server shutting down", "shutdown"),
                after_playout=False,
                status=503,
            )

    async def _run_call(self, call: LiveCall) -> None:
        try:
            await call.run()
        except Exception:
            log.exception("call.crashed", extra={"call_id": call.call_id})
            call.end(EndIntent("failed", "internal error", "runtime"), after_playout=False)
        finally:
            self.calls.pop(call.call_id, None)

    def live_calls(self) -> list[dict[str, object]]:
        return [call.snapshot() for call in self.calls.values()]

    async def shutdown(self) -> None:
        """Staged shutdown: refuse new calls, tell live callers and BYE them, then stop PJSIP.

        Every live call ends with a recorded terminal state (``canceled``, reason "server shutting
        down") within ``sip.shutdown_grace_s`` plus a few seconds.
        """
        if self.draining:
            return
        self.draining = True
        self.submit(ev.Drain())
        log.info("shutdown.begin", extra={"live_calls": len(self.calls)})
        intent = EndIntent("canceled", "server shutting down", "shutdown")
        for call in list(self.calls.values()):
            if call.phase is CallPhase.ANSWERED:
                call.stop_playback()
                call.play_prompt("shutting_down")
                call.end(intent, after_playout=True)
            else:
                call.end(intent, after_playout=False, status=503)
        await self._wait_calls_done(self.settings.sip.shutdown_grace_s)
        for call in list(self.calls.values()):
            call.end(intent, after_playout=False)
        await self._wait_calls_done(_FORCED_END_WAIT_S)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._ticker is not None:
            self._ticker.cancel()
        if self.sip is not None:
            await self.sip.stop()
        self.store.close()
        log.info("shutdown.done")

    async def _wait_calls_done(self, within_s: float) -> None:
        waiters = [call.done.wait() for call in self.calls.values()]
        if waiters:
            await asyncio.wait(
                [asyncio.ensure_future(w) for w in waiters], timeout=max(within_s, 0.0)
            )
