"""The agent's tool calls, by the agent's own call id: each request sent once, its result kept.

voicegate derives the idempotency key from the session and the agent's ``call_id`` (and the
agent session's epoch: a session started again after a refused resume numbers its calls
afresh, so its ``pay-1`` is a new request). The same ``call_id`` again with the same request is
answered from the record, the original outcome or ``pending``: never a second execution (seed
004, "reclaim, don't resend"); with another request it is refused.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents.base import ToolResult
from agents.remote.protocol import ProtocolError


@dataclass(slots=True)
class _ToolCall:
    key: str
    tool: str
    arguments: str  # canonical JSON: the same call_id must mean the same request
    result: dict[str, Any] | None = None


class ToolCalls:
    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._calls: dict[str, _ToolCall] = {}  # the agent's call id -> its request
        self._by_key: dict[str, str] = {}  # idempotency key -> the agent's call id
        self._epoch = 0  # agent sessions started again
        self._epoch_tag = ""  # a rejoined call's own key space (rejoined)

    def restart(self) -> None:
        """A new agent session: its call ids are new requests. Results of the old session's
        calls are still told, under their call id."""
        self._epoch += 1
        self._calls.clear()

    def rejoined(self) -> None:
        """The session's caller came back on a new call (a rejoin): a new agent session whose
        call ids restart, in a key space of their own. The session id is the same as before the
        transfer and an epoch count may repeat one of an earlier call's restarts, so the mark is
        random: ``pay-1`` after a rejoin is never taken for the ``pay-1`` before it."""
        self._epoch_tag = f"r{secrets.token_hex(8)}"
        self._calls.clear()

    def reclaim(self, message: Mapping[str, Any]) -> dict[str, Any] | None:
        """The answer to a ``tool.call`` whose ``call_id`` is known (``duplicate``), or None
        for a new one; :class:`ProtocolError` for a call id reused for another request."""
        call_id, tool = message["call_id"], message["tool"]
        known = self._calls.get(call_id)
        if known is None:
            return None
        if (known.tool, known.arguments) != (tool, _canonical(message["arguments"])):
            raise ProtocolError(
                "schema", f"call_id {call_id} was used for another request", message["seq"]
            )
        result = known.result or {
            "type": "tool.result",
            "call_id": call_id,
            "tool": tool,
            "outcome": "pending",
            "detail": {},
        }
        return {**result, "duplicate": True}

    def new_key(self, message: Mapping[str, Any]) -> str:
        """Record a new request and return its idempotency key."""
        call_id = message["call_id"]
        epoch = f"/{self._epoch}" if self._epoch else ""  # the first keeps its old form
        if self._epoch_tag:
            epoch = f"/{self._epoch_tag}{epoch}"
        digest = hashlib.sha256(f"{self._session_id}{epoch}/{call_id}".encode()).hexdigest()
        key = f"ra-{digest[:32]}"
        self._calls[call_id] = _ToolCall(key, message["tool"], _canonical(message["arguments"]))
        self._by_key[key] = call_id
        return key

    def result_message(self, result: ToolResult) -> dict[str, Any] | None:
        """The ``tool.result`` for ``result`` (kept for a reclaim unless pending), or None if
        the agent never asked for it."""
        call_id = self._by_key.get(result.key)
        if call_id is None:
            return None
        body = {
            "type": "tool.result",
            "call_id": call_id,
            "tool": result.tool,
            "outcome": result.outcome,
            "detail": dict(result.detail),
            "duplicate": result.duplicate,
        }
        known = self._calls.get(call_id)
        if result.outcome != "pending" and known is not None and known.key == result.key:
            known.result = body
        return body


def _canonical(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))
