"""The calls of this process that present a resume handle: verified off the event loop, then
refused or started as their session's call (voicegate/call/rejoin.py says what is checked).

While a handle is being verified the INVITE has had its 180 and nothing else; a caller who
hangs up meanwhile is remembered, so a session taken over for them is told at once. A call that
rejoins takes its session's id (``Rekey`` on the SIP thread); events PJSIP posted under the
call's first id before that are routed by :attr:`Rejoins.aliases`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol

from session.resume import ResumeResult
from session.store import StoreError
from session.store.writer import StoreWriter
from telephony import events as ev
from telephony.sip_message import mask_uri
from voicegate.call.live_call import LiveCall
from voicegate.call.rejoin import Verdict, report_reuse, verify_and_take
from voicegate.observe.metrics import Metrics

log = logging.getLogger("voicegate.call")


class RejoinHost(Protocol):
    writer: StoreWriter
    metrics: Metrics
    owner: str
    resume_ttl_s: float
    calls: dict[str, LiveCall]

    def submit(self, command: ev.SipCommand) -> None: ...


class Rejoins:
    def __init__(
        self,
        host: RejoinHost,
        start: Callable[[ev.CallOffered, Verdict], LiveCall],
        wall: Callable[[], float],
    ) -> None:
        self._host = host
        self._start = start
        self._wall = wall
        self._pending: dict[str, bool] = {}  # call id -> the caller hung up meanwhile
        self.aliases: dict[str, str] = {}  # a rejoined call's first id -> its session's id
        self._tasks: set[asyncio.Task[None]] = set()

    def offered(self, offer: ev.CallOffered) -> None:
        self._pending[offer.call_id] = False
        task = asyncio.create_task(self._verify(offer), name=f"rejoin-{offer.call_id[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def route(self, call_id: str, event: ev.SipEvent) -> LiveCall | None:
        """The call an event of ``call_id`` belongs to, if it is a rejoin's."""
        if call_id in self._pending:
            if isinstance(event, ev.CallEnded):
                self._pending[call_id] = True
            return None
        session_id = self.aliases.get(call_id)
        if session_id is None:
            return None
        if isinstance(event, ev.CallEnded):
            del self.aliases[call_id]
        return self._host.calls.get(session_id)

    def ended(self, session_id: str) -> None:
        """The call of ``session_id`` is over: no alias of it is needed any more."""
        for first_id in [k for k, v in self.aliases.items() if v == session_id]:
            del self.aliases[first_id]

    def __contains__(self, call_id: str) -> bool:
        return call_id in self._pending or call_id in self.aliases

    async def _verify(self, offer: ev.CallOffered) -> None:
        host = self._host
        assert offer.resume is not None
        text, tenant, owner, ttl = offer.resume.text, offer.tenant, host.owner, host.resume_ttl_s
        now, live = self._wall(), frozenset(host.calls)
        try:
            verdict = await asyncio.wrap_future(
                host.writer.submit(
                    lambda store: verify_and_take(
                        store, text, tenant=tenant, owner=owner, now=now, ttl_s=ttl, live=live
                    )
                )
            )
        except StoreError as exc:
            self._pending.pop(offer.call_id, None)
            log.warning("call.rejoin_failed", extra={"call_id": offer.call_id, "error": str(exc)})
            host.submit(ev.Hangup(offer.call_id, status=503, reason="Session Store Unavailable"))
            return
        gone = self._pending.pop(offer.call_id, False)
        if not verdict.busy:
            host.metrics.resume_attempts.labels(verdict.result.value).inc()
        if verdict.session is None:
            self._refuse(offer, verdict)
            return
        session_id = verdict.session_id
        host.submit(ev.Rekey(offer.call_id, session_id))
        self.aliases[offer.call_id] = session_id
        call = self._start(dataclasses.replace(offer, call_id=session_id), verdict)
        if gone:
            # The caller hung up while the handle was checked: the session hears it now.
            call.deliver(ev.CallEnded(session_id, "caller", 487, "Request Terminated", False))

    def _refuse(self, offer: ev.CallOffered, verdict: Verdict) -> None:
        host = self._host
        log.info(
            "call.rejoin_refused",
            extra={
                "call_id": offer.call_id,
                "result": verdict.result.value,
                "busy": verdict.busy,
                "caller": mask_uri(offer.remote_uri),
            },
        )
        host.submit(ev.Hangup(offer.call_id, status=verdict.status, reason=verdict.phrase))
        if verdict.result is ResumeResult.REUSED and verdict.session_id:
            self._reused(verdict.session_id)

    def _reused(self, session_id: str) -> None:
        """Possibly a stolen handle (docs/tenants.md): the session's writes freeze."""
        host = self._host
        live = host.calls.get(session_id)
        if live is not None:
            live.resume_reused()
            return
        owner, now = host.owner, self._wall()
        host.writer.submit(lambda store: report_reuse(store, session_id, owner=owner, now=now))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
