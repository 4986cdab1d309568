"""``GET /v1/sessions/{id}/handoff``: what a person taking over a call needs, from the store.

Who called (masked, as the session's metadata keeps it), why the session is where it is, what the
caller heard last, every tool call with its receipt, and what is not known. It reads only the
store, so the pool's supervisor serves it too (voicegate/control/http_api.py adds the route to
both apps). The call centre finds the session from the ``X-Voicegate-Session`` header (or the
``User-to-User`` payload) of the transferred INVITE (docs/transfer.md).
"""

from __future__ import annotations

from typing import Any

from session.durable import DurableSession
from session.state import Signaling
from session.store import SessionStore
from telephony.sip_message import mask_uri
from voicegate.call.heard import heard_last


def handoff(store: SessionStore, session_id: str, *, live: bool) -> dict[str, Any] | None:
    """The handoff summary of ``session_id``, or None if there is no such session."""
    summary = store.get(session_id)
    if summary is None:
        return None
    state = DurableSession.load(store, session_id).state
    events = list(store.events(session_id))
    tool_calls = []
    unknown = []
    outstanding = set(state.outstanding_keys())
    for record in events:
        if record.type != "tool_intent":
            continue
        key = str(record.payload.get("key", ""))
        receipt = store.receipt(key)
        tool_calls.append(
            {
                "key": key,
                "tool": record.payload.get("tool"),
                "kind": record.payload.get("kind"),
                "turn_id": record.payload.get("turn_id"),
                "arguments": dict(record.payload.get("arguments") or {}),
                "requested_at": record.at,
                "receipt": None
                if receipt is None
                else {"outcome": receipt.outcome, "detail": dict(receipt.detail), "at": receipt.at},
            }
        )
        if key in outstanding or (receipt is not None and receipt.outcome == "unknown"):
            unknown.append(f"whether tool call {key} ({record.payload.get('tool')}) took effect")
    meta = dict(summary.meta)
    ended = state.ended
    if ended is not None:
        why = ended.reason
    elif state.signaling is Signaling.AWAY:
        # Transferred out, and the caller may come back with the handle (session/away.py).
        why = "transferred"
    elif state.transfer is not None:
        # A desk reads this while it takes the caller: a transfer is no fault.
        why = state.transfer_summary()
    elif state.recovery is not None:
        why = f"recovering {'+'.join(state.recovery.interruptions)}"
    else:
        why = "live"
    return {
        "session_id": session_id,
        "live": live,
        "who": {
            "caller": meta.get("caller"),  # masked when the session was created
            "called_user": meta.get("called_user"),
            "transport": meta.get("transport"),
        },
        "why": why,
        "state": ended.terminal_state if ended is not None else None,
        "stage": ended.stage if ended is not None else None,
        "status": state.status(),
        "away_until": state.away_until,
        "transfer": None
        if not state.transfer_target
        else {
            "target": mask_uri(state.transfer_target),
            "last_status": state.transfer_status or None,
        },
        "heard_last": heard_last(events),
        "tool_calls": tool_calls,
        "unknown": unknown,
    }
