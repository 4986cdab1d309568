"""Callers back after a drop: an INVITE from the number of a dropped session (session/callback.py)
is offered to continue it before any session is started for it.

For each new inbound call (no resume handle) while ``session.callback_window_s`` is on, the
store is asked (off the event loop, voicegate/call/callback_match.py) for a dropped session of
the same tenant whose caller digest matches and whose window is open. None: the call starts as
any other. One: the call is answered here, hears "Welcome back. Press 1 to continue where we
left off" and the keys go to :class:`~voicegate.call.callback_offer.CallbackOffer` (the resume
code too, when the session had started a write). Accepted: the session is taken over at the
next fencing epoch, the call takes its id (``Rekey``) and continues it as a rejoin does (reconcile
first; the agent is told what its tools came to, never runs them again). Anything else: the
dropped session ends as it would have, and the call starts a new session. Either way the call's
answer and media, already under way, are handed to the call's task in the order they came.

The keys entered are never logged; the number only masked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from session.store import StoreError
from session.store.writer import StoreWriter
from telephony import events as ev
from telephony.media_bridge import MediaChannel
from telephony.sip_message import mask_uri
from voicegate.call.callback_keys import CallbackKeys, caller_number
from voicegate.call.callback_match import CALLER_KEY, Dropped, end_dropped, find_dropped, take_back
from voicegate.call.callback_offer import CallbackOffer, Outcome, Step
from voicegate.call.live_call import LiveCall
from voicegate.call.rejoin import Verdict
from voicegate.observe.metrics import Metrics

log = logging.getLogger("voicegate.call")

# Seconds for the first key after the offer starts playing, and between keys of the code.
OFFER_TIMEOUT_S = 10.0
CODE_KEY_TIMEOUT_S = 10.0
# Seconds for the answer and its media to be up before the offer is given up (a new session).
ANSWER_TIMEOUT_S = 10.0
# How often the offer's prompts are fed to the media port while it plays (the call's own tick
# takes over at the handover).
_TICK_S = 0.04


class CallbackHost(Protocol):
    writer: StoreWriter
    metrics: Metrics
    owner: str
    calls: dict[str, LiveCall]
    draining: bool

    def submit(self, command: ev.SipCommand) -> None: ...

    def prompt(self, name: str, rate: int) -> NDArray[np.int16]: ...


# Starts a call's task: the offer, a rejoin-like verdict when a dropped session continues, and
# the SIP events that came before the handover (the answer, its media), in order.
StartCall = Callable[[ev.CallOffered, Verdict | None, tuple[ev.SipEvent, ...]], LiveCall]


class Callbacks:
    def __init__(
        self,
        host: CallbackHost,
        keys: CallbackKeys,
        start: StartCall,
        now: Callable[[], float],
    ) -> None:
        self._host = host
        self._keys = keys
        self._start = start
        self._now = now
        self._pending: dict[str, asyncio.Queue[ev.SipEvent]] = {}
        self.aliases: dict[str, str] = {}  # a continued call's first id -> its session's id
        self._tasks: set[asyncio.Task[None]] = set()
        self._says = 0

    def caller_key(self, offer: ev.CallOffered) -> str:
        """The keyed digest a new session keeps of its caller ("" for a call with no number)."""
        number = caller_number(offer.remote_uri)
        return self._keys.caller(offer.tenant, number) if number else ""

    def offered(self, offer: ev.CallOffered) -> bool:
        """Take ``offer`` for a callback check; False if it cannot be one (no number, or the
        server is draining): the caller starts its call at once."""
        caller_key = self.caller_key(offer)
        if not caller_key or self._host.draining:
            return False
        self._pending[offer.call_id] = asyncio.Queue()
        name = f"callback-{offer.call_id[:8]}"
        task = asyncio.create_task(self._run(offer, caller_key), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def route(self, call_id: str, event: ev.SipEvent) -> LiveCall | None:
        """Hold an event of a call being offered; the call an event of a continued call's first
        id belongs to."""
        queue = self._pending.get(call_id)
        if queue is not None:
            queue.put_nowait(event)
            return None
        session_id = self.aliases.get(call_id)
        if session_id is None:
            return None
        if isinstance(event, ev.CallEnded):
            del self.aliases[call_id]
        return self._host.calls.get(session_id)

    def ended(self, session_id: str) -> None:
        for first_id in [k for k, v in self.aliases.items() if v == session_id]:
            del self.aliases[first_id]

    def __contains__(self, call_id: str) -> bool:
        return call_id in self._pending or call_id in self.aliases

    def __len__(self) -> int:
        return len(self._pending)  # calls held here: each takes a call slot

    # --- one call ---------------------------------------------------------------------------------

    async def _run(self, offer: ev.CallOffered, caller_key: str) -> None:
        call_id = offer.call_id
        early: list[ev.SipEvent] = []
        try:
            dropped = await self._find(offer, caller_key)
            if dropped is None:
                self._hand_over(offer, None, early)
                return
            outcome = await self._offer(offer, dropped, early)
            if outcome is None:
                return  # the caller hung up during the offer: the session stays dropped
            await self._conclude(offer, dropped, outcome, early)
        except StoreError as exc:
            log.warning("call.callback_failed", extra={"call_id": call_id, "error": str(exc)})
            self._hand_over(offer, None, early)
        finally:
            self._pending.pop(call_id, None)

    async def _find(self, offer: ev.CallOffered, caller_key: str) -> Dropped | None:
        host, tenant, now = self._host, offer.tenant, self._now()
        busy = frozenset(host.calls)
        return await asyncio.wrap_future(
            host.writer.submit(
                lambda store: find_dropped(
                    store, tenant=tenant, caller_key=caller_key, now=now, busy=busy
                )
            )
        )

    async def _offer(
        self, offer: ev.CallOffered, dropped: Dropped, early: list[ev.SipEvent]
    ) -> Outcome | None:
        host, call_id = self._host, offer.call_id
        queue = self._pending[call_id]
        session_id = dropped.session_id
        check = lambda code: self._keys.code_matches(session_id, code, dropped.code_digest)  # noqa: E731
        choice = CallbackOffer(bool(dropped.code_digest), check)
        host.metrics.callbacks_offered.inc()
        log.info(
            "call.callback_offered",
            extra={
                "call_id": call_id,
                "session_id": session_id,
                "code": bool(dropped.code_digest),
                "caller": mask_uri(offer.remote_uri),
            },
        )
        host.submit(ev.Answer(call_id))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ANSWER_TIMEOUT_S
        channel: MediaChannel | None = None
        while True:
            if channel is not None:
                _drain(channel)
            try:
                event = await asyncio.wait_for(queue.get(), min(_TICK_S, deadline - loop.time()))
            except TimeoutError:
                if loop.time() < deadline:
                    continue
                step = choice.timed_out()
            else:
                if isinstance(event, ev.CallEnded):
                    host.metrics.callbacks.labels("hung_up").inc()
                    # Nobody to start a session for: PJSIP has ended the dialog.
                    return None
                if not isinstance(event, ev.DtmfReceived):
                    early.append(event)
                    if isinstance(event, ev.MediaReady):
                        channel = event.channel
                        self._play(channel, ("welcome_back",))
                        deadline = loop.time() + OFFER_TIMEOUT_S
                    continue
                host.metrics.dtmf_digits.labels(event.method).inc()
                step = choice.key(event.digit)
                deadline = loop.time() + CODE_KEY_TIMEOUT_S
            self._stepped(step, channel)
            if step.outcome is not None:
                return step.outcome

    def _stepped(self, step: Step, channel: MediaChannel | None) -> None:
        if step.attempt:
            self._host.metrics.callback_code_attempts.labels(step.attempt).inc()
        if channel is not None and step.prompts:
            self._play(channel, step.prompts)

    async def _conclude(
        self, offer: ev.CallOffered, dropped: Dropped, outcome: Outcome, early: list[ev.SipEvent]
    ) -> None:
        host, session_id, owner, now = self._host, dropped.session_id, self._host.owner, self._now()
        if outcome is Outcome.ACCEPTED:
            verdict = await asyncio.wrap_future(
                host.writer.submit(lambda store: take_back(store, session_id, owner=owner, now=now))
            )
            if verdict is not None:
                host.metrics.callbacks.labels(outcome.value).inc()
                log.info("call.callback_accepted", extra={"call_id": offer.call_id,
                                                          "session_id": session_id})
                verdict = dataclasses.replace(
                    verdict, callback=True, with_code=bool(dropped.code_digest)
                )
                host.submit(ev.Rekey(offer.call_id, session_id))
                self.aliases[offer.call_id] = session_id
                self._hand_over(dataclasses.replace(offer, call_id=session_id), verdict, early)
                return
            # Ended or taken elsewhere meanwhile: nothing to continue.
            outcome = Outcome.NO_ANSWER
        else:
            cause = outcome.value
            await asyncio.wrap_future(
                host.writer.submit(
                    lambda store: end_dropped(store, session_id, cause, owner=owner, now=now)
                )
            )
        host.metrics.callbacks.labels(outcome.value).inc()
        log.info(
            "call.callback_declined",
            extra={"call_id": offer.call_id, "session_id": session_id, "outcome": outcome.value},
        )
        self._hand_over(offer, None, early)

    def _hand_over(
        self, offer: ev.CallOffered, verdict: Verdict | None, early: list[ev.SipEvent]
    ) -> None:
        queue = self._pending.pop(offer.call_id, None)
        if queue is not None:
            while not queue.empty():
                event = queue.get_nowait()
                if not isinstance(event, ev.DtmfReceived):  # keys of the offer are spent
                    early.append(event)
        self._start(offer, verdict, tuple(early))

    def _play(self, channel: MediaChannel, prompts: tuple[str, ...]) -> None:
        playout = channel.playout
        for name in prompts:
            samples = self._host.prompt(name, channel.rate)
            self._says += 1
            say_id = f"callback{self._says}"
            playout.begin(say_id, playout.generation)
            playout.admit(say_id, playout.generation, samples)
            playout.finish(say_id)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _drain(channel: MediaChannel) -> None:
    """While the offer plays: feed its audio to the media port; the caller's audio is not for
    any agent (nobody is listening yet)."""
    channel.collect()
    channel.discard_inbound()
    channel.playout.poll()


__all__ = ["CALLER_KEY", "Callbacks"]
