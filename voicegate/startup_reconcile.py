"""At start-up: settle what a dead predecessor left in flight, then let the reaper finalise it.

A worker that restarts after a crash owns the sessions its earlier incarnation left open. Each
gets ``owner_lost`` (the caller is gone), then every outstanding intent is settled, from a stored
receipt or the provider's status endpoint, and recorded as a ``tool_receipt`` (an unknown outcome
ends the session ``needs_human``). Only then does the reaper finalise what is left as ``failed``.
Nothing is ever sent again (seed 000: "Automatically replaying the last tool request after
reconnection, causing duplicate charges" is the failure this prevents).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from config.tools import ToolSettings
from session import effects as fx
from session import events as sev
from session.durable import DurableSession
from session.store import SessionStore, ToolIntent, ToolReceipt
from voicegate.tool_client import DEFINITIVE, ToolClient, ToolOutcome

log = logging.getLogger("voicegate.reconcile")


async def settle_predecessors(
    store: SessionStore,
    client: ToolClient,
    tools: Mapping[str, ToolSettings],
    *,
    worker: str,
    me: str,
    attempts: int,
    deadline_s: float,
    record_effects: Callable[[list[fx.Effect]], None],
    on_outcome: Callable[[str, str], None],
    wall: Callable[[], float] = time.time,
) -> int:
    """Reconcile the outstanding intents of dead predecessors' sessions; returns how many."""
    settled = 0
    for summary in store.open_sessions(owner_prefix=f"{worker}/"):
        if summary.owner == me:
            continue
        session = DurableSession.load(store, summary.session_id)
        if not session.state.outstanding:
            continue  # nothing in flight: the reaper alone finalises it
        record_effects(session.apply(sev.OwnerLost("the process serving the call died"), wall()))
        for intent in session.state.outstanding:
            if session.state.terminal:
                break
            outcome = await _settle(
                store, client, tools, intent.key, intent.tool, attempts, deadline_s
            )
            if store.intent(intent.key) is None:
                # The crash fell between the intent event and its row: the log is the truth.
                store.record_intent(
                    ToolIntent(
                        intent.key,
                        summary.session_id,
                        intent.turn_id,
                        intent.tool,
                        intent.kind,
                        intent.digest,
                        {},
                        wall(),
                    )
                )
            store.record_receipt(
                ToolReceipt(
                    intent.key, outcome.outcome, {**outcome.detail, "via": "startup"}, wall()
                )
            )
            record_effects(
                session.apply(
                    sev.ToolReceipt(
                        intent.key, outcome.outcome, str(outcome.detail.get("reason", ""))
                    ),
                    wall(),
                )
            )
            on_outcome(intent.tool, outcome.outcome)
            settled += 1
            log.warning(
                "reconcile.settled",
                extra={
                    "session_id": summary.session_id,
                    "key": intent.key,
                    "outcome": outcome.outcome,
                },
            )
    return settled


async def _settle(
    store: SessionStore,
    client: ToolClient,
    tools: Mapping[str, ToolSettings],
    key: str,
    tool_name: str,
    attempts: int,
    deadline_s: float,
) -> ToolOutcome:
    receipt = store.receipt(key)
    if receipt is not None and receipt.outcome in DEFINITIVE:
        return ToolOutcome(receipt.outcome, receipt.detail)
    tool = tools.get(tool_name)
    if tool is None:
        return ToolOutcome("unknown", {"reason": f"tool {tool_name!r} is no longer configured"})
    return await client.resolve(tool, key, attempts=attempts, deadline_s=deadline_s, seed=key)
