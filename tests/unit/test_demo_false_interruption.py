"""After a false interruption the demo agent says the cut sentence again from its start
(agents/demo.py, audio/sentences.py), on the real prompts it ships."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agents.base import CallContext, PlaybackCut
from agents.demo import DemoAgent
from audio.prompts import PromptLibrary, default_prompts_dir
from audio.sentences import resume_point, sentence_starts

RATE = 8000
PROMPTS = PromptLibrary(default_prompts_dir())


def test_the_menu_has_its_five_sentences_and_a_comma_is_not_one() -> None:
    menu = PROMPTS.get("menu", RATE)
    starts = sentence_starts(menu, RATE)
    assert len(starts) == 5, [s / RATE for s in starts]
    assert starts == sorted(starts) and starts[0] == 0
    # Each start is sound after a pause: the 30 ms from it are not silent.
    for start in starts[1:]:
        chunk = menu[start : start + 240].astype(np.float64)
        assert np.sqrt(np.mean(chunk**2)) > 100


def test_a_point_inside_a_sentence_resumes_at_its_start() -> None:
    menu = PROMPTS.get("menu", RATE)
    starts = sentence_starts(menu, RATE)
    assert resume_point(menu, RATE, starts[2] + RATE // 2) == starts[2]
    assert resume_point(menu, RATE, starts[2]) == starts[2]
    assert resume_point(menu, RATE, 10) == 0
    assert sentence_starts(np.zeros(0, dtype=np.int16), RATE) == [0]


class _Response:
    def __init__(self, call: _Call, response_id: str) -> None:
        self.call = call
        self.id = response_id
        self.audio: list[NDArray[np.int16]] = []
        self.ended: str | None = None

    @property
    def alive(self) -> bool:
        return self.ended is None

    def play(self, samples: NDArray[np.int16]) -> bool:
        self.audio.append(samples)
        return True

    def play_prompt(self, name: str) -> bool:
        return self.play(self.call.prompt(name))

    def done(self) -> None: ...

    def cancel(self) -> None:
        self.ended = "canceled"


class _Call:
    """What the demo agent asks of its call, recorded (the agent's interface, not a peer)."""

    rate = RATE
    queued_ms = 0

    def __init__(self) -> None:
        self.responses: list[_Response] = []

    def respond(self) -> _Response:
        self.responses.append(_Response(self, f"r{len(self.responses) + 1}"))
        return self.responses[-1]

    def prompt(self, name: str) -> NDArray[np.int16]:
        return PROMPTS.get(name, RATE)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the demo agent asked for {name} on a false interruption")


def _barge_in(agent: DemoAgent, response: _Response, heard_ms: int) -> None:
    # As the session does it: the response handle was already done (all queued), then cut.
    response.ended = "done"
    asyncio.run(agent.on_playback_cut(PlaybackCut(response.id, 0, heard_ms, (), "barge_in")))


def _agent() -> tuple[DemoAgent, _Call]:
    call = _Call()
    agent = DemoAgent(CallContext("c1", "service", "***34", "PCMA", RATE), call)  # type: ignore[arg-type]
    asyncio.run(agent.on_start())
    return agent, call


@pytest.mark.parametrize("sentence", [1, 3])
def test_a_false_interruption_resumes_the_menu_at_the_cut_sentence(sentence: int) -> None:
    agent, call = _agent()
    greeting, menu = PROMPTS.get("greeting", RATE), PROMPTS.get("menu", RATE)
    starts = sentence_starts(menu, RATE)
    heard = len(greeting) + starts[sentence] + RATE // 2  # half a second into that sentence
    _barge_in(agent, call.responses[0], heard * 1000 // RATE)
    asyncio.run(agent.on_false_interruption(heard * 1000 // RATE))
    assert len(call.responses) == 2
    played = np.concatenate(call.responses[1].audio)
    np.testing.assert_array_equal(played, menu[starts[sentence] :])


def test_a_second_false_interruption_counts_from_where_the_resumed_response_began() -> None:
    agent, call = _agent()
    greeting, menu = PROMPTS.get("greeting", RATE), PROMPTS.get("menu", RATE)
    starts = sentence_starts(menu, RATE)
    first = (len(greeting) + starts[1] + 800) * 1000 // RATE
    _barge_in(agent, call.responses[0], first)
    asyncio.run(agent.on_false_interruption(first))
    # The resumed response starts at sentence 1; cut again a second into sentence 2.
    second = (starts[2] - starts[1] + RATE) * 1000 // RATE
    _barge_in(agent, call.responses[1], second)
    asyncio.run(agent.on_false_interruption(second))
    np.testing.assert_array_equal(np.concatenate(call.responses[2].audio), menu[starts[2] :])


def test_nothing_is_resumed_when_a_newer_response_already_plays() -> None:
    agent, call = _agent()
    _barge_in(agent, call.responses[0], 3000)
    call.queued_ms = 500
    asyncio.run(agent.on_false_interruption(3000))
    assert len(call.responses) == 1


def test_nothing_is_resumed_when_the_cut_was_not_the_callers() -> None:
    agent, call = _agent()
    call.responses[0].ended = "done"
    asyncio.run(agent.on_playback_cut(PlaybackCut("r1", 0, 3000, (), "media")))
    asyncio.run(agent.on_false_interruption(3000))
    assert len(call.responses) == 1
