"""The handoff's ``heard_last`` (voicegate/control/handoff.py) after each kind of cut, read from
event records as the store keeps them (issue 35: after a transfer started by the API it was all
null, though the caller had heard 2.6 s of the greeting)."""

from __future__ import annotations

from typing import Any

import pytest

from session.store import EventRecord
from voicegate.call.heard import heard_last, heard_last_line


def _log(*steps: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> list[EventRecord]:
    return [
        EventRecord("c1", seq, kind, payload, effects, at=100.0 + seq)
        for seq, (kind, payload, effects) in enumerate(steps, start=1)
    ]


def _say(prompt: str) -> dict[str, Any]:
    return {"kind": "say", "prompt": prompt}


ANSWERED = [
    ("call_offered", {}, []),
    ("call_answered", {}, []),
    ("response_started", {"response_id": "r1", "turn_id": ""}, [{"kind": "bind_response"}]),
]
CUT_R1 = ("response_interrupted", {"response_id": "r1", "heard_ms": 2600}, [])
R1_HEARD = {"prompt": None, "response_id": "r1", "heard_ms": 2600, "interrupted": True}
NOTHING = {"prompt": None, "response_id": None, "heard_ms": None, "at": None}

CASES: list[tuple[str, list[tuple[str, dict[str, Any], list[dict[str, Any]]]], dict[str, Any]]] = [
    ("nothing played", ANSWERED[:2], NOTHING),
    (
        "played out",
        [*ANSWERED, ("response_finished", {"response_id": "r1", "heard_ms": 4100}, [])],
        {"prompt": None, "response_id": "r1", "heard_ms": 4100, "interrupted": False},
    ),
    ("barge-in", [*ANSWERED, CUT_R1, ("turn_started", {"turn_id": "t1"}, [])], R1_HEARD),
    (
        "transfer started by the API, blind or bridged",
        [*ANSWERED, CUT_R1, ("transfer_started", {"target": "sip:d@x", "mode": "bridge"}, [])],
        R1_HEARD,
    ),
    (
        "transfer then bridged, then the target hangs up",
        [
            *ANSWERED,
            CUT_R1,
            ("transfer_started", {"target": "sip:d@x", "mode": "bridge"}, []),
            ("bridge_up", {"generation": 1}, []),
            ("bridge_ended", {"by": "target"}, [{"kind": "clear_playout", "generation": 3}]),
        ],
        R1_HEARD,
    ),
    ("media lost", [*ANSWERED, CUT_R1, ("media_lost", {}, [])], R1_HEARD),
    ("agent link lost", [*ANSWERED, CUT_R1, ("agent_link_lost", {}, [])], R1_HEARD),
    ("caller hang-up", [*ANSWERED, CUT_R1, ("caller_hangup", {}, [])], R1_HEARD),
    (
        "shutdown: cut, then the server's hang-up",
        [*ANSWERED, CUT_R1, ("server_hangup", {"outcome": "canceled"}, [])],
        R1_HEARD,
    ),
    (
        "media lost, then the honest line",
        [
            *ANSWERED,
            CUT_R1,
            ("media_lost", {}, []),
            ("deadline_fired", {"name": "honesty"}, [_say("reconnecting")]),
        ],
        {"prompt": "reconnecting", "response_id": None, "heard_ms": None, "interrupted": False},
    ),
    (
        "the honest line cut by the caller's hang-up",
        [
            *ANSWERED,
            CUT_R1,
            ("media_lost", {}, []),
            ("deadline_fired", {"name": "honesty"}, [_say("reconnecting")]),
            ("prompt_cut", {"say_id": "say1", "prompt": "reconnecting", "heard_ms": 640}, []),
            ("caller_hangup", {}, []),
        ],
        {"prompt": "reconnecting", "response_id": None, "heard_ms": 640, "interrupted": True},
    ),
    (
        "two lines queued, the first cut part-way, the second before a word",
        [
            *ANSWERED[:2],
            ("deadline_fired", {"name": "no_input"}, [_say("still_there")]),
            ("transfer_finished", {"ok": False}, [_say("transfer_failed")]),
            ("prompt_cut", {"say_id": "say1", "prompt": "still_there", "heard_ms": 800}, []),
            ("prompt_cut", {"say_id": "say2", "prompt": "transfer_failed", "heard_ms": 0}, []),
            ("transfer_started", {"target": "sip:d@x", "mode": "blind"}, []),
        ],
        {"prompt": "still_there", "response_id": None, "heard_ms": 800, "interrupted": True},
    ),
    (
        "a line cut before a word of it: the response before it was the last heard",
        [
            *ANSWERED,
            ("response_finished", {"response_id": "r1", "heard_ms": 4100}, []),
            ("deadline_fired", {"name": "no_input"}, [_say("still_there")]),
            ("prompt_cut", {"say_id": "say1", "prompt": "still_there", "heard_ms": 0}, []),
            ("caller_hangup", {}, []),
        ],
        {"prompt": None, "response_id": "r1", "heard_ms": 4100, "interrupted": False},
    ),
    (
        "a failed transfer's honest line after the cut",
        [
            *ANSWERED,
            CUT_R1,
            ("transfer_started", {"target": "sip:d@x", "mode": "blind"}, []),
            ("transfer_finished", {"ok": False}, [_say("transfer_failed")]),
        ],
        {"prompt": "transfer_failed", "response_id": None, "heard_ms": None, "interrupted": False},
    ),
    (
        "a log from before the record: the cut response named, how much unknown",
        [
            *ANSWERED,
            (
                "transfer_started",
                {"target": "sip:d@x", "mode": "blind"},
                [{"kind": "cancel_response", "response_id": "r1"}],
            ),
        ],
        {"prompt": None, "response_id": "r1", "heard_ms": None, "interrupted": True},
    ),
]


@pytest.mark.parametrize(("steps", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_heard_last_after_each_kind_of_cut(
    steps: list[tuple[str, dict[str, Any], list[dict[str, Any]]]], expected: dict[str, Any]
) -> None:
    records = _log(*steps)
    heard = heard_last(records)
    if expected is NOTHING:
        assert heard == NOTHING
        return
    at = heard.pop("at")
    assert heard == expected
    assert at in [r.at for r in records]  # the step that queued it, or cut it


def test_a_rejoined_agent_hears_the_account_the_desk_reads() -> None:
    # A line cut before a word of it played was never heard: neither the handoff nor the
    # rejoin's read-back (voicegate/call/rejoin.py) names it.
    records = _log(
        *ANSWERED,
        ("response_finished", {"response_id": "r1", "heard_ms": 900}, []),
        ("transfer_started", {"target": "sip:desk@cc", "mode": "attended"}, [_say("hold")]),
        ("prompt_cut", {"say_id": "say1", "prompt": "hold", "heard_ms": 0}, []),
    )
    assert heard_last_line(records) == "response r1"
    assert heard_last(records)["response_id"] == "r1"
