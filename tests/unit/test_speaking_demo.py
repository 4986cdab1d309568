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


def _heard(
    text: str,
    grammar: str,
    accepted: bool = True,
    reason: str = "",
    *,
    at: tuple[int, int] = (0, 0),
) -> Heard:
    """What the recogniser heard, said over ``at`` (start, end ms of the recogniser's audio)."""
    start, end = at
    return Heard(text, grammar, 0.7 if accepted else 0.3, accepted, reason, end - start, end)


async def _say(
    agent: SpeakingDemoAgent, text: str, grammar: str, accepted: bool = True, reason: str = ""
) -> None:
    """The caller says it: 800 ms of audio the session hears as a caller turn, whose utterance
    the recogniser hands over after the turn ended (its endpointer is the slower)."""
    start = agent._fed_ms
    await agent.on_speech_started()
    agent._fed_ms += 800
    await agent.on_speech_turn(800)
    agent._on_heard(_heard(text, grammar, accepted, reason, at=(start, agent._fed_ms)))


async def test_a_spoken_payment_is_confirmed_then_charged_once() -> None:
    agent, call = _agent()
    await _say(agent, "make a payment", "menu")
    assert agent.mode is _Mode.AMOUNT and call.played[-1] == "say_amount"
    await _say(agent, "fifty nine cents", "amount")
    assert agent.mode is _Mode.CONFIRM and not call.tools
    await _say(agent, "yes", "confirm")
    assert call.said[-1] == ("yes", "confirm", "confirmed")
    assert [(t, a["amount_cents"]) for t, a in call.tools] == [("charge", 59)]
    await _say(agent, "yes", "confirm")  # paying: not listening
    assert len(call.tools) == 1 and call.said[-1][2] == "rejected"


async def test_a_rejection_reprompts_never_acts_and_never_talks_over_a_prompt() -> None:
    agent, call = _agent()
    await _say(agent, "make", "menu", accepted=False, reason="not_in_grammar")
    assert agent.mode is _Mode.MENU
    assert call.played == ["not_understood", "menu", "speech_hint"]
    call.queued_ms = 2000
    await _say(agent, "", "menu", accepted=False, reason="no_hypothesis")
    assert call.played == ["not_understood", "menu", "speech_hint"]
    assert [d for _, _, d in call.said] == ["rejected", "rejected"]


@pytest.mark.parametrize(("codec", "decision", "prompt"), [
    ("PCMA", "keypad_offered", "keypad_amount"), ("G722", "rejected", "say_amount"),
])  # fmt: skip
async def test_a_rejected_amount_offers_the_keypad_on_a_g711_call(
    codec: str, decision: str, prompt: str
) -> None:
    agent, call = _agent(codec)
    agent.mode = _Mode.AMOUNT
    await _say(agent, "eighty nine euro and", "amount", accepted=False)
    assert call.said[-1][2] == decision and call.played[-1] == prompt
    assert agent.mode is _Mode.AMOUNT and not call.tools


async def test_the_agent_answers_when_the_callers_turn_has_ended() -> None:
    agent, call = _agent()
    await agent.on_speech_started()
    agent._fed_ms = 1500
    agent._on_heard(_heard("make", "menu", accepted=False, at=(0, 600)))
    agent._on_heard(_heard("make a payment", "menu", at=(600, 1500)))
    assert call.said == [] and agent.mode is _Mode.MENU
    await agent.on_speech_turn(1500)
    assert call.said == [("make", "menu", "rejected"), ("make a payment", "menu", "accepted")]
    assert agent.mode is _Mode.AMOUNT


async def test_an_utterance_from_the_previous_step_is_not_acted_on() -> None:
    agent, call = _agent()
    agent.mode = _Mode.CONFIRM
    agent._amount = "59"
    await _say(agent, "make a payment", "menu")
    assert call.said[-1][2] == "rejected" and not call.tools


