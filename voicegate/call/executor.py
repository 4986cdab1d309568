"""The interpreter of the session machine's effects: each effect type has exactly one executor.

The machine decides; this module only says which action of the call carries each decision out.
The match is exhaustive over :data:`session.effects.AnyEffect` (``typing.assert_never``): a new
effect type with no executor fails mypy, and tests/unit/test_effect_executor.py fails when an
effect class is missing from the union. Effects run in the order the machine emitted them; those
that reach outside the process only once their step is durable (:data:`IN_PROCESS` says which
need not wait, voicegate/call/acting.py does the waiting).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, assert_never, cast

from session import effects as fx


class EffectTarget(Protocol):
    """The actions of one live call that effects map onto (voicegate/call/actions.py)."""

    def clear_playout(self, generation: int) -> None: ...

    def cancel_response(self, response_id: str) -> None: ...

    def bind_response(self, response_id: str, generation: int) -> None: ...

    def stop_generation(self) -> None: ...

    def gate_changed(self, old: str, new: str) -> None: ...

    def recovery_started(self, generation: int, interruption: str, deadline: float) -> None: ...

    def attempt_recovery(
        self, generation: int, attempt: int, interruptions: tuple[str, ...]
    ) -> None: ...

    def recovery_finished(self, generation: int, outcome: str) -> None: ...

    def transfer_ended(
        self, generation: int, mode: str, outcome: str, duration_s: float
    ) -> None: ...

    def schedule_timer(self, name: str, due: float, generation: int, attempt: int) -> None: ...

    def cancel_timer(self, name: str) -> None: ...

    def reconcile(self, keys: tuple[str, ...]) -> None: ...

    def send_tool_request(self, key: str) -> None: ...

    def settle_unsent(self, key: str, reason: str) -> None: ...

    def cancel_tool_calls(self, keys: tuple[str, ...]) -> None: ...

    def persist_outstanding(self, keys: tuple[str, ...]) -> None: ...

    def say(self, prompt: str) -> None: ...

    def notify_agent(self, what: str, detail: str) -> None: ...

    def release_media(self) -> None: ...

    def hang_up(self, reason: str, *, after_prompt: bool) -> None: ...

    def finished(self, terminal_state: str, reason: str, stage: str | None) -> None: ...

    def stale_event_ignored(self, event_type: str, why: str) -> None: ...


# Effects that change only this process's memory: the playout, the agent's response handle,
# timers, in-flight HTTP work and log lines. A crash takes them with it and nobody outside saw
# them, so they run at once (the frame path never waits for the disk). Every other effect reaches
# the caller, the agent, a provider or the SIP peer, and runs only once its step is durable.
IN_PROCESS: tuple[type[fx.Effect], ...] = (
    fx.ClearPlayout,
    fx.CancelResponse,
    fx.BindResponse,
    fx.GateChanged,
    fx.StartRecovery,
    fx.RecoveryFinished,
    fx.ScheduleTimer,
    fx.CancelTimer,
    fx.CancelToolCalls,
    fx.Finished,
    fx.StaleEventIgnored,
)


def split_in_process(effects: Sequence[fx.Effect]) -> tuple[list[fx.Effect], list[fx.Effect]]:
    """``effects`` as (in-process ones, to run now; the rest, to run once durable), in order."""
    now = [effect for effect in effects if isinstance(effect, IN_PROCESS)]
    later = [effect for effect in effects if not isinstance(effect, IN_PROCESS)]
    return now, later


def execute(effects: Sequence[fx.Effect], target: EffectTarget) -> None:
    """Carry out ``effects`` in order. A step that says something and hangs up (``Say`` then
    ``HangUp``) lets the caller hear it first."""
    said = any(isinstance(effect, fx.Say) for effect in effects)
    for effect in effects:
        execute_one(cast("fx.AnyEffect", effect), target, said=said)


def execute_one(
    effect: fx.AnyEffect, target: EffectTarget, *, said: bool = False
) -> None:
    match effect:
        case fx.ClearPlayout(generation=generation):
            target.clear_playout(generation)
        case fx.CancelResponse(response_id=response_id):
            target.cancel_response(response_id)
        case fx.BindResponse(response_id=response_id, generation=generation):
            target.bind_response(response_id, generation)
        case fx.StopGeneration():
            target.stop_generation()
        case fx.GateChanged(old=old, new=new):
            target.gate_changed(old, new)
        case fx.StartRecovery(generation=generation, interruption=kind, deadline=deadline):
            target.recovery_started(generation, kind, deadline)
        case fx.AttemptRecovery(generation=generation, attempt=attempt, interruptions=kinds):
            target.attempt_recovery(generation, attempt, kinds)
        case fx.RecoveryFinished(generation=generation, outcome=outcome):
            target.recovery_finished(generation, outcome)
        case fx.TransferEnded(generation=generation, mode=mode, outcome=outcome, duration_s=d):
            target.transfer_ended(generation, mode, outcome, d)
        case fx.ScheduleTimer(name=name, due=due, generation=generation, attempt=attempt):
            target.schedule_timer(name, due, generation, attempt)
        case fx.CancelTimer(name=name):
            target.cancel_timer(name)
        case fx.Reconcile(keys=keys):
            target.reconcile(keys)
        case fx.SendToolRequest(key=key):
            target.send_tool_request(key)
        case fx.SettleUnsent(key=key, reason=reason):
            target.settle_unsent(key, reason)
        case fx.CancelToolCalls(keys=keys):
            target.cancel_tool_calls(keys)
        case fx.PersistOutstanding(keys=keys):
            target.persist_outstanding(keys)
        case fx.Say(prompt=prompt):
            target.say(prompt)
        case fx.NotifyAgent(what=what, detail=detail):
            target.notify_agent(what, detail)
        case fx.ReleaseMedia():
            target.release_media()
        case fx.HangUp(reason=reason):
            target.hang_up(reason, after_prompt=said)
        case fx.Finished(terminal_state=terminal_state, reason=reason, stage=stage):
            target.finished(terminal_state, reason, stage)
        case fx.StaleEventIgnored(event_type=event_type, why=why):
            target.stale_event_ignored(event_type, why)
        case _:
            assert_never(effect)
