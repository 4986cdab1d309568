"""At start-up: settle what a dead predecessor left in flight, then let the reaper finalise it.

A worker that restarts after a crash owns the sessions its earlier incarnation left open. Each
gets ``owner_lost`` (the caller is gone), and the session machine says what becomes of each
outstanding intent (session/ledger.py): one whose log shows it never left (admitted or held) is
settled ``not_started`` at once (``SettleUnsent``); one that may have reached its provider is
asked about by key (``Reconcile``). Those effects run through the same executor as a live
call's (voicegate/call/executor.py), on :class:`Afterlife`, the actions of a call that is gone:
nothing is said, played or sent. Every receipt is durable before its ``tool_receipt`` is folded
in (an unknown outcome, or one contradicting the receipt on record, ends the session
``needs_human``). Only then does the reaper finalise what is left as ``failed``.

Before writing, each session is taken over (its lease moves to the next epoch), so a predecessor
that was only stalled, not dead, can no longer write to it. The taker is ``<me>/reconcile``, not
``me``: what it leaves open is still a predecessor's session, which ``reap_predecessors`` (it
skips only ``me``'s own live sessions) finalises next. A session another process takes over
meanwhile is left to that process. Every store call runs on the writer thread (``write``), never
on the event loop. Nothing is ever sent again (seed 000: "Automatically replaying the last tool
request after reconnection, causing duplicate charges" is the failure this prevents).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from config.tools import ToolSettings
from session import effects as fx
from session import events as sev
from session import ledger
from session.callback import may_park
from session.durable import DurableSession
from session.errors import IllegalTransition
from session.machine import OWNED
from session.state import DROPPED_STATUS, Outstanding, SessionState, Signaling
from session.store import (
    IdempotencyConflict,
    LeaseLost,
    SessionFinished,
    SessionStore,
    SessionSummary,
    ToolReceipt,
)
from session.vocabulary import Outcome
from voicegate.call.executor import execute
from voicegate.tools.client import ToolClient, ToolOutcome
from voicegate.tools.records import ensure_intent_row, store_receipt

log = logging.getLogger("voicegate.reconcile")

Write = Callable[[Callable[[SessionStore], Any]], Awaitable[Any]]


class Afterlife:
    """The actions of a call whose process died (voicegate/call/executor.py's EffectTarget):
    nobody is on the line and no agent listens, so only what settles intents is work, queued
    for :func:`settle_predecessors` in the order the machine asked for it."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.work: deque[tuple[str, str, str]] = deque()  # (what, key, reason)

    def reconcile(self, keys: tuple[str, ...]) -> None:
        self.work.extend(("query", key, "") for key in keys)

    def settle_unsent(self, key: str, reason: str) -> None:
        self.work.append(("unsent", key, reason))

    def persist_outstanding(self, keys: tuple[str, ...]) -> None:
        self.work.extend(("row", key, "") for key in keys)

    def send_tool_request(self, key: str) -> None:
        # The machine releases held writes only for a caller still there; never here.
        log.error("reconcile.send_refused", extra={"session_id": self.session_id, "key": key})

    # What only a live call has: nothing to do for one that is gone.
    def clear_playout(self, generation: int) -> None: ...
    def cancel_response(self, response_id: str) -> None: ...
    def bind_response(self, response_id: str, generation: int) -> None: ...
    def stop_generation(self) -> None: ...
    def gate_changed(self, old: str, new: str) -> None: ...
    def recovery_started(self, generation: int, interruption: str, deadline: float) -> None: ...
    def attempt_recovery(
        self, generation: int, attempt: int, interruptions: tuple[str, ...]
    ) -> None: ...
    def recovery_finished(self, generation: int, outcome: str) -> None: ...
    def transfer_ended(
        self, generation: int, mode: str, outcome: str, duration_s: float
    ) -> None: ...
    def schedule_timer(self, name: str, due: float, generation: int, attempt: int) -> None: ...
    def cancel_timer(self, name: str) -> None: ...
    def cancel_tool_calls(self, keys: tuple[str, ...]) -> None: ...
    def say(self, prompt: str) -> None: ...
    def notify_agent(self, what: str, detail: str) -> None: ...
    def release_media(self) -> None: ...
    def hang_up(self, reason: str, *, after_prompt: bool) -> None: ...
    def finished(self, terminal_state: str, reason: str, stage: str | None) -> None: ...
    def stale_event_ignored(self, event_type: str, why: str) -> None: ...


async def settle_predecessors(
    write: Write,
    client: ToolClient,
    tools: Mapping[str, ToolSettings],
    *,
    prefix: str,
    me: str,
    attempts: int,
    deadline_s: float,
    record_effects: Callable[[list[fx.Effect]], None],
    on_outcome: Callable[[str, str], None],
    on_parked: Callable[[str], None] = lambda session_id: None,
    now: Callable[[], float] = time.time,
) -> int:
    """Reconcile the outstanding intents of the dead owners' sessions whose owner ids start
    with ``prefix`` (a worker's predecessors, or every worker of a dead node); returns how many.
    A caller cut off with a write under way gets its session parked for a callback
    (session/callback.py), settled all the same."""
    summaries: list[SessionSummary] = await write(
        lambda store: store.open_sessions(owner_prefix=prefix)
    )
    return await _settle(
        write, client, tools, [s for s in summaries if s.owner != me],
        lambda state: bool(state.outstanding) or may_park(state),
        me=me, attempts=attempts, deadline_s=deadline_s, record_effects=record_effects,
        on_outcome=on_outcome, on_parked=on_parked, now=now,
    )  # fmt: skip


async def settle_lapsed_drops(
    write: Write,
    client: ToolClient,
    tools: Mapping[str, ToolSettings],
    *,
    me: str,
    attempts: int,
    deadline_s: float,
    record_effects: Callable[[list[fx.Effect]], None],
    on_outcome: Callable[[str, str], None],
    now: Callable[[], float] = time.time,
) -> int:
    """Dropped sessions whose callback window passed with a write outstanding (the caller cut
    off while its request was in flight, and never called back): each intent is asked about by
    key before the sweep ends the session, so its ending records what the provider did rather
    than leave it unknown (an answer that stays unknown ends it ``needs_human``)."""
    summaries: list[SessionSummary] = await write(lambda store: store.open_sessions())
    dropped = [s for s in summaries if s.status.startswith(DROPPED_STATUS)]
    at = now()
    return await _settle(
        write, client, tools, dropped,
        lambda state: bool(state.outstanding)
        and state.dropped_until is not None
        and state.dropped_until <= at,
        me=me, attempts=attempts, deadline_s=deadline_s, record_effects=record_effects,
        on_outcome=on_outcome, on_parked=lambda session_id: None, now=now,
    )  # fmt: skip


async def _settle(
    write: Write,
    client: ToolClient,
    tools: Mapping[str, ToolSettings],
    summaries: list[SessionSummary],
    wanted: Callable[[SessionState], bool],
    *,
    me: str,
    attempts: int,
    deadline_s: float,
    record_effects: Callable[[list[fx.Effect]], None],
    on_outcome: Callable[[str, str], None],
    on_parked: Callable[[str], None],
    now: Callable[[], float],
) -> int:
    settled = 0
    for summary in summaries:
        sid = summary.session_id

        def load(store: SessionStore, sid: str = sid) -> DurableSession:
            return DurableSession.load(store, sid)

        state = (await write(load)).state
        park = may_park(state)
        if not wanted(state):
            continue  # nothing in flight and nobody to call back: the reaper finalises it
        resuming = state.signaling in (Signaling.GONE, Signaling.DROPPED)
        if not resuming and state.signaling not in OWNED:
            continue  # away: its rejoin or its expiry settles it (session/away.py)

        def take(store: SessionStore, sid: str = sid) -> DurableSession:
            # The writer's store is the session's: its steps run on the writer thread too.
            return DurableSession.take_over(store, sid, owner=f"{me}/reconcile", now=now())

        try:
            session: DurableSession = await write(take)
        except (LeaseLost, SessionFinished) as exc:
            _left_to_another(sid, exc)
            continue
        target = Afterlife(sid)
        step = _stepper(write, session, target, record_effects, now)
        try:
            if resuming:
                # The owner was already lost (an earlier settler died half-way): carry on
                # from the log, as owner_lost's own effects would have.
                query, unsent = ledger.settle_plan(session.state.outstanding)
                target.work.extend(("unsent", key, ledger.NEVER_SENT) for key in unsent)
                target.reconcile(query)
            else:
                await step(sev.OwnerLost("the process serving the call died", park=park))
            if park and not resuming:
                on_parked(sid)
                log.warning("reconcile.parked", extra={"session_id": sid})
            while target.work:
                what, key, reason = target.work.popleft()
                intent = next((o for o in session.state.outstanding if o.key == key), None)
                if intent is None:
                    continue
                if what == "row":
                    await write(_row(sid, intent, now))
                    continue
                if what == "unsent":
                    outcome = ToolOutcome(Outcome.NOT_STARTED, {"reason": reason})
                    via = "ledger"
                else:
                    stored = await write(_receipt_of(key))
                    outcome = await _ask(stored, client, tools, intent, attempts, deadline_s)
                    via = "startup"
                event = await write(_persist(sid, intent, outcome, via, now))
                await step(event)
                if isinstance(event, sev.ToolReceipt):
                    on_outcome(intent.tool, outcome.outcome)
                    settled += 1
                log.warning(
                    "reconcile.settled",
                    extra={"session_id": sid, "key": key, "outcome": outcome.outcome, "via": via},
                )
        except IllegalTransition as exc:
            # A log this release cannot step on: leave it to the reaper and a person, and go on
            # with the others (one bad session must not stop a start-up or a take-over).
            log.error("reconcile.refused", extra={"session_id": sid, "why": str(exc)})
        except (LeaseLost, SessionFinished) as exc:
            # What is stored stays: whoever owns the session now settles from it.
            _left_to_another(sid, exc)
    return settled


def _stepper(
    write: Write,
    session: DurableSession,
    target: Afterlife,
    record_effects: Callable[[list[fx.Effect]], None],
    now: Callable[[], float],
) -> Callable[[sev.Event], Awaitable[None]]:
    """Fold an event on the writer thread (persist), then carry out its effects (act)."""

    async def step(event: sev.Event) -> None:
        effects: list[fx.Effect] = await write(lambda _store: session.apply(event, now()))
        record_effects(effects)
        execute(effects, target)

    return step


def _row(
    session_id: str, intent: Outstanding, now: Callable[[], float]
) -> Callable[[SessionStore], object]:
    return lambda store: ensure_intent_row(store, session_id, intent, at=now())


def _receipt_of(key: str) -> Callable[[SessionStore], ToolReceipt | None]:
    return lambda store: store.receipt(key)


def _persist(
    session_id: str, intent: Outstanding, outcome: ToolOutcome, via: str, now: Callable[[], float]
) -> Callable[[SessionStore], sev.Event]:
    """The rows, durable before the session hears of them: the intent's (a crash between the
    intent event and its row: the log is the truth, its arguments too), then the receipt's.
    Returns the event to fold: the receipt, or the conflict with the receipt on record."""

    def persist(store: SessionStore) -> sev.Event:
        ensure_intent_row(store, session_id, intent, at=now())
        try:
            store_receipt(store, intent.key, outcome, via=via, at=now())
        except IdempotencyConflict as exc:
            log.error(
                "tool.receipt_conflict",
                extra={"session_id": session_id, "key": intent.key, "stored": exc.stored},
            )
            return sev.ToolReceiptConflicted(intent.key, exc.stored or "", exc.offered or "")
        return sev.ToolReceipt(intent.key, outcome.outcome, str(outcome.detail.get("reason", "")))

    return persist


def _left_to_another(session_id: str, exc: LeaseLost | SessionFinished) -> None:
    # Another process took the session over, or finalised it, first: it is that process's now.
    log.warning("reconcile.lease_lost", extra={"session_id": session_id, "why": str(exc)})


async def _ask(
    receipt: ToolReceipt | None,
    client: ToolClient,
    tools: Mapping[str, ToolSettings],
    intent: Outstanding,
    attempts: int,
    deadline_s: float,
) -> ToolOutcome:
    """What became of an intent that may have reached its provider: the definitive receipt on
    record, or its status endpoint's answer (never the request again)."""
    if receipt is not None and ledger.settled_on_record(receipt.outcome):
        return ToolOutcome(receipt.outcome, receipt.detail)
    tool = tools.get(intent.tool)
    if tool is None:
        return ToolOutcome(
            Outcome.UNKNOWN, {"reason": f"tool {intent.tool!r} is no longer configured"}
        )
    key = intent.key
    return await client.resolve(tool, key, attempts=attempts, deadline_s=deadline_s, seed=key)
