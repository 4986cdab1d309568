"""Every cut of playback records what the caller heard, whoever cut it (issue 35).

Through the call's real parts (voicegate/call/acting.py's SessionSteps, responses.py's Responses,
actions.py's CallActions) over a real playout and a real SQLite store: a response (or a line of
the session's own) plays, the media clock pulls some of it, then something cuts it. The log must
hold ``response_interrupted`` (``prompt_cut`` for a line) with exactly what was pulled, written
just before the step that cut it; the agent hears of the cut once, with the reason
docs/agent-protocol.md gives that cutter; and the handoff's ``heard_last`` says it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agents.base import PlaybackCut
from audio.playout import Playout
from session import events as sev
from session.durable import DurableSession
from session.state import SessionState
from session.store.sqlite import SqliteSessionStore
from session.store.writer import StoreWriter
from telephony.media_bridge import MediaChannel
from voicegate.call.acting import SessionSteps
from voicegate.call.actions import CallActions
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.clock import SessionClock
from voicegate.call.heard import heard_last
from voicegate.call.notices import AgentNotice
from voicegate.call.responses import Responses
from voicegate.observe.metrics import Metrics

RATE = 8000
PULLED = 23  # frames the media clock takes before the cut: 460 ms heard


class Services:
    def __init__(self, store: SqliteSessionStore, writer: StoreWriter) -> None:
        self.store, self.writer, self.metrics = store, writer, Metrics()

    def record_effects(self, effects: list[Any]) -> None:
        pass

    def prompt(self, name: str, rate: int) -> NDArray[np.int16]:
        return np.full(rate * 2, 1000, dtype=np.int16)  # every line is 2 s long


class Recorder:
    """Stands in for the call's other parts (hang-up, timers, tool calls, notices): records what
    the actions asked of them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, args))

        return record


class Call:
    """One answered call's steps, responses and actions, on a real playout and store."""

    def __init__(self, store: SqliteSessionStore, writer: StoreWriter) -> None:
        lease = store.create("c1", owner="w/1", meta={}, at=1.0)
        self.playout = Playout(RATE)
        self.state = CallState(
            "c1",
            channel=MediaChannel(RATE, playout=self.playout),
            session=DurableSession(store, SessionState("c1"), lease),
        )
        self.posted: list[object] = []
        services = Services(store, writer)
        clock = SessionClock()
        self.steps = SessionSteps(
            self.state,
            services,  # type: ignore[arg-type]
            clock,
            post=self.posted.append,
            on_halt=lambda: None,
        )
        self.responses = Responses(
            self.state,
            services,  # type: ignore[arg-type]
            self.steps,
            may_play=lambda: True,
            post=self.posted.append,
        )
        self.steps.before_cut = self.responses.cut_for_session
        self.notices = Recorder()
        actions = CallActions(
            self.state,
            services,  # type: ignore[arg-type]
            clock,
            responses=self.responses,
            hangup=Recorder(),  # type: ignore[arg-type]
            timers=Recorder(),  # type: ignore[arg-type]
            tools=Recorder(),  # type: ignore[arg-type]
            notices=self.notices,  # type: ignore[arg-type]
        )
        self.steps.attach(actions)
        self.steps.apply(sev.CallOffered(policy={"max_duration_s": 600.0}))
        self.steps.apply(sev.CallAnswered())
        self.state.phase = CallPhase.ANSWERED
        self.store = store

    def speak(self) -> str:
        """An agent response with 2 s of audio, of which the caller hears PULLED frames."""
        handle = self.responses.respond()
        assert handle.alive
        assert handle.play(np.full(RATE * 2, 500, dtype=np.int16))
        self._pull()
        return handle.id

    def say(self, prompt: str) -> None:
        self.responses.say(prompt)
        self._pull()

    def _pull(self) -> None:
        for _ in range(PULLED):
            self.playout.pull()

    def types(self) -> list[str]:
        return [record.type for record in self.store.events("c1")]

    def records(self) -> list[Any]:
        return list(self.store.events("c1"))

    def cuts_told(self) -> list[PlaybackCut]:
        return [
            n.payload
            for n in self.posted
            if isinstance(n, AgentNotice) and isinstance(n.payload, PlaybackCut)
        ]

    def told(self, what: str) -> int:
        return sum(1 for name, args in self.notices.calls if name == "post" and args[0] == what)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteSessionStore]:
    s = SqliteSessionStore(tmp_path / "s.sqlite3")
    yield s
    s.close()


