"""The speaking demo's decisions, given what the recogniser heard: a recording call stands in
for voicegate's side of agents.base.CallControl (the recogniser and the call are tested for
real in test_speech.py and tests/integration/test_speech.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agents.base import CallContext
from agents.demo import _Mode
from agents.speaking_demo import SpeakingDemoAgent
from audio.speech.recognizer import Heard


class Reply:
    def __init__(self, played: list[str]) -> None:
        self.played = played
        self.alive = True

    def play(self, samples: NDArray[np.int16]) -> bool:
        self.played.append(f"<{len(samples)} samples>")
        return True

    def play_prompt(self, name: str) -> bool:
        self.played.append(name)
        return True

    def done(self) -> None: ...

    def cancel(self) -> None:
        self.alive = False


class Call:
    rate = 16000

    def __init__(self) -> None:
        self.played: list[str] = []
        self.said: list[tuple[str, str, str]] = []
        self.tools: list[tuple[str, Mapping[str, Any]]] = []
        self.hangups: list[str] = []
        self.queued_ms = 0

    def respond(self) -> Reply:
        return Reply(self.played)

    def caller_said(
        self, text: str, grammar: str, confidence: float, decision: str, *,
        reason: str = "", sensitive: bool = False,
    ) -> None:  # fmt: skip
        self.said.append((text, grammar, decision))

    def request_tool(
        self, tool: str, arguments: Mapping[str, Any], *, key: str | None = None
    ) -> str:
        self.tools.append((tool, arguments))
        return "k1"

    def hangup(self, reason: str, *, after_playout: bool = True) -> None:
        self.hangups.append(reason)

    def transfer(self, target: str | None = None, *, mode: str | None = None) -> str | None:
        return "no target"

    def call_soon(self, work: Callable[[], None]) -> None:
        work()


def _agent(codec: str = "G722") -> tuple[SpeakingDemoAgent, Call]:
    call = Call()
    agent = SpeakingDemoAgent(CallContext("c1", "service", "***123", codec, 16000), call)  # type: ignore[arg-type]
    agent._digits, agent._amount = [], ""
    return agent, call


def _heard(text: str, grammar: str, accepted: bool = True, reason: str = "") -> Heard:
    return Heard(text, grammar, 0.7 if accepted else 0.3, accepted, reason)


def test_a_spoken_payment_is_confirmed_then_charged_once() -> None:
    agent, call = _agent()
    agent._on_heard(_heard("make a payment", "menu"))
    assert agent.mode is _Mode.AMOUNT and call.played[-1] == "say_amount"
    agent._on_heard(_heard("fifty nine cents", "amount"))
    assert agent.mode is _Mode.CONFIRM and not call.tools
    agent._on_heard(_heard("yes", "confirm"))
    assert call.said[-1] == ("yes", "confirm", "confirmed")
    assert [(t, a["amount_cents"]) for t, a in call.tools] == [("charge", 59)]
    agent._on_heard(_heard("yes", "confirm"))  # paying: not listening
    assert len(call.tools) == 1 and call.said[-1][2] == "rejected"


def test_a_rejection_reprompts_never_acts_and_never_talks_over_a_prompt() -> None:
    agent, call = _agent()
    agent._on_heard(_heard("make", "menu", accepted=False, reason="not_in_grammar"))
    assert agent.mode is _Mode.MENU
    assert call.played == ["not_understood", "menu", "speech_hint"]
    call.queued_ms = 2000
    agent._on_heard(_heard("", "menu", accepted=False, reason="no_hypothesis"))
    assert call.played == ["not_understood", "menu", "speech_hint"]
    assert [d for _, _, d in call.said] == ["rejected", "rejected"]


@pytest.mark.parametrize(("codec", "decision", "prompt"), [
    ("PCMA", "keypad_offered", "keypad_amount"), ("G722", "rejected", "say_amount"),
])  # fmt: skip
def test_a_rejected_amount_offers_the_keypad_on_a_g711_call(
    codec: str, decision: str, prompt: str
) -> None:
    agent, call = _agent(codec)
    agent.mode = _Mode.AMOUNT
    agent._on_heard(_heard("eighty nine euro and", "amount", accepted=False))
    assert call.said[-1][2] == decision and call.played[-1] == prompt
    assert agent.mode is _Mode.AMOUNT and not call.tools


async def test_the_agent_answers_when_the_callers_turn_has_ended() -> None:
    agent, call = _agent()
    await agent.on_speech_started()
    agent._on_heard(_heard("make", "menu", accepted=False))
    agent._on_heard(_heard("make a payment", "menu"))
    assert call.said == [] and agent.mode is _Mode.MENU
    await agent.on_speech_turn(1500)
    assert call.said == [("make", "menu", "rejected"), ("make a payment", "menu", "accepted")]
    assert agent.mode is _Mode.AMOUNT


def test_an_utterance_from_the_previous_step_is_not_acted_on() -> None:
    agent, call = _agent()
    agent.mode = _Mode.CONFIRM
    agent._amount = "59"
    agent._on_heard(_heard("make a payment", "menu"))
    assert call.said[-1][2] == "rejected" and not call.tools


def test_goodbye_by_voice_ends_the_call() -> None:
    agent, call = _agent()
    agent._on_heard(_heard("goodbye", "menu"))
    assert call.hangups and agent.mode is _Mode.ENDING


async def test_the_confirmation_is_synthesised_off_the_loop_and_then_played() -> None:
    agent, call = _agent()
    agent._loop = asyncio.get_running_loop()
    agent.mode = _Mode.AMOUNT
    agent._on_heard(_heard("fifty nine cents", "amount"))
    assert call.played == []  # the response is open; its audio is being made on another thread
    for _ in range(200):
        if call.played:
            break
        await asyncio.sleep(0.01)
    assert call.played[0].startswith("<") and call.played[1:] == ["say_yes_or_no"]
