"""Fold a committed session history and compare it with the final state committed beside it.

A history is ``NAME.jsonl``: one event a line, ``{"seq", "type", "payload", "at"}``, exactly as
the store's ``EventRecord`` keeps them (the effects are left out: the fold recomputes them).
``NAME.final.json`` is ``SessionState.to_dict()`` after the fold, when the history was captured.
The fold is the one ``session.durable.DurableSession.load`` does: from an empty
``SessionState``, ``step(state, event_from_dict(type, payload), at)`` for each record in seq
order. Every error names the file and the seq, so a failure says which old log broke and where.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from session import effects as fx
from session import events as ev
from session.machine import IllegalTransition, step
from session.state import SessionState

HISTORIES = Path(__file__).resolve().parent / "histories"


class ReplayError(AssertionError):
    """A committed history no longer replays as it did when it was captured."""

    def __init__(self, path: Path, seq: int | None, why: str) -> None:
        self.path = path
        self.seq = seq
        self.why = why
        where = f"{path.name}" + (f" at seq {seq}" if seq is not None else "")
        super().__init__(f"{where}: {why}")


class HistoryUnreadable(ReplayError):
    """A line is not a record, or its event no longer parses (a type or field was renamed)."""


class ReplayDiverged(ReplayError):
    """An event that was accepted live is now refused, or ignored as stale."""


class FinalStateDiffers(ReplayError):
    """The fold ends in another state than the one committed beside the history."""


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    type: str
    payload: Mapping[str, Any]
    at: float

    def to_json(self) -> str:
        data = {"seq": self.seq, "type": self.type, "payload": self.payload, "at": self.at}
        return json.dumps(data, sort_keys=True)


def final_path(history: Path) -> Path:
    return history.with_name(history.name.removesuffix(".jsonl") + ".final.json")


def read_history(path: Path) -> list[Record]:
    """The records of ``path``, checked to be ``seq`` 1, 2, 3, ... as the store keeps them."""
    records = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            record = Record(int(data["seq"]), str(data["type"]), data["payload"], float(data["at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise HistoryUnreadable(path, None, f"line {n} is no event record: {exc}") from None
        if record.seq != len(records) + 1:
            raise HistoryUnreadable(path, record.seq, f"expected seq {len(records) + 1}")
        records.append(record)
    return records


def fold(path: Path, records: Iterable[Record], session_id: str | None = None) -> SessionState:
    """Fold ``records`` from an empty state; raise at the first record that no longer folds."""
    state = SessionState(session_id or path.name.removesuffix(".jsonl"))
    for record in records:
        try:
            event = ev.event_from_dict(record.type, record.payload)
        except ev.UnknownEvent as exc:
            raise HistoryUnreadable(path, record.seq, str(exc)) from None
        try:
            after, effects = step(state, event, record.at)
        except IllegalTransition as exc:
            raise ReplayDiverged(path, record.seq, f"now refused: {exc}") from None
        if after.version != record.seq:
            stale = [e.why for e in effects if isinstance(e, fx.StaleEventIgnored)]
            raise ReplayDiverged(
                path, record.seq, f"logged, but now ignored as stale: {'; '.join(stale)}"
            )
        state = after
    return state


def _differences(want: Any, got: Any, where: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for key in sorted(set(want) | set(got)):
            here = f"{where}.{key}" if where else str(key)
            if key not in got:
                out.append(f"{here}: missing now (was {want[key]!r})")
            elif key not in want:
                out.append(f"{here}: new, {got[key]!r}")
            else:
                out += _differences(want[key], got[key], here)
        return out
    return [] if want == got else [f"{where}: was {want!r}, now {got!r}"]


def check(history: Path) -> SessionState:
    """Replay ``history`` and compare with its committed final state; raise a ReplayError."""
    records = read_history(history)
    state = fold(history, records, session_id=_session_id(history))
    expected_path = final_path(history)
    if not expected_path.exists():
        raise FinalStateDiffers(history, None, f"{expected_path.name} is missing")
    expected = json.loads(expected_path.read_text())
    got = json.loads(json.dumps(state.to_dict()))
    if got != expected:
        diff = "\n  ".join(_differences(expected, got))
        last = records[-1].seq if records else None
        raise FinalStateDiffers(history, last, f"the final state differs:\n  {diff}")
    return state


def _session_id(history: Path) -> str:
    """The session id the final state names (histories keep the id they were captured with)."""
    expected_path = final_path(history)
    if expected_path.exists():
        data = json.loads(expected_path.read_text())
        if isinstance(data, dict) and isinstance(data.get("session_id"), str):
            return data["session_id"]
    return history.name.removesuffix(".jsonl")


def write(history: Path, records: list[Record], session_id: str) -> SessionState:
    """Write ``history`` and its final state (the fold of ``records``, checked on the way)."""
    history.parent.mkdir(parents=True, exist_ok=True)
    state = fold(history, records, session_id=session_id)
    history.write_text("".join(record.to_json() + "\n" for record in records))
    final = json.dumps(state.to_dict(), indent=2, sort_keys=True)
    final_path(history).write_text(final + "\n")
    return state