@pytest.fixture
async def call(store: SqliteSessionStore) -> Any:
    writer = StoreWriter(lambda: SqliteSessionStore(store.path))
    try:
        yield Call(store, writer)
    finally:
        await asyncio.to_thread(writer.close)


def _max_duration(call: Call) -> sev.Event:
    state = call.state.session_state
    assert state is not None
    return sev.DeadlineFired("max_duration", state.deadlines["max_duration"].generation)


# The cutters the session makes itself: the event, the type it is logged as, the reason the agent
# is given (docs/agent-protocol.md, "Cuts": playback.cleared).
SESSION_CUTTERS: list[tuple[str, Callable[[Call], sev.Event], str, str]] = [
    ("media lost", lambda c: sev.MediaLost(), "media_lost", "media"),
    ("re-INVITE", lambda c: sev.ReinviteStarted(), "reinvite_started", "reinvite"),
    (
        "API blind transfer",
        lambda c: sev.TransferStarted("sip:desk@cc.example.com", "blind"),
        "transfer_started",
        "transfer",
    ),
    (
        "API bridged transfer",
        lambda c: sev.TransferStarted("sip:desk@cc.example.com", "bridge"),
        "transfer_started",
        "transfer",
    ),
    ("agent link lost", lambda c: sev.AgentLinkLost(), "agent_link_lost", "agent_link"),
    ("caller hang-up", lambda c: sev.CallerHangup(), "caller_hangup", "ending"),
    (
        "agent hang-up",
        lambda c: sev.ServerHangup("completed", "agent hung up"),
        "server_hangup",
        "ending",
    ),
    ("dialog failed", lambda c: sev.DialogFailed(408, "no ACK"), "dialog_failed", "ending"),
    ("max duration", _max_duration, "deadline_fired", "timeout"),
]


@pytest.mark.parametrize(
    ("cutter", "event_type", "reason"),
    [(make, kind, reason) for _, make, kind, reason in SESSION_CUTTERS],
    ids=[name for name, *_ in SESSION_CUTTERS],
)
async def test_a_cut_the_session_makes_records_what_the_caller_heard_just_before_it(
    call: Call, cutter: Callable[[Call], sev.Event], event_type: str, reason: str
) -> None:
    response_id = call.speak()
    call.steps.apply(cutter(call))
    await call.steps.settled()
    types = call.types()
    assert types[-2:] == ["response_interrupted", event_type], types
    cut = call.records()[-2]
    assert cut.payload == {"response_id": response_id, "heard_ms": PULLED * 20}
    # Told once, with the cutter's reason; the step after it found nothing left to cut.
    assert [(c.response_id, c.heard_ms, c.reason) for c in call.cuts_told()] == [
        (response_id, PULLED * 20, reason)
    ]
    assert call.told("stop") == 1  # stop producing, as the step would have said itself
    # Nothing of it plays on (an ending may queue its goodbye line after the cut).
    assert call.responses.response_id is None and call.playout.playing != response_id
    last = call.records()[-1]
    said = [effect["prompt"] for effect in last.effects if effect["kind"] == "say"]
    if said:  # an ending that tells the caller why: that line is the last thing they hear
        expected = {"prompt": said[-1], "response_id": None, "heard_ms": None, "at": last.at}
        assert heard_last(call.records()) == {**expected, "interrupted": False}
    else:
        assert heard_last(call.records()) == {
            "prompt": None,
            "response_id": response_id,
            "heard_ms": PULLED * 20,
            "interrupted": True,
            "at": cut.at,
        }


