"""An agent's own failure, told apart from ours: every call into agent code goes through here.

An in-process agent is the user's code. When one of its handlers raises, the call cannot go on
with it, but the failure is the agent's, not voicegate's: the session ends ``failed`` at stage
``agent`` (``needs_human`` with a tool outcome unknown), the caller is told, and the process and
its other calls are untouched. :class:`GuardedAgent` wraps the agent the factory made and turns any
exception of a handler into :class:`AgentCrashed`, which the call's task catches.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agents.base import (
    Agent,
    CallContext,
    CallControl,
    ConsultEvent,
    GateChange,
    MarkOutcome,
    PlaybackCut,
    ToolResult,
    TransferUpdate,
)
from audio.frame import Frame


class AgentCrashed(Exception):
    """``method`` of the agent raised ``error``."""

    def __init__(self, method: str, error: BaseException) -> None:
        super().__init__(f"{method} raised {type(error).__name__}")
        self.method = method
        self.error = error


def make_agent(
    factory: Callable[[CallContext, CallControl], Agent], context: CallContext, call: CallControl
) -> GuardedAgent:
    try:
        agent = factory(context, call)
    except Exception as exc:
        raise AgentCrashed("factory", exc) from exc
    if not isinstance(agent, Agent):
        error = TypeError(f"the agent factory returned {type(agent).__name__}, not an Agent")
        raise AgentCrashed("factory", error)
    return GuardedAgent(agent)


class GuardedAgent(Agent):
    """``inner`` with each handler's exception raised as :class:`AgentCrashed`."""

    def __init__(self, inner: Agent) -> None:
        super().__init__(inner.context, inner.call)
        self.inner = inner
        self.crashed = False

    async def _call(self, name: str, method: Callable[..., Awaitable[None]], *args: Any) -> None:
        if self.crashed and name != "on_end":
            return  # a failed agent is told nothing more but that the call is over
        try:
            await method(*args)
        except Exception as exc:
            self.crashed = True
            raise AgentCrashed(name, exc) from exc

    async def on_start(self) -> None:
        await self._call("on_start", self.inner.on_start)

    async def on_rejoined(self, heard_last: str, results: Sequence[ToolResult]) -> None:
        await self._call("on_rejoined", self.inner.on_rejoined, heard_last, results)

    async def on_dtmf(self, digit: str) -> None:
        await self._call("on_dtmf", self.inner.on_dtmf, digit)

    async def on_resume_code(self, code: str) -> None:
        await self._call("on_resume_code", self.inner.on_resume_code, code)

    async def on_audio(self, frame: Frame) -> None:
        await self._call("on_audio", self.inner.on_audio, frame)

    async def on_interrupted(self, interruption: str) -> None:
        await self._call("on_interrupted", self.inner.on_interrupted, interruption)

    async def on_resumed(self, interruptions: str) -> None:
        await self._call("on_resumed", self.inner.on_resumed, interruptions)

    async def on_response_interrupted(self, heard_ms: int) -> None:
        await self._call("on_response_interrupted", self.inner.on_response_interrupted, heard_ms)

    async def on_false_interruption(self, heard_ms: int) -> None:
        await self._call("on_false_interruption", self.inner.on_false_interruption, heard_ms)

    async def on_stop(self) -> None:
        await self._call("on_stop", self.inner.on_stop)

    async def on_speech_started(self) -> None:
        await self._call("on_speech_started", self.inner.on_speech_started)

    async def on_speech_turn(self, duration_ms: int) -> None:
        await self._call("on_speech_turn", self.inner.on_speech_turn, duration_ms)

    async def on_mark(self, mark: MarkOutcome) -> None:
        await self._call("on_mark", self.inner.on_mark, mark)

    async def on_playback_cut(self, cut: PlaybackCut) -> None:
        await self._call("on_playback_cut", self.inner.on_playback_cut, cut)

    async def on_gate(self, change: GateChange) -> None:
        await self._call("on_gate", self.inner.on_gate, change)

    async def on_transfer(self, update: TransferUpdate) -> None:
        await self._call("on_transfer", self.inner.on_transfer, update)

    async def on_consultation(self, event: ConsultEvent) -> None:
        await self._call("on_consultation", self.inner.on_consultation, event)

    async def on_tool_result(self, result: ToolResult) -> None:
        await self._call("on_tool_result", self.inner.on_tool_result, result)

    async def on_end(self, reason: str) -> None:
        await self._call("on_end", self.inner.on_end, reason)
