"""The write path of one call: intent, request, receipt, and reconciliation by status query.

Order of a write (seed 000; ARCHITECTURE.md "Side effects"), each step durable before the next:
1. the ``tool_intent`` event (the session machine refuses it unless the gate is open), then the
   intent row with its unique idempotency key;
2. the ``tool_request_sent`` event, then the HTTP request with ``Idempotency-Key``;
3. the receipt row (committed, failed, not_started or unknown), then the ``tool_receipt`` event.
A crash between any two steps leaves an intent without a receipt, which reconciliation resolves by
asking the provider's status endpoint about the key, never by sending the request again.

Session events are applied only by the call's own task: HTTP work runs in tasks that hand their
outcome back through the call's queue as :class:`ToolDone`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.base import ToolResult
from config.tools import ToolSettings
from session import events as sev
from session.machine import GateClosed, IllegalTransition
from session.state import Outstanding
from session.store import SessionStore, StoreError, ToolIntent, ToolReceipt
from session.store.reader import StoreReader
from session.store.writer import StoreWriter
from session.vocabulary import DEFINITIVE, Outcome
from voicegate.faults import Faults
from voicegate.observe.metrics import Metrics
from voicegate.tools.client import ToolClient, ToolOutcome
from voicegate.tools.records import ensure_intent_row, store_receipt

log = logging.getLogger("voicegate.tools")


@dataclass(frozen=True, slots=True)
class ToolDone:
    """An HTTP outcome, handed back to the call's task to be recorded."""

    key: str
    outcome: ToolOutcome
    via: str  # "request" or "status"


@dataclass(frozen=True, slots=True)
class ToolRefused:
    """Delivered to the agent without anything being sent."""

    result: ToolResult


class ToolServices(Protocol):
    reader: StoreReader
    writer: StoreWriter
    metrics: Metrics
    faults: Faults
    tool_client: ToolClient
    tools: Mapping[str, ToolSettings]
    reconcile_timeout_s: float
    status_attempts: int


def _key_record(store: SessionStore, key: str) -> tuple[ToolIntent | None, ToolReceipt | None]:
    return store.intent(key), store.receipt(key)