@pytest.mark.parametrize(
    ("cut", "reason"),
    [
        (lambda c: c.responses.interrupt(), "barge_in"),  # speech or a key over it
        (lambda c: c.responses.interrupt(reason="ending"), "ending"),  # the server shutting down
    ],
    ids=["barge-in", "shutdown"],
)
async def test_a_cut_by_the_call_is_recorded_once_even_when_the_session_then_ends(
    call: Call, cut: Callable[[Call], object], reason: str
) -> None:
    response_id = call.speak()
    cut(call)
    call.steps.apply(sev.ServerHangup("canceled", "server shutting down"))
    await call.steps.settled()
    assert call.types()[-2:] == ["response_interrupted", "server_hangup"]
    assert call.types().count("response_interrupted") == 1
    assert [(c.response_id, c.reason) for c in call.cuts_told()] == [(response_id, reason)]


async def test_the_agents_cancel_is_recorded_as_canceled(call: Call) -> None:
    handle = call.responses.respond()
    handle.play(np.full(RATE, 500, dtype=np.int16))
    for _ in range(PULLED):
        call.playout.pull()
    handle.cancel()
    await call.steps.settled()
    assert call.types()[-1] == "response_interrupted"
    assert call.records()[-1].payload["heard_ms"] == PULLED * 20
    assert [c.reason for c in call.cuts_told()] == ["canceled"]


async def test_a_line_of_the_sessions_own_cut_by_a_hang_up_is_recorded_as_prompt_cut(
    call: Call,
) -> None:
    call.say("still_there")
    call.steps.apply(sev.CallerHangup())
    await call.steps.settled()
    assert call.types()[-2:] == ["prompt_cut", "caller_hangup"]
    cut = call.records()[-2]
    assert cut.payload == {"say_id": "say1", "prompt": "still_there", "heard_ms": PULLED * 20}
    assert call.cuts_told() == []  # not the agent's line: not told
    assert heard_last(call.records()) == {
        "prompt": "still_there",
        "response_id": None,
        "heard_ms": PULLED * 20,
        "interrupted": True,
        "at": cut.at,
    }


async def test_a_transfer_while_a_line_plays_records_the_line(call: Call) -> None:
    call.say("transfer_failed")
    call.steps.apply(sev.TransferStarted("sip:desk@cc.example.com", "bridge"))
    await call.steps.settled()
    assert call.types()[-2:] == ["prompt_cut", "transfer_started"]
    assert call.records()[-2].payload["heard_ms"] == PULLED * 20


async def test_a_response_that_played_out_is_not_cut_again(call: Call) -> None:
    handle = call.responses.respond()
    handle.play(np.full(RATE // 10, 500, dtype=np.int16))  # 100 ms
    handle.done()
    for _ in range(10):
        call.playout.pull()
    for event in call.playout.poll():
        call.responses.drained(event.response_id, event.heard_ms)  # type: ignore[union-attr]
    call.steps.apply(sev.CallerHangup())
    await call.steps.settled()
    assert call.types()[-2:] == ["response_finished", "caller_hangup"]
    assert call.cuts_told() == []


async def test_a_response_the_call_stopped_tracking_is_still_recorded_when_the_session_cuts_it(
    call: Call,
) -> None:
    response_id = call.speak()
    call.responses.forget()  # the call let go of it; the session and the playout have not
    call.steps.apply(sev.MediaLost())
    await call.steps.settled()
    assert call.types()[-2:] == ["response_interrupted", "media_lost"]
    assert call.records()[-2].payload == {"response_id": response_id, "heard_ms": PULLED * 20}
    assert [(c.response_id, c.reason) for c in call.cuts_told()] == [(response_id, "media")]
