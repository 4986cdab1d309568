"""The effect interpreter is exhaustive: every effect class the session machine can emit is in
``AnyEffect`` and reaches exactly one action of the call (voicegate/call/executor.py)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from session import effects as fx
from voicegate.call.executor import EffectTarget, execute, execute_one

# What each effect must become; a new effect class fails here until it is given an executor.
EXPECTED_ACTION = {
    fx.ClearPlayout: "clear_playout",
    fx.CancelResponse: "cancel_response",
    fx.BindResponse: "bind_response",
    fx.StopGeneration: "stop_generation",
    fx.GateChanged: "gate_changed",
    fx.StartRecovery: "recovery_started",
    fx.AttemptRecovery: "attempt_recovery",
    fx.RecoveryFinished: "recovery_finished",
    fx.TransferEnded: "transfer_ended",
    fx.ScheduleTimer: "schedule_timer",
    fx.CancelTimer: "cancel_timer",
    fx.Reconcile: "reconcile",
    fx.SendToolRequest: "send_tool_request",
    fx.SettleUnsent: "settle_unsent",
    fx.CancelToolCalls: "cancel_tool_calls",
    fx.PersistOutstanding: "persist_outstanding",
    fx.Say: "say",
    fx.NotifyAgent: "notify_agent",
    fx.ReleaseMedia: "release_media",
    fx.HangUp: "hang_up",
    fx.Finished: "finished",
    fx.StaleEventIgnored: "stale_event_ignored",
}


class Recorder:
    """Records which action each effect reached (every EffectTarget method)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in _TARGET_METHODS:
            raise AttributeError(name)

        def record(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, args, kwargs))

        return record


_TARGET_METHODS = {
    name for name in vars(EffectTarget) if not name.startswith("_") and callable(
        getattr(EffectTarget, name)
    )
}


def _all_effect_classes() -> set[type[fx.Effect]]:
    found: set[type[fx.Effect]] = set()
    todo = [fx.Effect]
    while todo:
        for sub in todo.pop().__subclasses__():
            # dataclass(slots=True) replaces each class it decorates: keep the module's own.
            if getattr(fx, sub.__name__, None) is sub:
                found.add(sub)
            todo.append(sub)
    return found


def _example(cls: type[fx.Effect]) -> fx.Effect:
    values: dict[str, Any] = {}
    hints = typing.get_type_hints(cls, vars(fx))
    for field in dataclasses.fields(cls):
        hint = str(hints[field.name])
        if "tuple" in hint:
            values[field.name] = ("k1",)
        elif "int" in hint and "str" not in hint:
            values[field.name] = 1
        elif "float" in hint:
            values[field.name] = 1.0
        else:
            values[field.name] = "x"
    return cls(**values)


def test_every_effect_class_is_in_the_union_and_has_an_action() -> None:
    classes = _all_effect_classes()
    assert classes == set(typing.get_args(fx.AnyEffect)), "AnyEffect must list every effect"
    assert classes == set(EXPECTED_ACTION), "every effect needs an expected action here"
    assert set(EXPECTED_ACTION.values()) == _TARGET_METHODS


@pytest.mark.parametrize("cls", sorted(EXPECTED_ACTION, key=lambda c: c.kind), ids=str)
def test_each_effect_reaches_its_one_action(cls: type[fx.Effect]) -> None:
    target = Recorder()
    execute_one(typing.cast("fx.AnyEffect", _example(cls)), target)
    assert [name for name, _, _ in target.calls] == [EXPECTED_ACTION[cls]]


def test_an_effect_outside_the_union_is_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Unknown(fx.Effect):
        kind: typing.ClassVar[str] = "unknown"

    with pytest.raises(AssertionError):
        execute_one(typing.cast("fx.AnyEffect", Unknown()), Recorder())


def test_a_goodbye_in_the_same_step_is_heard_before_the_bye() -> None:
    target = Recorder()
    execute([fx.Say("goodbye"), fx.ReleaseMedia(), fx.HangUp("done")], target)
    assert target.calls == [
        ("say", ("goodbye",), {}),
        ("release_media", (), {}),
        ("hang_up", ("done",), {"after_prompt": True}),
    ]
    target = Recorder()
    execute([fx.HangUp("done")], target)
    assert target.calls == [("hang_up", ("done",), {"after_prompt": False})]
