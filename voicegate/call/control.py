"""What the agent may ask of its call (:class:`agents.base.CallControl`).

Audio the agent plays is a response the session records (responses.py); a hang-up is ours
(hangup.py); a tool request goes through the call's write path (voicegate/tools/call_tools.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.hangup import HangingUp, HangupPlan
from voicegate.call.responses import Responses
from voicegate.call.services import CallServices
from voicegate.call.turns import CallerTurns
from voicegate.tools.call_tools import CallTools


class AgentControl:
    def __init__(
        self,
        state: CallState,
        services: CallServices,
        responses: Responses,
        hangup: HangingUp,
        turns: CallerTurns,
        tools: CallTools,
    ) -> None:
        self._state = state
        self._services = services
        self._responses = responses
        self._hangup = hangup
        self._turns = turns
        self._tools = tools

    @property
    def rate(self) -> int:
        channel = self._state.channel
        return channel.rate if channel else 8000

    def play(self, samples: NDArray[np.int16]) -> None:
        state = self._state
        channel = state.channel
        if (
            channel is None
            or state.phase is not CallPhase.ANSWERED
            or self._hangup.plan is not None
            or state.media_released
        ):
            return
        if not self._responses.queue(channel, samples):
            return
        if self._tools.receipts_seen:
            # Seed 000's last crash window: response audio buffered for playout after a receipt.
            self._services.faults.reached("during_playout")

    def play_prompt(self, name: str) -> None:
        self.play(self._services.prompt(name, self.rate))

    def mark(self, mark_id: str) -> bool:
        """Place a mark after the audio queued so far; ``Agent.on_mark`` says when it was heard."""
        return self._responses.mark(mark_id)

    def stop_playback(self) -> None:
        self._responses.interrupt()

    def hangup(self, reason: str, *, after_playout: bool = True) -> None:
        self._hangup.end(HangupPlan("completed", reason), after_playout=after_playout)

    def request_tool(
        self, tool: str, arguments: Mapping[str, Any], *, key: str | None = None
    ) -> str:
        # Approval by key press: only a request made while handling the caller's DTMF counts.
        return self._tools.request(tool, arguments, key, approved=self._turns.in_dtmf)
