"""The demo agent: greets the caller and answers DTMF from a menu of prompts.

Menu (prompt ``menu``): 1 collects digits until ``#`` and reads them back; 2 takes a payment
through the configured ``charge`` tool (amount in cents, ``#``, then 1 to pay or ``*`` to cancel,
and the outcome read back); 0 (a person; 3 as before) transfers the caller to
``transfer.default_target`` if one is configured, else says it is not available; 9 says goodbye
and ends the call;
``*`` repeats the menu. A key press or the caller's speech cuts off whatever prompt is playing
(barge-in), and after the caller has spoken the menu is offered again. A cut that was a false
interruption (line noise, a cough: no caller turn followed) is picked up again from the start of
the sentence it cut (audio/sentences.py). When the transfer is attended
(``transfer.default_mode``), the person the consult leg reaches hears why in one sentence
(synthesised), after the brief.
The digits themselves are never logged: in a payment flow they would be card numbers.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence

from agents.base import Agent, ConsultEvent, PlaybackCut, Response, ToolResult
from audio.sentences import resume_point

log = logging.getLogger("voicegate.agent.demo")

_DIGIT_PROMPTS = {
    **{str(d): f"digit_{d}" for d in range(10)},
    "*": "digit_star",
    "#": "digit_hash",
    **{c: f"digit_{c}" for c in "ABCD"},
}
MAX_DIGITS = 32
MAX_AMOUNT_DIGITS = 7  # at most 9,999,999 cents
PAYMENT_TOOL = "charge"
PAYMENT_CURRENCY = "EUR"

_OUTCOME_PROMPTS = {
    "committed": "payment_committed",
    "failed": "payment_failed",
    "not_started": "payment_not_started",
    "pending": "payment_pending",
    "refused": "payment_unavailable",
}


class _Mode(enum.Enum):
    MENU = "menu"
    COLLECTING = "collecting"
    AMOUNT = "amount"
    CONFIRM = "confirm"
    CONFIRM_END = "confirm_end"  # the speaking demo heard "goodbye": asking before hanging up
    PAYING = "paying"
    TRANSFERRING = "transferring"
    ENDING = "ending"


# What the person an attended transfer consults is told, by the last payment's outcome: why the
# caller wants a person, in one sentence, with nothing personal in it.
_REASONS = {
    None: "The caller chose to talk to a person from the voice menu.",
    "committed": "The caller asked for a person after a payment that went through.",
    "failed": "The caller asked for a person after a payment the provider refused.",
    "not_started": "The caller asked for a person after a payment that did not start.",
    "pending": "The caller asked for a person while a payment is still being processed.",
    "refused": "The caller asked for a person after a payment that could not be made.",
}


class DemoAgent(Agent):
    mode = _Mode.MENU
    _response: Response | None = None
    _payment: str | None = None  # the last payment's outcome, for the reason of a transfer
    # What the current response queued: (prompt, first sample played of it) in order.
    _said: tuple[tuple[str, int], ...] = ()
    _barged: str | None = None  # the response the caller's speech or key last cut
    # The resume code's read-out, left open so that the payment's outcome follows it in the same
    # response (the caller hears the whole code, then the outcome, without a cut).
    _code_response: Response | None = None
    # Back after a drop with the payment still being reconciled: its outcome comes later.
    _late_outcome = False

    def _say(self, *prompts: str) -> None:
        """Say ``prompts`` as one response, after what is still playing (which it supersedes)."""
        self._play([(prompt, 0) for prompt in prompts])

    def _play(self, parts: list[tuple[str, int]]) -> None:
        response = self._response = self.call.respond()
        self._said = tuple(parts)
        for prompt, start in parts:
            if start == 0:
                response.play_prompt(prompt)
            else:
                response.play(self.call.prompt(prompt)[start:])
        response.done()

    async def on_false_interruption(self, heard_ms: int) -> None:
        # Nobody spoke to us: say again the sentence that was cut, from its start, and the rest.
        if self.mode in (_Mode.ENDING, _Mode.PAYING, _Mode.TRANSFERRING) or self._response is None:
            return
        if self._barged != self._response.id or self.call.queued_ms:
            return  # the cut was of an older response, or something newer already plays
        heard = heard_ms * self.call.rate // 1000
        for k, (prompt, start) in enumerate(self._said):
            audio = self.call.prompt(prompt)
            length = len(audio) - start
            if heard < length:
                resume = resume_point(audio, self.call.rate, start + heard)
                self._play([(prompt, resume), *self._said[k + 1 :]])
                return
            heard -= length

    async def on_start(self) -> None:
        self._digits: list[str] = []
        self._amount = ""
        self._say("greeting", "menu")

    async def on_rejoined(self, heard_last: str, results: Sequence[ToolResult]) -> None:
        # Back from a call centre: the outcome of the last payment as the store has it (seed
        # 004: reclaim, don't resend), then the menu; no greeting, the caller knows us.
        self._digits = []
        self._amount = ""
        payments = [r for r in results if r.tool == PAYMENT_TOOL]
        outcome = payments[-1].outcome if payments else None
        log.info(
            "demo.rejoined",
            extra={"call_id": self.context.call_id, "heard_last": heard_last, "outcome": outcome},
        )
        if outcome is not None:
            self._say(_OUTCOME_PROMPTS.get(outcome, "payment_unavailable"), "menu")
        else:
            self._late_outcome = True
            self._say("sorry_lost_you", "menu")

    async def on_resume_code(self, code: str) -> None:
        # "If we get cut off, call back and enter 4 7 1 9 ..." (docs/tenants.md, Coming back);
        # the code is never logged.
        response = self._response = self._code_response = self.call.respond()
        response.play_prompt("resume_code_intro")
        for digit in code:
            response.play_prompt(_DIGIT_PROMPTS[digit])
        response.play_prompt("payment_processing")

    async def on_dtmf(self, digit: str) -> None:
        if self.mode in (_Mode.ENDING, _Mode.PAYING, _Mode.TRANSFERRING):
            return
        # A key answers the prompt: whatever is still playing of it is cut.
        if self._response is not None:
            self._response.cancel()
        match self.mode:
            case _Mode.COLLECTING:
                self._collect(digit)
            case _Mode.AMOUNT:
                self._collect_amount(digit)
            case _Mode.CONFIRM:
                self._confirm(digit)
            case _:
                self._menu(digit)

    def _menu(self, digit: str) -> None:
        match digit:
            case "1":
                self.mode = _Mode.COLLECTING
                self._digits = []
                self._say("enter_digits")
            case "2":
                self.mode = _Mode.AMOUNT
                self._amount = ""
                self._say("enter_amount")
            case "0" | "3":
                # A person: the session's transfer (its REFER carries the session's reference).
                if self.call.transfer() is None:
                    self.mode = _Mode.TRANSFERRING
                    self._response = None
                else:
                    self._say("not_available")
            case "9":
                self.mode = _Mode.ENDING
                self._say("goodbye")
                self.call.hangup("caller chose to end the call", after_playout=True)
            case _:
                self._say("menu")

    @staticmethod
    def _digit_prompts(digits: str) -> list[str]:
        return [_DIGIT_PROMPTS[pressed] for pressed in digits]

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
            self._say("no_digits")
            return
        self._say("you_entered", *self._digit_prompts("".join(self._digits)))
        self._digits = []

    def _collect_amount(self, digit: str) -> None:
        if digit == "*":
            self._cancel_payment()
        elif digit == "#":
            amount = self._amount.lstrip("0")
            if not amount:
                self.mode = _Mode.MENU
                self._say("no_digits")
                return
            self._amount = amount
            self.mode = _Mode.CONFIRM
            self._say("you_entered", *self._digit_prompts(amount), "confirm_payment")
        elif digit.isdigit() and len(self._amount) < MAX_AMOUNT_DIGITS:
            self._amount += digit

    def _confirm(self, digit: str) -> None:
        if digit == "1":
            # Called from the caller's key press: that is the approval a dtmf-approved tool needs.
            self.mode = _Mode.PAYING
            self._say("payment_processing")
            self.call.request_tool(
                PAYMENT_TOOL,
                {
                    "amount_cents": int(self._amount),
                    "currency": PAYMENT_CURRENCY,
                    "account": f"demo-{self.context.call_id[:8]}",
                },
            )
        elif digit == "*":
            self._cancel_payment()
        else:
            self._say("confirm_payment")

    def _cancel_payment(self) -> None:
        self.mode = _Mode.MENU
        self._amount = ""
        self._say("payment_canceled")

    async def on_resumed(self, interruptions: str) -> None:
        # Recovered from a gap: say so briefly, then carry on where the caller was; never replay
        # the cut prompt from its start.
        if self.mode is _Mode.PAYING:
            return  # the payment's own outcome is what the caller hears next
        if self.mode is _Mode.TRANSFERRING:
            # Nobody was reached: the session said so ("I could not reach a colleague").
            self.mode = _Mode.MENU
            self._say("menu")
            return
        self._say("sorry_lost_you", *(["menu"] if self.mode is _Mode.MENU else []))

    async def on_consultation(self, event: ConsultEvent) -> None:
        # An attended transfer reached a person: tell them why, after the brief (the hand-over
        # waits for it with consult_complete = after_brief).
        if event.kind == "answered" and self.mode is _Mode.TRANSFERRING:
            refused = self.call.consult_say(_REASONS.get(self._payment, _REASONS[None]))
            if refused is not None:
                log.info("demo.reason_not_said", extra={"call_id": self.context.call_id})

    async def on_playback_cut(self, cut: PlaybackCut) -> None:
        if cut.reason == "barge_in":
            self._barged = cut.response_id

    async def on_speech_turn(self, duration_ms: int) -> None:
        # The demo understands keys, not words: after the caller has spoken (and perhaps cut a
        # prompt short by barge-in), it offers the menu again.
        # Only when nothing is queued: a turn that cut nothing (spoken before the agent talked)
        # must not stack another menu behind the one playing (PlayoutFull after a few).
        if self.mode is _Mode.MENU and duration_ms >= 300 and not self.call.queued_ms:
            self._say("menu")

    async def on_tool_result(self, result: ToolResult) -> None:
        if result.tool != PAYMENT_TOOL:
            return
        if self.mode is not _Mode.PAYING and not self._late_outcome:
            return
        self._late_outcome = False
        self.mode = _Mode.MENU
        self._payment = result.outcome
        log.info(
            "demo.payment",
            extra={
                "call_id": self.context.call_id,
                "outcome": result.outcome,
                "duplicate": result.duplicate,
            },
        )
        outcome = _OUTCOME_PROMPTS.get(result.outcome, "payment_unavailable")
        reading, self._code_response = self._code_response, None
        if reading is not None and reading is self._response and reading.play_prompt(outcome):
            # After the code, in the same response (nothing cut it meanwhile).
            reading.play_prompt("menu")
            reading.done()
            return
        self._say(outcome, "menu")
