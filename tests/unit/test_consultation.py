"""An attended transfer's consultation (voicegate/call/consult.py): the brief the person hears
on the consult leg, and who says when the caller is handed over. Driven with a real playout and
media channel, frames pulled as the media clock would; no SIP."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from config.settings import TransferSettings
from telephony.media_bridge import MediaChannel
from voicegate.call.consult import Consultation, Stage

RATE = 8000
BRIEF_FRAMES = 10  # 200 ms of brief


def _prompt(name: str, rate: int) -> NDArray[np.int16]:
    assert (name, rate) == ("consult_brief", RATE)
    return np.full(BRIEF_FRAMES * rate // 50, 1000, dtype=np.int16)


def _consultation(**settings: str) -> tuple[Consultation, list[str], MediaChannel]:
    """The consultation, what happened (the hand-over and what the agent was told, in order)
    and the consult leg's media channel."""
    happened: list[str] = []
    c = Consultation(
        "call-1",
        TransferSettings(**settings),
        _prompt,
        lambda: happened.append("refer"),
        lambda detail: happened.append(f"told: {detail}"),
    )
    return c, happened, MediaChannel(RATE)


def _play(channel: MediaChannel, frames: int) -> int:
    """Pull ``frames`` frames as the media clock does; how many carried sound."""
    return sum(any(channel.playout.pull()) for _ in range(frames))


def test_after_the_brief_the_caller_is_happened_once() -> None:
    c, happened, channel = _consultation()
    c.media(channel)  # the leg's media may be up before its answer is durable
    c.tick()
    assert (c.stage, happened) == (Stage.RINGING, [])
    c.answered()
    assert c.stage is Stage.BRIEFING
    assert _play(channel, BRIEF_FRAMES - 1) == BRIEF_FRAMES - 1
    c.tick()
    assert happened == ["told: consult answered"]  # no REFER before the brief's last frame
    _play(channel, 5)
    c.tick()
    c.tick()
    assert (c.stage, happened) == (Stage.HANDING_OVER, ["told: consult answered", "refer"])


def test_the_brief_waits_for_the_legs_media_when_the_answer_comes_first() -> None:
    c, happened, channel = _consultation()
    c.answered()
    assert _play(channel, 3) == 0 and c.stage is Stage.BRIEFING
    c.media(channel)
    assert _play(channel, BRIEF_FRAMES + 2) == BRIEF_FRAMES
    c.tick()
    assert happened == ["told: consult answered", "refer"]


def test_without_a_brief_the_hand_over_is_at_once() -> None:
    c, happened, _channel = _consultation(consult_brief="")
    c.answered()
    assert (c.stage, happened) == (Stage.HANDING_OVER, ["told: consult answered", "refer"])


def test_with_completion_by_api_nothing_goes_until_complete() -> None:
    c, happened, channel = _consultation(consult_complete="api")
    assert c.complete() == "the consult leg has not answered yet"
    c.media(channel)
    c.answered()
    _play(channel, BRIEF_FRAMES + 2)
    c.tick()
    told = ["told: consult answered", "told: consult waiting for the go-ahead"]
    assert (c.stage, happened) == (Stage.WAITING, told)
    assert c.complete() is None
    assert (c.stage, happened) == (Stage.HANDING_OVER, [*told, "refer"])
    assert c.complete() == "the caller is already being handed over"
    assert happened == [*told, "refer"]


@pytest.mark.parametrize("complete", ["after_brief", "api"])
def test_completing_during_the_brief_cuts_it_and_hands_over_once(complete: str) -> None:
    c, happened, channel = _consultation(consult_complete=complete)
    c.media(channel)
    c.answered()
    _play(channel, 2)
    assert c.complete() is None
    assert _play(channel, BRIEF_FRAMES) == 0  # the rest of the brief is not played
    c.tick()
    assert happened == ["told: consult answered", "refer"]