def intent_digest(tool: str, arguments: Mapping[str, Any], session_id: str, turn_id: str) -> str:
    """sha256 of the canonical intent: the same ask in the same turn of a session is the same."""
    canonical = json.dumps(
        {"tool": tool, "arguments": arguments, "session": session_id, "turn": turn_id},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class CallTools:
    session_id: str
    services: ToolServices
    apply: Callable[[sev.Event], object]  # the call's durable apply (raises IllegalTransition)
    post: Callable[[object], None]  # put an item on the call's own queue
    current_turn: Callable[[], str]
    find_outstanding: Callable[[str], Outstanding | None]  # the session's own view of a key
    durable: Callable[[], Future[None] | None]  # the write of the last step applied
    wall: Callable[[], float]  # recorded timestamps of intent and receipt rows
    # Runs ``then(done)`` in the call's task once a store job's future resolves (from any
    # thread): store reads leave the event loop, their answers come back in order.
    in_task: Callable[[Callable[[Future[Any]], None], Future[Any]], None]
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    receipts_seen: int = 0

    # --- asked by the agent (inside the call's task) -----------------------------------------

    def request(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        key: str | None,
        approved: bool,
        *,
        spoken: bool = False,
    ) -> str:
        """``approved``: asked while the caller's key press is handled; ``spoken``: asked right
        after the caller's spoken confirmation was logged (a ``caller_said`` ``confirmed``),
        which only a tool with ``approval = "caller"`` takes as approval."""
        services = self.services
        turn_id = self.current_turn()
        digest = intent_digest(tool_name, arguments, self.session_id, turn_id)
        key = key or f"vg-{self.session_id[:12]}-{digest[:24]}"
        tool = services.tools.get(tool_name)
        if tool is None:
            return self._refuse(tool_name, key, f"no tool named {tool_name!r} is configured")
        if (in_flight := self._in_flight_intent(key)) is not None:
            return self._admit(tool, tool_name, key, digest, turn_id, arguments, approved, spoken,
                               in_flight, None)  # fmt: skip

        # Has this key been used before (a duplicate, or another session's)? Asked off the
        # loop; the answer comes back in the call's task, which admits or refuses the call.
        def admit(done: Future[tuple[ToolIntent | None, ToolReceipt | None]]) -> None:
            try:
                stored, receipt = done.result()
            except StoreError as exc:
                self._refuse(tool_name, key, f"the session store cannot be read: {exc}")
                return
            self._admit(tool, tool_name, key, digest, turn_id, arguments, approved, spoken,
                        stored or self._in_flight_intent(key), receipt)  # fmt: skip

        self.in_task(admit, services.reader.submit(lambda store: _key_record(store, key)))
        return key

    def _admit(
        self,
        tool: ToolSettings,
        tool_name: str,
        key: str,
        digest: str,
        turn_id: str,
        arguments: Mapping[str, Any],
        approved: bool,
        spoken: bool,
        existing: ToolIntent | None,
        receipt: ToolReceipt | None,
    ) -> str:
        services = self.services
        if existing is not None:
            if existing.digest != digest or existing.session_id != self.session_id:
                return self._refuse(tool_name, key, "this key was used for a different request")
            services.metrics.tool_duplicates_prevented.labels(tool_name).inc()
            outcome = receipt.outcome if receipt and receipt.outcome in DEFINITIVE else "pending"
            detail = dict(receipt.detail) if receipt else {}
            self.post(ToolRefused(ToolResult(tool_name, key, outcome, detail, duplicate=True)))
            return key
        needs_approval = tool.kind == "write" and tool.approval != "none"
        if needs_approval and not (approved or (spoken and tool.approval == "caller")):
            how = "by key press" if tool.approval == "dtmf" else "by key press or by voice"
            return self._refuse(tool_name, key, f"the caller has not confirmed it {how}")
        services.faults.reached("before_intent_persist")
        try:
            if needs_approval:
                self.apply(sev.ApprovalGiven(f"{turn_id}:{digest[:16]}"))
            self.apply(sev.ToolIntent(key, tool_name, tool.kind, digest, turn_id, dict(arguments)))
        except GateClosed:
            return self._refuse(tool_name, key, "side effects are frozen while the call recovers")
        except IllegalTransition as exc:
            return self._refuse(tool_name, key, exc.why)
        # The ToolIntent step emitted SendToolRequest; its execution (send) happens in the same
        # effects pass, right after this row is durable.
        return key

    def _in_flight_intent(self, key: str) -> ToolIntent | None:
        """An intent the session holds whose row the writer may not have written yet."""
        intent = self.find_outstanding(key)
        if intent is None:
            return None
        return ToolIntent(
            key, self.session_id, intent.turn_id, intent.tool, intent.kind, intent.digest, {}, 0.0
        )

    def persist_intent(self, intent: Outstanding) -> Future[ToolIntent]:
        """The intent row, from the logged intent (its event is already durable)."""
        session_id, at = self.session_id, self.wall()
        row = self.services.writer.submit(
            lambda store: ensure_intent_row(store, session_id, intent, at=at)
        )
        self.services.faults.reached("after_intent_persist")
        return row

    def persist_outstanding(self, intents: Sequence[Outstanding]) -> None:
        """PersistOutstanding: each intent the session leaves unsettled has its row, so that
        reconciliation (here, or at the next start) finds it; it is never assumed done."""
        session_id, at = self.session_id, self.wall()

        def persist(store: SessionStore) -> None:
            for intent in intents:
                try:
                    ensure_intent_row(store, session_id, intent, at=at)
                except StoreError as exc:
                    # The intent event is in the log (with its arguments): that stays the truth.
                    log.error(
                        "tool.intent_row_refused",
                        extra={"session_id": session_id, "key": intent.key, "why": str(exc)},
                    )

        self.services.writer.submit(persist)

    def _refuse(self, tool_name: str, key: str, reason: str) -> str:
        self.services.metrics.tool_calls.labels(tool_name, "refused").inc()
        log.info(
            "tool.refused",
            extra={"session_id": self.session_id, "tool": tool_name, "reason": reason},
        )
        self.post(ToolRefused(ToolResult(tool_name, key, "refused", {"reason": reason})))
        return key

    # --- effects of the session machine -------------------------------------------------------

    def send(self, intent: Outstanding, row: Future[ToolIntent]) -> None:
        """SendToolRequest: mark it sent, then, once that and the intent row are durable,
        send it, once."""
        services = self.services
        tool = services.tools[intent.tool]
        services.faults.reached("before_request_send")
        self.apply(sev.ToolRequestSent(intent.key))
        sent = self.durable()
        self._spawn(intent.key, self._send(tool, intent.key, dict(intent.arguments), row, sent))

    async def _send(
        self,
        tool: ToolSettings,
        key: str,
        body: Mapping[str, Any],
        row: Future[ToolIntent],
        sent: Future[None] | None,
    ) -> None:
        try:
            await asyncio.wrap_future(row)
            if sent is not None:
                await asyncio.wrap_future(sent)
        except StoreError as exc:
            # Not durable, so never sent: the logged intent is settled by a status query.
            log.error(
                "tool.not_sent",
                extra={"session_id": self.session_id, "key": key, "why": str(exc)},
            )
            return
        context = {"X-Voicegate-Session": self.session_id}
        outcome = await self.services.tool_client.request(tool, key, body, context)
        via = "request"
        if outcome.outcome == Outcome.UNKNOWN:
            # Never resend: ask what happened to this key.
            outcome = await self._resolve(tool, key)
            via = "status"
        self.post(ToolDone(key, outcome, via))

    def reconcile(self, keys: tuple[str, ...], tool_of: Callable[[str], str]) -> None:
        """Reconcile effect: settle each outstanding key from a stored receipt or the provider."""
        for key in keys:
            self._spawn(key, self._reconcile_one(self.services.tools.get(tool_of(key)), key))

    async def _reconcile_one(self, tool: ToolSettings | None, key: str) -> None:
        # Read on the writer's thread, behind every write this call submitted: a receipt row
        # still queued there is seen, not asked of the provider again.
        try:
            receipt = await asyncio.wrap_future(
                self.services.writer.submit(lambda store: store.receipt(key))
            )
        except StoreError:
            receipt = None  # the provider is asked; its answer is recorded as any other
        if receipt is not None and receipt.outcome in DEFINITIVE:
            self.post(ToolDone(key, ToolOutcome(receipt.outcome, receipt.detail), "store"))
            return
        if tool is None:
            outcome = ToolOutcome(Outcome.UNKNOWN, {"reason": "tool no longer configured"})
            self.post(ToolDone(key, outcome, "status"))
            return
        self.post(ToolDone(key, await self._resolve(tool, key), "status"))

    async def _resolve(self, tool: ToolSettings, key: str) -> ToolOutcome:
        services = self.services
        outcome = await services.tool_client.resolve(
            tool,
            key,
            attempts=services.status_attempts,
            deadline_s=services.reconcile_timeout_s,
            seed=key,
        )
        services.metrics.reconciliations.labels(outcome.outcome).inc()
        return outcome

    # --- back in the call's task ------------------------------------------------------------

    def record(self, done: ToolDone, tool_name: str) -> ToolResult:
        """Persist the receipt, then feed it to the session (which may end it needs_human)."""
        services = self.services
        services.faults.reached("before_receipt_persist")
        at = self.wall()
        # The writer keeps order: the receipt row is durable before the tool_receipt event.
        services.writer.submit(
            lambda store: store_receipt(store, done.key, done.outcome, via=done.via, at=at)
        )
        services.faults.reached("after_receipt_persist")
        self.receipts_seen += 1
        services.metrics.tool_calls.labels(tool_name, done.outcome.outcome).inc()
        self.apply(
            sev.ToolReceipt(
                done.key, done.outcome.outcome, str(done.outcome.detail.get("reason", ""))
            )
        )
        return ToolResult(tool_name, done.key, done.outcome.outcome, dict(done.outcome.detail))

    def _spawn(self, key: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[key] = task
        task.add_done_callback(lambda done: self._forget(key, done))

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]

    def cancel(self, keys: tuple[str, ...] | None = None) -> None:
        """Abandon in-flight HTTP work (all of it, or for ``keys``). What was sent stays an
        outstanding intent: reconciliation asks the provider about it, never sends it again."""
        for key, task in list(self._tasks.items()):
            if keys is None or key in keys:
                task.cancel()
