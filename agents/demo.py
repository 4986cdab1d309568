"""The demo agent: greets the caller and answers DTMF from a menu of prompts.

Menu (prompt ``menu``): 1 collects digits until ``#`` and reads them back; 2 (payments) and 3 (a
person) are placeholders that later work fills; 9 says goodbye and ends the call; ``*`` repeats the
menu. A key press cuts off whatever prompt is playing, as callers expect of IVRs. The digits
themselves are never logged: in a payment flow they would be card numbers.
"""

from __future__ import annotations

import enum
import logging

from agents.base import Agent

log = logging.getLogger("voicegate.agent.demo")

_DIGIT_PROMPTS = {
    **{str(d): f"digit_{d}" for d in range(10)},
    "*": "digit_star",
    "#": "digit_hash",
    **{c: f"digit_{c}" for c in "ABCD"},
}
MAX_DIGITS = 32


class _Mode(enum.Enum):
    MENU = "menu"
    COLLECTING = "collecting"
    ENDING = "ending"


class DemoAgent(Agent):
    mode = _Mode.MENU

    async def on_start(self) -> None:
        self._digits: list[str] = []
        self.call.play_prompt("greeting")
        self.call.play_prompt("menu")

    async def on_dtmf(self, digit: str) -> None:
        if self.mode is _Mode.ENDING:
            return
        self.call.stop_playback()
        if self.mode is _Mode.COLLECTING:
            self._collect(digit)
            return
        match digit:
            case "1":
                self.mode = _Mode.COLLECTING
                self._digits = []
                self.call.play_prompt("enter_digits")
            case "2" | "3":
                self.call.play_prompt("not_available")
            case "9":
                self.mode = _Mode.ENDING
                self.call.play_prompt("goodbye")
                self.call.hangup("caller chose to end the call", after_playout=True)
            case _:
                self.call.play_prompt("menu")

    def _collect(self, digit: str) -> None:
        if digit != "#":
            if len(self._digits) < MAX_DIGITS:
                self._digits.append(digit)
            return
        self.mode = _Mode.MENU
        log.info(
            "demo.readback", extra={"call_id": self.context.call_id, "count": len(self._digits)}
        )
        if not self._digits:
            self.call.play_prompt("no_digits")
            return
        self.call.play_prompt("you_entered")
        for pressed in self._digits:
            self.call.play_prompt(_DIGIT_PROMPTS[pressed])
        self._digits = []
