"""What the caller heard last, read from a session's log: the handoff tells the desk (its
``heard_last``), and a rejoined session tells its agent (voicegate/call/rejoin.py), the same."""

from __future__ import annotations

from typing import Any

from session.store import EventRecord


def heard_last(events: list[EventRecord]) -> dict[str, Any]:
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


def heard_last_line(events: list[EventRecord]) -> str:
    """:func:`heard_last` as the agent hears it on a rejoin: ``prompt NAME``, ``response ID``,
    or "" when nothing was heard."""
    last = heard_last(events)
    if last["prompt"]:
        return f"prompt {last['prompt']}"
    return f"response {last['response_id']}" if last["response_id"] else ""
