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
from session.store import EventRecord, SessionStore
from telephony.sip_message import mask_uri


def _heard_last(events: list[EventRecord]) -> dict[str, Any]:
    """The last thing played to the caller: a session prompt, or an agent's response, and how
    much of it was heard.

    A response's ``heard_ms`` is recorded when it ends, drained or cut, whoever cut it (the
    caller, the agent, a transfer, lost media, a hang-up, the end). A prompt is known from the
    ``say`` effect that queued it; its ``heard_ms`` is null while nothing says it was cut (it
    played out, or is still playing), and the ``prompt_cut`` written before the step that cut it
    says how much was heard. A line cut before a word of it played was never heard: what came
    before it stays the last thing heard. A response cut with no record of what was heard (a
    log older than that record) is named with ``heard_ms`` null.
    """
    heard: list[dict[str, Any]] = []
    for record in events:
        payload = record.payload
        if record.type in ("response_finished", "response_interrupted"):
            heard.append(
                {
                    "prompt": None,
                    "response_id": payload.get("response_id"),
                    "heard_ms": payload.get("heard_ms"),
                    "interrupted": record.type == "response_interrupted",
                    "at": record.at,
                }
            )
        elif record.type == "prompt_cut":
            prompt, heard_ms = payload.get("prompt"), payload.get("heard_ms")
            last = heard[-1] if heard else None
            queued = last is not None and last["prompt"] == prompt and last["heard_ms"] is None
            if not heard_ms:
                if queued:
                    heard.pop()
                continue
            line = {
                "prompt": prompt,
                "response_id": None,
                "heard_ms": heard_ms,
                "interrupted": True,
                "at": record.at,
            }
            if queued:
                heard[-1] = line
            else:
                heard.append(line)
        for effect in record.effects:
            if effect.get("kind") == "cancel_response":
                # A cut with nothing recorded before it (a log written before issue 35, or a
                # call with no media to measure): which response, not how much of it.
                heard.append(
                    {
                        "prompt": None,
                        "response_id": effect.get("response_id"),
                        "heard_ms": None,
                        "interrupted": True,
                        "at": record.at,
                    }
                )
            elif effect.get("kind") == "say":
                heard.append(
                    {
                        "prompt": effect.get("prompt"),
                        "response_id": None,
                        "heard_ms": None,
                        "interrupted": False,
                        "at": record.at,
                    }
                )
    if not heard:
        return {"prompt": None, "response_id": None, "heard_ms": None, "at": None}
    return heard[-1]


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
        "heard_last": _heard_last(events),
        "tool_calls": tool_calls,
        "unknown": unknown,
    }
