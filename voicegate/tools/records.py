"""The write path's rows in the store, written the same way live and at start-up.

An intent row is written from the logged intent (the ``tool_intent`` event carries the
arguments), so a crash between the event and its row loses nothing; a receipt row is written
before its ``tool_receipt`` event (seed 000: the receipt is durable before the session moves on).
"""

from __future__ import annotations

from session.state import Outstanding
from session.store import SessionStore, ToolIntent, ToolReceipt
from voicegate.tools.client import ToolOutcome


def ensure_intent_row(
    store: SessionStore, session_id: str, intent: Outstanding, *, at: float
) -> ToolIntent:
    """The intent row of a logged intent, written if it is missing. Raises IdempotencyConflict
    when the key belongs to another session or another request."""
    existing = store.intent(intent.key)
    if existing is not None and existing.session_id == session_id:
        return existing
    return store.record_intent(
        ToolIntent(
            idempotency_key=intent.key,
            session_id=session_id,
            turn_id=intent.turn_id,
            tool=intent.tool,
            kind=intent.kind,
            digest=intent.digest,
            arguments=dict(intent.arguments),
            created_at=at,
        )
    )


def store_receipt(
    store: SessionStore, key: str, outcome: ToolOutcome, *, via: str, at: float
) -> ToolReceipt:
    """Persist what became of ``key``; ``via`` says who learned it (request, status, startup)."""
    return store.record_receipt(
        ToolReceipt(key, outcome.outcome, {**outcome.detail, "via": via}, at)
    )
