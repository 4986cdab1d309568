"""An attended transfer's consultation (voicegate/call/consult.py): the brief the person hears
on the consult leg, and who says when the caller is handed over. Driven with a real playout and
media channel, frames pulled as the media clock would; no SIP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from agents.base import ConsultEvent
from audio.prompts import UnknownPrompt
from config.settings import TransferSettings
from telephony.media_bridge import MediaChannel
from voicegate.call.consult import Consultation, ConsultRefused, Stage, Synthesized

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


# --- what the agent or the API says to the person, and the person's keys -------------------------

SAY_FRAMES = 5


def _say_prompt(name: str, rate: int) -> NDArray[np.int16]:
    if name == "consult_brief":
        return _prompt(name, rate)
    if name != "reason":
        raise UnknownPrompt(name, Path("prompts"))
    return np.full(SAY_FRAMES * rate // 50, 2000, dtype=np.int16)


class _Synthesis:
    """Holds each text until the test releases it, as the espeak-ng task would later."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, Synthesized]] = []
        self.stopped: list[str] = []

    def __call__(self, text: str, rate: int, done: Synthesized) -> Callable[[], None]:
        assert rate == RATE
        self.pending.append((text, done))
        return lambda: self.stopped.append(text)

    def release(self, samples: NDArray[np.int16] | None = None, why: str = "") -> None:
        _text, done = self.pending.pop(0)
        done(samples, why)


def _talking(**settings: str) -> tuple[Consultation, list[str], MediaChannel, _Synthesis]:
    """A consultation whose events, hand-over and decline are recorded in order."""
    happened: list[str] = []
    synthesis = _Synthesis()

    def event(e: ConsultEvent) -> None:
        happened.append(" ".join(x for x in (e.kind, e.digit, e.say_id, e.outcome) if x))

    def decline() -> None:
        happened.append("decline")

    c = Consultation(
        "call-1",
        TransferSettings(**settings),
        _say_prompt,
        lambda: happened.append("refer"),
        notify=event,
        decline=lambda: decline(),
        synthesize=synthesis,
    )
    channel = MediaChannel(RATE)
    c.media(channel)
    return c, happened, channel, synthesis


def _levels(channel: MediaChannel, frames: int) -> list[int]:
    """The first sample of each frame pulled: which audio the person heard, in order."""
    return [int(np.frombuffer(channel.playout.pull(), dtype=np.int16)[0]) for _ in range(frames)]


def test_a_say_plays_after_the_brief_and_the_hand_over_waits_for_it() -> None:
    c, happened, channel, _s = _talking()
    with pytest.raises(ConsultRefused, match="not answered"):
        c.say(prompt="reason")
    c.answered()
    assert c.say(prompt="reason", say_id="why") == "why"
    heard = _levels(channel, BRIEF_FRAMES + SAY_FRAMES + 1)
    assert heard == [1000] * BRIEF_FRAMES + [2000] * SAY_FRAMES + [0]
    c.tick()
    c.tick()
    assert happened == ["answered", "said why played", "refer"]
    with pytest.raises(ConsultRefused, match="handed over"):
        c.say(prompt="reason")


