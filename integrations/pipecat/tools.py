"""The bot's side-effecting functions as voicegate tool calls: run once, answered once.

A Pipecat bot registers a function with its LLM; for a function that changes the world (a
charge, a booking) the handler from ``VoicegateTransport.tools.handler(name)`` does not run it
in the bot: it asks voicegate with ``tool.call``, under a ``call_id`` derived from the LLM's
tool-call id. voicegate derives the idempotency key from the session and the ``call_id``, holds
the call while the gate is frozen, settles a call in flight with the provider after a drop, and
answers exactly one ``tool.result`` (docs/agent-protocol.md, "Tool calls"). After a resume the
transport asks again with the same ``call_id`` for every call still unanswered (reclaim, don't
resend): voicegate answers from its record, never running it twice. The LLM gets the result
once, through the handler's ``result_callback``. Read-only functions stay in Pipecat.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipecat.services.llm_service import FunctionCallParams, LLMService

    from integrations.pipecat.link import Link
    from integrations.pipecat.transport import VoicegateTransport

log = logging.getLogger("voicegate.pipecat")

_CALL_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
FINAL = frozenset({"committed", "failed", "not_started", "refused"})


class CallEnded(Exception):
    """The call ended before voicegate answered (the record keeps the call for a person)."""


def call_id_for(tool_call_id: str) -> str:
    """A ``call_id`` voicegate accepts, the same for the same LLM tool-call id."""
    if _CALL_ID.match(tool_call_id):
        return tool_call_id
    return "pc-" + hashlib.sha256(tool_call_id.encode()).hexdigest()[:32]


@dataclass(slots=True)
class _Pending:
    tool: str
    arguments: dict[str, Any]
    answer: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ToolCalls:
    """The session's tool calls: sent once, reclaimed after a resume, answered once."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._pending: dict[str, _Pending] = {}
        self._results: dict[str, dict[str, Any]] = {}  # call_id -> the definitive tool.result

    async def call(self, tool: str, call_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Ask voicegate to run ``tool``; its one definitive result (``outcome``, ``detail``)."""
        if call_id in self._results:
            return self._results[call_id]
        pending = self._pending.get(call_id)
        if pending is None:
            pending = self._pending[call_id] = _Pending(tool, arguments)
            await self._send(call_id, pending)
        return await asyncio.shield(pending.answer)

    def result(self, message: dict[str, Any]) -> None:
        """A ``tool.result`` from voicegate: the first definitive one answers the call."""
        call_id = str(message.get("call_id"))
        if message.get("outcome") not in FINAL or call_id in self._results:
            return  # pending (the first is still running), or an answer we already have
        result = {"outcome": message["outcome"], "detail": message.get("detail") or {}}
        self._results[call_id] = result
        pending = self._pending.pop(call_id, None)
        if pending is not None and not pending.answer.done():
            pending.answer.set_result(result)

    async def reclaim(self) -> None:
        """After a resume: ask again, same call_id, for every call still unanswered."""
        for call_id, pending in list(self._pending.items()):
            await self._send(call_id, pending)

    def ended(self) -> None:
        for pending in self._pending.values():
            if not pending.answer.done():
                pending.answer.set_exception(CallEnded("the call ended before the result"))
                pending.answer.exception()  # retrieved: a handler already gone is no error
        self._pending.clear()

    async def _send(self, call_id: str, pending: _Pending) -> None:
        await self._link.send(
            {
                "type": "tool.call",
                "call_id": call_id,
                "tool": pending.tool,
                "arguments": pending.arguments,
            }
        )

    def handler(self, tool: str | None = None) -> Callable[[FunctionCallParams], Awaitable[None]]:
        """A Pipecat function handler that runs the function as voicegate's tool ``tool``.

        Register it with ``cancel_on_interruption=False`` (``register_tool`` does): a barge-in
        must not cancel a charge whose result the LLM still has to hear.
        """

        async def run(params: FunctionCallParams) -> None:
            name = tool or params.function_name
            call_id = call_id_for(params.tool_call_id)
            try:
                result = await self.call(name, call_id, dict(params.arguments))
            except CallEnded:
                return  # no result: nobody is left to tell, the session's record keeps it
            await params.result_callback(result)

        return run


def register_tool(llm: LLMService[Any], transport: VoicegateTransport, name: str) -> None:
    """Make the LLM's function ``name`` a voicegate tool call (a side effect: run once)."""
    llm.register_function(name, transport.tools.handler(name), cancel_on_interruption=False)