async def test_goodbye_by_voice_is_confirmed_before_the_call_ends() -> None:
    agent, call = _agent()
    await _say(agent, "goodbye", "menu")
    assert not call.hangups and agent.mode is _Mode.CONFIRM_END
    assert call.played[-1] == "confirm_goodbye"
    await _say(agent, "yes", "confirm")
    assert call.said[-1] == ("yes", "confirm", "confirmed")
    assert call.hangups and agent.mode is _Mode.ENDING and call.played[-1] == "goodbye"


async def test_a_misheard_goodbye_answered_no_goes_back_to_the_menu() -> None:
    # "Sorry, can I talk to someone?" was heard as "hang up" (score 0.61) inside a real turn.
    agent, call = _agent()
    await _say(agent, "hang up", "menu")
    await _say(agent, "talk to a person", "menu")  # the question's grammar is yes or no
    assert call.said[-1] == ("talk to a person", "menu", "rejected")
    await _say(agent, "weather", "confirm", accepted=False, reason="not in the grammar")
    assert call.played[-2:] == ["not_understood", "confirm_goodbye"]
    await _say(agent, "no", "confirm")
    assert agent.mode is _Mode.MENU and call.played[-1] == "menu" and not call.hangups
    await _say(agent, "talk to a person", "menu")
    assert call.said[-1] == ("talk to a person", "menu", "accepted")


@pytest.mark.parametrize(("key", "ends"), [("9", True), ("*", False), ("2", False)])
async def test_asked_whether_to_end_a_key_answers_as_at_the_menu(key: str, ends: bool) -> None:
    agent, call = _agent()
    await _say(agent, "goodbye", "menu")
    await agent.on_dtmf(key)
    assert bool(call.hangups) is ends
    assert agent.mode is {"9": _Mode.ENDING, "*": _Mode.MENU, "2": _Mode.AMOUNT}[key]


def test_what_the_recogniser_hears_in_line_noise_alone_is_never_acted_on() -> None:
    # Brown noise 10 dB under speech: pocketsphinx's endpointer heard "hang up" (0.903) where
    # the session's detector heard no turn, and the call ended (bench/bargein.py, seed 21).
    agent, call = _agent()
    agent._fed_ms = 6000
    agent._on_heard(_heard("hang up", "menu", at=(3200, 3900)))
    assert call.said == [("hang up", "menu", "rejected")]
    assert not call.hangups and agent.mode is _Mode.MENU and call.played == []


async def test_an_utterance_counts_only_near_a_turn_the_session_heard() -> None:
    agent, call = _agent()
    agent._fed_ms = 10_000
    await agent.on_speech_started()  # the turn: 10.0 s to 10.8 s of the recogniser's audio
    # Noise the recogniser finished with 2 s before the turn, delivered while it is spoken.
    agent._on_heard(_heard("goodbye", "menu", at=(7000, 8000)))
    agent._fed_ms = 10_800
    await agent.on_speech_turn(800)
    assert call.said == [("goodbye", "menu", "rejected")] and not call.hangups
    # The turn's own utterance, dated late by the recogniser and delivered after the turn.
    agent._fed_ms = 11_400
    agent._on_heard(_heard("make a payment", "menu", at=(10_000, 11_000)))
    assert agent.mode is _Mode.AMOUNT
    # Heard three seconds after the last turn, with none since: noise again.
    agent._fed_ms = 15_000
    agent._on_heard(_heard("fifty nine cents", "amount", at=(14_000, 14_800)))
    assert agent.mode is _Mode.AMOUNT and call.said[-1][2] == "rejected"


async def test_the_confirmation_is_synthesised_off_the_loop_and_then_played() -> None:
    agent, call = _agent()
    agent._loop = asyncio.get_running_loop()
    agent.mode = _Mode.AMOUNT
    await _say(agent, "fifty nine cents", "amount")
    assert call.played == []  # the response is open; its audio is being made on another thread
    for _ in range(200):
        if call.played:
            break
        await asyncio.sleep(0.01)
    assert call.played[0].startswith("<") and call.played[1:] == ["say_yes_or_no"]
