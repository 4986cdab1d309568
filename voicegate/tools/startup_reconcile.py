"""At start-up: settle what a dead predecessor left in flight, then let the reaper finalise it.

A worker that restarts after a crash owns the sessions its earlier incarnation left open. Each
gets ``owner_lost`` (the caller is gone), then every outstanding intent is settled, from a stored
receipt or the provider's status endpoint, and recorded as a ``tool_receipt`` (an unknown outcome
ends the session ``needs_human``). Only then does the reaper finalise what is left as ``failed``.
Before writing, each session is taken over (its lease moves to the next epoch), so a predecessor
that was only stalled, not dead, can no longer write to it. The taker is ``<me>/reconcile``, not
``me``: what it leaves open is still a predecessor's session, which ``reap_predecessors`` (it
skips only ``me``'s own live sessions) finalises next. A session another process takes over
meanwhile is left to that process.
Every store call runs on the writer thread (``write``), never on the event loop.
Nothing is ever sent again (seed 000: "Automatically replaying the last tool request after
reconnection, causing duplicate charges" is the failure this prevents).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from config.tools import ToolSettings
from session import effects as fx
from session import events as sev
from session.durable import DurableSession
from session.store import LeaseLost, SessionFinished, SessionStore, SessionSummary, ToolReceipt
from session.vocabulary import DEFINITIVE, Outcome, OwnerId
from voicegate.tools.client import ToolClient, ToolOutcome
from voicegate.tools.records import ensure_intent_row, store_receipt

log = logging.getLogger("voicegate.reconcile")

Write = Callable[[Callable[[SessionStore], Any]], Awaitable[Any]]


async def settle_predecessors(
    write: Write,
    client: ToolClient,
    tools: Mapping[str, ToolSettings],
    *,
    worker: str,
    me: str,
    attempts: int,
    deadline_s: float,
    record_effects: Callable[[list[fx.Effect]], None],
    on_outcome: Callable[[str, str], None],
    now: Callable[[], float] = time.time,
) -> int:
    """Reconcile the outstanding intents of dead predecessors' sessions; returns how many."""
    settled = 0
    prefix = OwnerId.prefix(worker)
    summaries: list[SessionSummary] = await write(
        lambda store: store.open_sessions(owner_prefix=prefix)
    )
    for summary in summaries:
        if summary.owner == me:
            continue
        sid = summary.session_id

        def load(store: SessionStore, sid: str = sid) -> DurableSession:
            return DurableSession.load(store, sid)

        if not (await write(load)).state.outstanding:
            continue  # nothing in flight: the reaper alone finalises it

        def take(store: SessionStore, sid: str = sid) -> DurableSession:
            session = DurableSession.take_over(store, sid, owner=f"{me}/reconcile", now=now())
            # The writer's store is the session's: its steps run on the writer thread too.
            return session

        def step(session: DurableSession, event: sev.Event) -> Callable[[SessionStore], Any]:
            return lambda _store: session.apply(event, now())

        try:
            session = await write(take)
            lost = sev.OwnerLost("the process serving the call died")
            record_effects(await write(step(session, lost)))
        except (LeaseLost, SessionFinished) as exc:
            _left_to_another(sid, exc)
            continue
        for intent in session.state.outstanding:
            if session.state.terminal:
                break

            def stored(store: SessionStore, key: str = intent.key) -> ToolReceipt | None:
                return store.receipt(key)

            outcome = await _settle(
                await write(stored), client, tools, intent.key, intent.tool, attempts, deadline_s
            )

            def persist(
                store: SessionStore, sid: str = sid, intent: Any = intent, outcome: Any = outcome
            ) -> None:
                # A crash between the intent event and its row: the log is the truth, its
                # arguments too. The receipt is durable before the session hears of it.
                ensure_intent_row(store, sid, intent, at=now())
                store_receipt(store, intent.key, outcome, via="startup", at=now())

            await write(persist)
            receipt = sev.ToolReceipt(
                intent.key, outcome.outcome, str(outcome.detail.get("reason", ""))
            )
            try:
                record_effects(await write(step(session, receipt)))
            except LeaseLost as exc:
                # The stored receipt stays: whoever owns the session now settles from it.
                _left_to_another(sid, exc)
                break
            on_outcome(intent.tool, outcome.outcome)
            settled += 1
            log.warning(
                "reconcile.settled",
                extra={"session_id": sid, "key": intent.key, "outcome": outcome.outcome},
            )
    return settled


def _left_to_another(session_id: str, exc: LeaseLost | SessionFinished) -> None:
    # Another process took the session over, or finalised it, first: it is that process's now.
    log.warning("reconcile.lease_lost", extra={"session_id": session_id, "why": str(exc)})


async def _settle(
    receipt: ToolReceipt | None,
    client: ToolClient,
    tools: Mapping[str, ToolSettings],
    key: str,
    tool_name: str,
    attempts: int,
    deadline_s: float,
) -> ToolOutcome:
    if receipt is not None and receipt.outcome in DEFINITIVE:
        return ToolOutcome(receipt.outcome, receipt.detail)
    tool = tools.get(tool_name)
    if tool is None:
        return ToolOutcome(
            Outcome.UNKNOWN, {"reason": f"tool {tool_name!r} is no longer configured"}
        )
    return await client.resolve(tool, key, attempts=attempts, deadline_s=deadline_s, seed=key)
