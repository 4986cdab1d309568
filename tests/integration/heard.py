"""What the caller heard of a cut, as the session's log and its handoff say (issue 35).

Every cut of playback records what the caller heard, whoever cut it: the record
(``response_interrupted`` for an agent's response, ``prompt_cut`` for a line of the session's
own) is written just before the step that cut it (voicegate/call/acting.py), and
``GET /v1/sessions/{id}/handoff`` says it in ``heard_last`` until something else is played.
"""

from __future__ import annotations

from typing import Any

from tests.integration.harness import Server

CUT_RECORDS = ("response_interrupted", "prompt_cut")


def cut_before(session: dict[str, Any], cutter: str) -> dict[str, Any]:
    """The record of what the caller heard of what the first ``cutter`` event cut: the event
    right before it, with some of it heard."""
    types = [e["type"] for e in session["events"]]
    assert cutter in types, types
    at = types.index(cutter)
    assert at > 0 and types[at - 1] in CUT_RECORDS, f"no cut recorded before {cutter}: {types}"
    cut: dict[str, Any] = session["events"][at - 1]
    assert cut["payload"]["heard_ms"] > 0, cut
    return cut


def first_response(session: dict[str, Any]) -> str:
    """The id of the session's first agent response (the demo agent's greeting)."""
    started = [e for e in session["events"] if e["type"] == "response_started"]
    assert started, [e["type"] for e in session["events"]]
    response_id: str = started[0]["payload"]["response_id"]
    return response_id


def check_heard_last(server: Server, session_id: str, cut: dict[str, Any]) -> dict[str, Any]:
    """The handoff's ``heard_last`` is the cut ``cut`` records."""
    status, handoff = server.http(f"/v1/sessions/{session_id}/handoff")
    assert status == 200, handoff
    payload = cut["payload"]
    if cut["type"] == "response_interrupted":
        heard = {"prompt": None, "response_id": payload["response_id"]}
    else:
        heard = {"prompt": payload["prompt"], "response_id": None}
    expected = {**heard, "heard_ms": payload["heard_ms"], "interrupted": True, "at": cut["at"]}
    assert handoff["heard_last"] == expected, (handoff["heard_last"], server.log()[-4000:])
    return handoff
