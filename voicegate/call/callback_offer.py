"""What a caller back after a drop is asked, key by key (no I/O: voicegate/call/callbacks.py
plays the prompts and feeds the keys and the timeouts).

"Welcome back. Press 1 to continue where we left off": 1 continues; any other key, or no key in
time, starts a new session. If the dropped session had started a write, 1 is not enough: the
caller enters the resume code the agent read out (``CODE_DIGITS`` keys, or fewer ended by ``#``),
with ``MAX_CODE_ATTEMPTS`` tries, each counted; after the last wrong one, a new session (and the
dropped session ends, so the code cannot be tried again on another call).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from voicegate.call.callback_keys import CODE_DIGITS, MAX_CODE_ATTEMPTS


class Stage(enum.Enum):
    OFFERING = "offering"
    CODE = "code"
    DONE = "done"


class Outcome(enum.StrEnum):
    """How the offer ended (also its metric label and the dropped session's ending cause)."""

    ACCEPTED = "accepted"
    DECLINED = "declined"
    NO_ANSWER = "no_answer"
    CODE_REFUSED = "code_refused"


@dataclass(frozen=True, slots=True)
class Step:
    """What to do after a key or a timeout: prompts to play now, a code attempt's result
    (``ok``/``wrong``, for its metric), and the outcome once the offer is over."""

    prompts: tuple[str, ...] = ()
    attempt: str = ""
    outcome: Outcome | None = None


class CallbackOffer:
    def __init__(self, needs_code: bool, check: Callable[[str], bool]) -> None:
        self._needs_code = needs_code
        self._check = check
        self.stage = Stage.OFFERING
        self.attempts = 0
        self._entered: list[str] = []

    def key(self, digit: str) -> Step:
        """A key the caller pressed (RFC 2833 or SIP INFO)."""
        if self.stage is Stage.OFFERING:
            if digit != "1":
                return self._done(Outcome.DECLINED)
            if not self._needs_code:
                return self._done(Outcome.ACCEPTED)
            self.stage = Stage.CODE
            return Step(prompts=("enter_resume_code",))
        if self.stage is Stage.CODE:
            if digit.isdigit():
                self._entered.append(digit)
            if len(self._entered) < CODE_DIGITS and digit != "#":
                return Step()
            return self._attempt()
        return Step()

    def timed_out(self) -> Step:
        """No key (or not the whole code) in time: a new session."""
        if self.stage is Stage.DONE:
            return Step()
        return self._done(Outcome.NO_ANSWER)

    def _attempt(self) -> Step:
        entered, self._entered = "".join(self._entered), []
        self.attempts += 1
        if len(entered) == CODE_DIGITS and self._check(entered):
            return self._done(Outcome.ACCEPTED, attempt="ok")
        if self.attempts >= MAX_CODE_ATTEMPTS:
            return self._done(Outcome.CODE_REFUSED, attempt="wrong")
        return Step(prompts=("resume_code_wrong", "enter_resume_code"), attempt="wrong")

    def _done(self, outcome: Outcome, attempt: str = "") -> Step:
        self.stage = Stage.DONE
        prompts = () if outcome is Outcome.ACCEPTED else ("new_session",)
        return Step(prompts=prompts, attempt=attempt, outcome=outcome)

    def __repr__(self) -> str:  # never the keys entered
        return f"CallbackOffer({self.stage.value}, attempts={self.attempts})"
