"""A complete in-process agent: greets the caller, says each key pressed, and 9 ends the call.

Run it (from the repository root, so that ``examples`` is importable):

    VOICEGATE_AGENT_KIND=python \
    VOICEGATE_AGENT_FACTORY=examples.python_agent.keypad_agent:KeypadAgent \
    PYTHONPATH=. scripts/serve

then call it (README, "Calling it"). It uses only the public agent API in ``agents/base.py``.
"""

from __future__ import annotations

import logging

from agents.base import Agent, MarkOutcome, Response

log = logging.getLogger("example.keypad")

DIGITS = {**{str(d): f"digit_{d}" for d in range(10)}, "*": "digit_star", "#": "digit_hash"}


class KeypadAgent(Agent):
    """One instance per call; the call's own task calls it, one event at a time."""

    reply: Response | None = None

    def say(self, *prompts: str) -> Response:
        # Each reply is a response handle: once the caller cuts it (barge-in) or we open the
        # next one, whatever we still write to it is dropped, never played.
        reply = self.reply = self.call.respond()
        for prompt in prompts:
            reply.play_prompt(prompt)
        return reply

    async def on_start(self) -> None:
        reply = self.say("greeting", "enter_digits")
        reply.mark("greeted")
        reply.done()

    async def on_dtmf(self, digit: str) -> None:
        if self.reply is not None:
            self.reply.cancel()  # the caller answered: stop talking
        if digit == "9":
            self.say("goodbye").done()
            self.call.hangup("caller pressed 9")  # BYE once the goodbye has been heard
            return
        if digit in DIGITS:
            self.say("you_entered", DIGITS[digit]).done()

    async def on_mark(self, mark: MarkOutcome) -> None:
        # "played": the caller heard up to the mark; "cleared": the reply was cut first.
        log.info("example.mark", extra={"mark": mark.mark_id, "outcome": mark.outcome})

    async def on_end(self, reason: str) -> None:
        log.info("example.end", extra={"reason": reason})
