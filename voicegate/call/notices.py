"""What the call tells its agent outside a caller's turn: the session's notices (interrupted,
resumed, a response cut, stop), tool results, marks heard, and the call's end.

Every one is awaited from the call's own task, never from inside a session step: an effect only
posts an :class:`AgentNotice` to the call's queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from agents.base import (
    ConsultEvent,
    GateChange,
    MarkOutcome,
    PlaybackCut,
    ToolResult,
    TransferUpdate,
)
from voicegate.call.call_state import CallPhase, CallState
from voicegate.tools.call_tools import CallTools, ToolDone

log = logging.getLogger("voicegate.call")


Told = PlaybackCut | GateChange | TransferUpdate | ConsultEvent


@dataclass(frozen=True, slots=True)
class AgentNotice:
    """A NotifyAgent effect, delivered to the agent from the call's task."""

    what: str
    detail: str
    # A cut, a gate move, a transfer's progress or its consultation: told while the call is up
    # or ending (so a timeout's cut and the gate closing reach the agent before on_end).
    payload: Told | None = None


class AgentNotices:
    def __init__(self, state: CallState, tools: CallTools, post: Callable[[object], None]) -> None:
        self._state = state
        self._tools = tools
        self._post = post
        self._results: dict[str, ToolResult] = {}

    def post(self, what: str, detail: str) -> None:
        """Queue a notice for the call's task to deliver."""
        self._post(AgentNotice(what, detail))

    def tell(self, payload: Told) -> None:
        """Queue a cut, a gate move, a transfer update or a consultation event for the call's
        task to deliver."""
        self._post(AgentNotice(type(payload).__name__, "", payload))

    async def resume_code(self, code: str) -> None:
        """The session's resume code, for the agent to read out while the caller is there."""
        agent = self._state.agent
        if agent is not None and self._state.phase is CallPhase.ANSWERED:
            await agent.on_resume_code(code)

    async def deliver(self, notice: AgentNotice) -> None:
        """A NotifyAgent or StopGeneration effect, delivered from the call's task."""
        agent = self._state.agent
        if notice.what == "tool_receipt":
            # The receipt's result (with the provider's detail) was kept when it was recorded.
            result = self._results.pop(notice.detail.split(" ", 1)[0], None)
            if result is not None:
                await self.tool_result(result)
            return
        if agent is None:
            return
        if notice.payload is not None:
            if self._state.phase in (CallPhase.ANSWERED, CallPhase.ENDING):
                await self._tell(notice.payload)
            return
        if self._state.phase is not CallPhase.ANSWERED:
            return
        match notice.what:
            case "interrupted":
                await agent.on_interrupted(notice.detail)
            case "resumed":
                await agent.on_resumed(notice.detail)
            case "response_interrupted":
                heard = notice.detail.rpartition("heard_ms=")[2]
                await agent.on_response_interrupted(int(heard) if heard.isdigit() else 0)
            case "stop":
                await agent.on_stop()
            case "transfer_failed":
                # Nobody was reached and the caller is back: the agent was told both already,
                # as on_transfer(update) with the outcome and on_resumed("transfer").
                pass
            case _:
                log.warning(
                    "agent.unknown_notice",
                    extra={"call_id": self._state.call_id, "what": notice.what},
                )

    async def _tell(self, payload: Told) -> None:
        agent = self._state.agent
        assert agent is not None
        match payload:
            case PlaybackCut():
                await agent.on_playback_cut(payload)
            case GateChange():
                await agent.on_gate(payload)
            case TransferUpdate():
                await agent.on_transfer(payload)
            case ConsultEvent():
                await agent.on_consultation(payload)

    async def tool_done(self, done: ToolDone) -> None:
        intent = self._state.outstanding(done.key)
        session = self._state.session
        if intent is None or session is None or session.state.terminal:
            return
        # Recording it feeds the receipt to the session, whose NotifyAgent effect hands this
        # result to the agent (unless the receipt ended the session).
        self._results[done.key] = self._tools.record(done, intent.tool)

    async def tool_result(self, result: ToolResult) -> None:
        agent = self._state.agent
        if agent is not None and self._state.phase is CallPhase.ANSWERED:
            await agent.on_tool_result(result)

    async def mark(self, outcome: MarkOutcome) -> None:
        """A mark's one outcome, played or cleared; delivered while the agent is still there
        (the call's end delivers the marks it cleared before ``on_end``)."""
        agent = self._state.agent
        if agent is not None and self._state.phase is not CallPhase.RINGING:
            await agent.on_mark(outcome)

    async def call_ended(self) -> None:
        agent = self._state.agent
        if agent is None:
            return
        try:
            await agent.on_end(self._ending_reason())
        except Exception:
            log.exception("agent.on_end failed", extra={"call_id": self._state.call_id})

    def _ending_reason(self) -> str:
        state = self._state.session_state
        ended = state.ended if state else None
        if state is not None and state.away_until is not None:
            return "transferred"  # away, not ended: the caller may come back (session/away.py)
        if state is not None and state.dropped_until is not None:
            return state.dropped_reason  # dropped, not ended: may call back (session/callback.py)
        return ended.reason if ended else "call ended"
