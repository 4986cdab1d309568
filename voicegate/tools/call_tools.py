"""The write path of one call, carried out: intent, request, receipt, status query.

What is allowed, when, and what each answer means is session/ledger.py's (admission, the stages
of an intent, the classification of answers, seed 000's reconciliation table); this module does
what the ledger and the session machine decide, in their order, each step durable before the
next (seed 000; ARCHITECTURE.md "Side effects"):
1. the ``tool_intent`` event, then the intent row with its unique idempotency key;
2. the ``tool_request_sent`` event, then the HTTP request with ``Idempotency-Key``;
3. the receipt row, then (once it is durable) the ``tool_receipt`` event, or the
   ``tool_receipt_conflicted`` one when the row contradicts the receipt on record.

Session events are applied only by the call's own task: HTTP work runs in tasks that hand their
outcome back through the call's queue as :class:`ToolDone`, store reads and writes come back
through ``in_task``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.base import ToolResult
from config.tools import ToolSettings
from session import events as sev
from session import ledger
from session.machine import GateClosed, IllegalTransition
from session.state import Outstanding
from session.store import IdempotencyConflict, SessionStore, StoreError, ToolIntent, ToolReceipt
from session.store.writer import StoreWriter
from session.vocabulary import IntentKind, Outcome
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
    writer: StoreWriter
    metrics: Metrics
    faults: Faults
    tool_client: ToolClient
    tools: Mapping[str, ToolSettings]
    reconcile_timeout_s: float
    status_attempts: int


def rule_of(tool: ToolSettings) -> ledger.ToolRule:
    """What the ledger needs of a configured tool."""
    return ledger.ToolRule(
        tool.name, IntentKind(tool.kind), ledger.Approval(tool.approval), tool.approval_valid_s
    )



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
    # Keys this session settled, with their outcome: a later ask for one is a duplicate.
    settled: dict[str, ledger.Known] = field(default_factory=dict)
    # Keys whose request may have left (their HTTP began): never withheld, only reconciled.
    _on_the_wire: set[str] = field(default_factory=set)

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
        tool = services.tools.get(tool_name)
        ask = ledger.Ask(
            tool_name, dict(arguments), self.session_id, self.current_turn(), key,
            key_pressed=approved, spoken_yes=spoken,
        )  # fmt: skip
        rule = rule_of(tool) if tool is not None else None
        key = ledger.admit(ask, rule, None).key
        # Admitted now, at the gate as it is when the ask arrives (docs/agent-protocol.md). The
        # session knows every key it used: its outstanding intents and what it settled (its
        # own, and what a rejoin read back), so no store read runs on the event loop; a key of
        # another session's is refused by the store when the intent row is written (_send).
        known = self._in_flight_intent(key) or self.settled.get(key)
        return self._take(ledger.admit(ask, rule, known), tool_name, ask, rule)

    def remember(self, results: Sequence[ToolResult]) -> None:
        """Intents the session settled before this call took it up (a rejoin, a callback): an
        ask for one of their keys is a duplicate, answered with its outcome."""
        for result in results:
            self.settled[result.key] = ledger.Known(
                self.session_id, None, result.outcome, dict(result.detail)
            )

    def _take(
        self,
        verdict: ledger.Verdict,
        tool_name: str,
        ask: ledger.Ask,
        rule: ledger.ToolRule | None,
    ) -> str:
        """Carry out the ledger's verdict on an ask."""
        services = self.services
        match verdict:
            case ledger.Refused(key=key, reason=reason):
                return self._refuse(tool_name, key, reason)
            case ledger.Duplicate(key=key, outcome=outcome, detail=detail):
                services.metrics.tool_duplicates_prevented.labels(tool_name).inc()
                self.post(ToolRefused(ToolResult(tool_name, key, outcome, dict(detail), True)))
                return key
            case ledger.Admitted():
                pass
        assert rule is not None
        key = verdict.key
        services.faults.reached("before_intent_persist")
        try:
            if verdict.needs_approval:
                self.apply(sev.ApprovalGiven(verdict.approval_id))
            self.apply(
                sev.ToolIntent(
                    key, tool_name, rule.kind, verdict.digest, ask.turn_id,
                    dict(ask.arguments), verdict.approval_valid_s,
                )
            )  # fmt: skip
        except GateClosed:
            return self._refuse(tool_name, key, "side effects are frozen while the call recovers")
        except IllegalTransition as exc:
            return self._refuse(tool_name, key, exc.why)
        # The ToolIntent step emitted SendToolRequest; its execution (send) happens in the same
        # effects pass, right after this row is durable.
        return key

    def _in_flight_intent(self, key: str) -> ledger.Known | None:
        """An intent the session holds, whose row the writer may not have written yet."""
        intent = self.find_outstanding(key)
        if intent is None:
            return None
        return ledger.Known(self.session_id, intent.digest)

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
        except IdempotencyConflict as taken:
            # The key is another request's (an agent's own key, reused): this one never left.
            # Its receipt is the session's event alone: the key's rows are the other's.
            log.error("tool.key_taken", extra={"session_id": self.session_id, "key": key})
            done: Future[None] = Future()
            done.set_result(None)
            reason = taken.reason
            self.in_task(lambda _: self._key_taken(key, reason), done)
            return
        except StoreError as exc:
            # Not durable, so never sent: the logged intent is settled by a status query.
            log.error(
                "tool.not_sent",
                extra={"session_id": self.session_id, "key": key, "why": str(exc)},
            )
            return
        context = {"X-Voicegate-Session": self.session_id}
        # From here the request may leave: an interruption after this only stops the wait for
        # its answer, and reconciliation asks the provider. Before it, nothing has left.
        self._on_the_wire.add(key)
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
        if receipt is not None and ledger.settled_on_record(receipt.outcome):
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
        """Persist the receipt; once it is durable, feed it to the session (which may end it
        needs_human). A receipt that contradicts the one on record is fed as that conflict
        (seed 000's "conflicting receipt"), never as either answer."""
        services = self.services
        services.faults.reached("before_receipt_persist")
        at, session_id, intent = self.wall(), self.session_id, self.find_outstanding(done.key)

        def persist(store: SessionStore) -> ToolReceipt:
            # The intent's row first (a write settled before it was sent may have none yet).
            if intent is not None:
                ensure_intent_row(store, session_id, intent, at=at)
            return store_receipt(store, done.key, done.outcome, via=done.via, at=at)

        row = services.writer.submit(persist)
        self.in_task(lambda written: self._receipted(done, tool_name, written), row)
        return ToolResult(tool_name, done.key, done.outcome.outcome, dict(done.outcome.detail))

    def _receipted(self, done: ToolDone, tool_name: str, written: Future[Any]) -> None:
        services = self.services
        event: sev.Event
        try:
            written.result()
        except IdempotencyConflict as exc:
            services.metrics.tool_receipt_conflicts.labels(tool_name).inc()
            log.error(
                "tool.receipt_conflict",
                extra={
                    "session_id": self.session_id,
                    "key": done.key,
                    "stored": exc.stored,
                    "offered": exc.offered,
                },
            )
            event = sev.ToolReceiptConflicted(done.key, exc.stored or "", exc.offered or "")
        except StoreError as exc:
            # Not durable, so not folded in: the intent stays outstanding, settled by key later.
            log.error(
                "tool.receipt_not_recorded",
                extra={"session_id": self.session_id, "key": done.key, "why": str(exc)},
            )
            return
        else:
            services.faults.reached("after_receipt_persist")
            self.receipts_seen += 1
            services.metrics.tool_calls.labels(tool_name, done.outcome.outcome).inc()
            reason = str(done.outcome.detail.get("reason", ""))
            event = sev.ToolReceipt(done.key, done.outcome.outcome, reason)
        intent = self.find_outstanding(done.key)
        if intent is None:
            return  # settled meanwhile, or the session ended: the row is the record
        if isinstance(event, sev.ToolReceipt) and ledger.settled_on_record(event.outcome):
            self.settled[done.key] = ledger.Known(
                self.session_id, intent.digest, event.outcome, dict(done.outcome.detail)
            )
        try:
            self.apply(event)
        except (IllegalTransition, StoreError) as exc:
            log.warning(
                "tool.receipt_not_applied",
                extra={"session_id": self.session_id, "key": done.key, "why": str(exc)},
            )

    def _key_taken(self, key: str, reason: str) -> None:
        if self.find_outstanding(key) is None:
            return
        try:
            self.apply(sev.ToolReceipt(key, Outcome.NOT_STARTED, f"never sent: {reason}"))
        except (IllegalTransition, StoreError) as exc:
            log.warning("tool.receipt_not_applied", extra={"key": key, "why": str(exc)})

    def settle_unsent(self, key: str, reason: str) -> None:
        """SettleUnsent: the intent never left, so its receipt is ``not_started`` with
        ``reason``, recorded like any other (the agent hears it as a tool result)."""
        outcome = ToolOutcome(Outcome.NOT_STARTED, {"reason": reason})
        self.post(ToolDone(key, outcome, "ledger"))

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
                if key not in self._on_the_wire and self.find_outstanding(key) is not None:
                    # Logged sent, stopped before it left: the session holds it again.
                    self._withheld(key)

    def _withheld(self, key: str) -> None:
        done: Future[None] = Future()
        done.set_result(None)

        def hold(_: Future[None]) -> None:
            intent = self.find_outstanding(key)
            if intent is None or intent.stage != "sent":
                return
            log.info("tool.withheld", extra={"session_id": self.session_id, "key": key})
            try:
                self.apply(sev.ToolRequestWithheld(key))
            except (IllegalTransition, StoreError) as exc:
                log.warning("tool.withheld_refused", extra={"key": key, "why": str(exc)})

        self.in_task(hold, done)
