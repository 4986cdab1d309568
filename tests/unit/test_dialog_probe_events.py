"""The dialog probe's command and event (telephony.events): what asyncio and the SIP thread
exchange to ask "does the caller still have this dialog?" (RFC 3261 section 11)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from telephony import events as ev


def test_the_probe_is_a_command_and_its_answer_an_event() -> None:
    assert ev.ProbeDialog in typing.get_args(ev.SipCommand)
    assert ev.DialogProbed in typing.get_args(ev.SipEvent)
    assert ev.ProbeDialog not in typing.get_args(ev.SipEvent)
    assert ev.DialogProbed not in typing.get_args(ev.SipCommand)


def test_the_answer_carries_the_probes_generation_and_attempt() -> None:
    probe = ev.ProbeDialog("c1", generation=3, attempt=2)
    answer = ev.DialogProbed("c1", 3, 2, 481, "Call/Transaction Does Not Exist")
    assert (answer.call_id, answer.generation, answer.attempt) == (
        probe.call_id,
        probe.generation,
        probe.attempt,
    )
    assert [f.name for f in dataclasses.fields(answer)] == [
        "call_id",
        "generation",
        "attempt",
        "status",
        "reason",
    ]


def test_both_are_frozen_values() -> None:
    probe = ev.ProbeDialog("c1", 1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        probe.attempt = 1  # type: ignore[misc]
    assert probe == ev.ProbeDialog("c1", 1, 0)
    assert hash(ev.DialogProbed("c1", 1, 0, 200, "OK")) == hash(
        ev.DialogProbed("c1", 1, 0, 200, "OK")
    )
    assert ev.DialogProbed("c1", 1, 0, 200, "OK") != ev.DialogProbed("c1", 1, 1, 200, "OK")