def test_text_being_synthesised_holds_the_hand_over_and_keeps_its_place_in_line() -> None:
    c, happened, channel, synthesis = _talking()
    c.answered()
    first = c.say(text="The caller wants a refund.")
    second = c.say(prompt="reason")  # ready at once, but asked after the text
    assert _levels(channel, BRIEF_FRAMES + 3) == [1000] * BRIEF_FRAMES + [0, 0, 0]
    c.tick()
    assert c.stage is Stage.BRIEFING and "refer" not in happened  # the text is not said yet
    synthesis.release(np.full(SAY_FRAMES * RATE // 50, 3000, dtype=np.int16))
    heard = _levels(channel, 2 * SAY_FRAMES + 1)
    assert heard == [3000] * SAY_FRAMES + [2000] * SAY_FRAMES + [0]
    c.tick()
    c.tick()
    assert happened == ["answered", f"said {first} played", f"said {second} played", "refer"]


def test_without_a_brief_nothing_holds_the_after_brief_hand_over() -> None:
    c, happened, _channel, _s = _talking(consult_brief="")
    c.answered()
    assert happened == ["answered", "refer"]
    with pytest.raises(ConsultRefused, match="handed over"):
        c.say(text="too late")


def test_a_failed_synthesis_is_told_and_lets_the_consultation_go_on() -> None:
    c, happened, channel, synthesis = _talking(consult_complete="api")
    c.answered()
    say_id = c.say(text="Hello")
    _levels(channel, BRIEF_FRAMES + 1)
    c.tick()
    assert c.stage is Stage.BRIEFING  # the text is still being synthesised
    synthesis.release(None, "espeak-ng exited with 1")
    assert c.stage is Stage.WAITING
    assert happened == ["answered", f"said {say_id} failed"]


def test_the_go_ahead_cuts_what_the_person_still_hears_and_stops_synthesis() -> None:
    c, happened, channel, synthesis = _talking(consult_complete="api")
    c.answered()
    queued = c.say(prompt="reason")
    pending = c.say(text="Not spoken yet")
    _levels(channel, 2)
    assert c.complete(by="agent") is None
    assert _levels(channel, BRIEF_FRAMES + SAY_FRAMES) == [0] * (BRIEF_FRAMES + SAY_FRAMES)
    assert synthesis.stopped == ["Not spoken yet"]
    assert happened == ["answered", f"said {queued} cleared", f"said {pending} cleared", "refer"]
    synthesis.release(np.full(160, 5, dtype=np.int16))  # too late: nothing more is queued
    assert _levels(channel, 2) == [0, 0]


def test_an_unknown_prompt_changes_nothing() -> None:
    c, happened, channel, _s = _talking(consult_complete="api")
    c.answered()
    with pytest.raises(UnknownPrompt):
        c.say(prompt="nope")
    _levels(channel, BRIEF_FRAMES + 2)
    c.tick()
    assert (c.stage, happened) == (Stage.WAITING, ["answered"])


@pytest.mark.parametrize("complete", ["after_brief", "api"])
def test_the_persons_keys_are_told_and_decide_nothing_unless_the_person_decides(
    complete: str,
) -> None:
    c, happened, _channel, _s = _talking(consult_complete=complete)
    c.key("1")  # before the answer is durable: not the consultation's yet
    c.answered()
    c.key("1")
    c.key("2")
    assert happened == ["answered", "dtmf 1", "dtmf 2"]
    assert c.stage is Stage.BRIEFING


def test_with_the_person_deciding_the_accept_key_hands_over_even_during_the_brief() -> None:
    c, happened, channel, _s = _talking(consult_complete="person")
    c.answered()
    c.key("5")
    c.key("1")
    assert c.stage is Stage.HANDING_OVER
    assert happened == ["answered", "dtmf 5", "dtmf 1", "accepted", "refer"]
    assert _levels(channel, 3) == [0, 0, 0]  # the rest of the brief is cut
    c.key("2")  # after the hand-over: told, decides nothing
    assert happened[-1] == "dtmf 2" and "decline" not in happened


def test_with_the_person_deciding_the_decline_key_calls_the_transfer_off() -> None:
    c, happened, channel, _s = _talking(consult_complete="person", consult_decline_key="#")
    c.answered()
    _levels(channel, BRIEF_FRAMES + 1)
    c.tick()
    assert c.stage is Stage.WAITING  # nothing goes until the person's key
    c.key("2")  # not the decline key here
    c.key("#")
    assert happened == ["answered", "dtmf 2", "dtmf #", "decline", "declined"]
    assert c.stage is Stage.OVER
    c.key("1")  # the leg is still up until our BYE: a late key decides nothing, and is not told
    assert c.complete() == "the consultation is over"
    with pytest.raises(ConsultRefused, match="over"):
        c.say(prompt="reason")
    assert happened[-1] == "declined"


def test_no_accept_key_leaves_the_decision_to_the_agent() -> None:
    c, happened, _channel, _s = _talking(consult_complete="person", consult_accept_key="")
    c.answered()
    c.key("1")
    assert c.stage is Stage.BRIEFING and "refer" not in happened
    assert c.complete(by="agent") is None
    assert happened[-1] == "refer"


def test_a_new_media_port_cuts_what_the_old_one_held_and_the_consultation_goes_on() -> None:
    c, happened, channel, _s = _talking()
    c.answered()
    queued = c.say(prompt="reason")
    _levels(channel, 2)
    c.media(channel)  # the same port again (a re-INVITE that keeps it): nothing changes
    assert happened == ["answered"]
    c.media(MediaChannel(RATE))
    assert happened == ["answered", f"said {queued} cleared", "refer"]


# --- every say ends exactly once, whatever happens in between -------------------------------

STEPS = st.lists(
    st.one_of(
        st.just(("answered", "")),
        st.tuples(st.just("say_prompt"), st.just("")),
        st.tuples(st.just("say_text"), st.just("")),
        st.tuples(st.just("release"), st.sampled_from(["ok", "failed"])),
        st.tuples(st.just("play"), st.sampled_from(["1", "3", "12"])),
        st.tuples(st.just("key"), st.sampled_from(["1", "2", "5"])),
        st.just(("complete", "")),
        st.just(("new_port", "")),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["after_brief", "api", "person"]), st.sampled_from(["", "consult_brief"]), STEPS
)
def test_every_say_ends_once_the_hand_over_goes_once_and_nothing_plays_after_it(
    complete: str, brief: str, steps: list[tuple[str, str]]
) -> None:
    c, happened, channel, synthesis = _talking(consult_complete=complete, consult_brief=brief)
    asked: list[str] = []
    for step, arg in steps:
        match step:
            case "answered":
                c.answered()
            case "say_prompt" | "say_text":
                try:
                    if step == "say_prompt":
                        asked.append(c.say(prompt="reason"))
                    else:
                        asked.append(c.say(text="Hello there"))
                except ConsultRefused:
                    pass
            case "release" if synthesis.pending:
                samples = np.full(160 * 3, 7, dtype=np.int16) if arg == "ok" else None
                synthesis.release(samples, "" if samples is not None else "espeak failed")
            case "play":
                heard = _levels(channel, int(arg))
                if "refer" in happened:
                    assert not any(heard), "audio reached the person after the hand-over"
                c.tick()
            case "key":
                c.key(arg)
            case "complete":
                c.complete()
            case "new_port":
                channel = MediaChannel(RATE)
                c.media(channel)
    c.close()  # the leg ends
    said = [h.split()[1] for h in happened if h.startswith("said ")]
    assert sorted(said) == sorted(asked), (asked, happened)
    assert happened.count("refer") <= 1
    assert happened.count("decline") <= (1 if complete == "person" else 0)
    assert not ("refer" in happened and "declined" in happened)
