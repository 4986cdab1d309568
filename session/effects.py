"""What the state machine asks the runtime to do. The runtime executes each, in order, after the
event that produced them is durable, and the store keeps them beside the event.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class Effect:
    kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True, slots=True)
class ClearPlayout(Effect):
    """Drop all queued audio; only chunks of ``generation`` may play from now on."""

    kind: ClassVar[str] = "clear_playout"
    generation: int


@dataclass(frozen=True, slots=True)
class CancelResponse(Effect):
    """The response ``response_id`` was cut: the call forgets it, so nothing more of it plays."""

    kind: ClassVar[str] = "cancel_response"
    response_id: str


@dataclass(frozen=True, slots=True)
class BindResponse(Effect):
    """The response's chunks belong to playback ``generation``."""

    kind: ClassVar[str] = "bind_response"
    response_id: str
    generation: int


@dataclass(frozen=True, slots=True)
class StopGeneration(Effect):
    """Tell the agent to stop producing output (a response, a turn in progress)."""

    kind: ClassVar[str] = "stop_generation"


@dataclass(frozen=True, slots=True)
class GateChanged(Effect):
    """The side-effect gate moved from ``old`` to ``new``; the agent is told. ``frozen_s``: how long
    it was held (frozen, then reconciling) when it opens or closes, else 0."""

    kind: ClassVar[str] = "gate_changed"
    old: str
    new: str
    frozen_s: float


@dataclass(frozen=True, slots=True)
class StartRecovery(Effect):
    """A recovery of ``generation`` began, for ``interruption``; it must be over by ``deadline``."""

    kind: ClassVar[str] = "start_recovery"
    generation: int
    interruption: str
    deadline: float


@dataclass(frozen=True, slots=True)
class AttemptRecovery(Effect):
    """The recovery's attempt ``attempt``: for a media gap, an in-dialog OPTIONS whose answer comes
    back as ``RecoveryProbed`` (a re-INVITE answers for itself)."""

    kind: ClassVar[str] = "attempt_recovery"
    generation: int
    attempt: int
    interruptions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecoveryFinished(Effect):
    """``outcome``: a :class:`~session.vocabulary.RecoveryOutcome`."""

    kind: ClassVar[str] = "recovery_finished"
    generation: int
    interruptions: tuple[str, ...]
    outcome: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class TransferEnded(Effect):
    """The transfer phase of ``generation`` (session.transfer) is over after ``duration_s``:
    the caller is with the target, back with the agent, or gone. ``outcome``: a
    :class:`~session.vocabulary.TransferOutcome`. Not a recovery: counted in
    ``voicegate_transfer_duration_seconds``, never in the recovery metrics."""

    kind: ClassVar[str] = "transfer_ended"
    generation: int
    mode: str
    outcome: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class ScheduleTimer(Effect):
    """Feed ``DeadlineFired(name, generation)`` (or a retry) at ``due``; replaces its namesake."""

    kind: ClassVar[str] = "schedule_timer"
    name: str
    due: float
    generation: int
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class CancelTimer(Effect):
    """Cancel the timer ``name``; a ``DeadlineFired`` of it that still comes is stale."""

    kind: ClassVar[str] = "cancel_timer"
    name: str


@dataclass(frozen=True, slots=True)
class Reconcile(Effect):
    """Ask each tool provider's status endpoint about these idempotency keys."""

    kind: ClassVar[str] = "reconcile"
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SendToolRequest(Effect):
    """Send the request of intent ``key`` (its ``ToolRequestSent`` first), once; a held intent
    waits for the gate to reopen."""

    kind: ClassVar[str] = "send_tool_request"
    key: str


@dataclass(frozen=True, slots=True)
class SettleUnsent(Effect):
    """Record that the intent ``key`` was never sent (a ``not_started`` receipt saying
    ``reason``), then feed the session that receipt: it is known unsent, so no provider is
    asked about it (session/ledger.py)."""

    kind: ClassVar[str] = "settle_unsent"
    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class CancelToolCalls(Effect):
    """Abandon in-flight tool requests; their intents stay outstanding for reconciliation."""

    kind: ClassVar[str] = "cancel_tool_calls"
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PersistOutstanding(Effect):
    """Make sure these intents are durable and listed for reconciliation (never assumed)."""

    kind: ClassVar[str] = "persist_outstanding"
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Say(Effect):
    """Play a short prompt that tells the caller what is known (and what is not)."""

    kind: ClassVar[str] = "say"
    prompt: str


@dataclass(frozen=True, slots=True)
class NotifyAgent(Effect):
    """Tell the agent ``what`` happened (``interrupted``, ``resumed``, ``tool_receipt``, ...), with
    ``detail``."""

    kind: ClassVar[str] = "notify_agent"
    what: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ReleaseMedia(Effect):
    """Take no more caller audio to the agent and no more agent audio; what the session itself
    queued (a goodbye) still plays before the BYE."""

    kind: ClassVar[str] = "release_media"


@dataclass(frozen=True, slots=True)
class HangUp(Effect):
    """Hang the call up (a BYE, or the end of a call still ringing), ``reason`` saying why, once
    the prompt a ``Say`` of the same step queued has played."""

    kind: ClassVar[str] = "hang_up"
    reason: str


@dataclass(frozen=True, slots=True)
class Finished(Effect):
    """The session ended ``terminal_state`` (``reason``, at ``stage``) and never leaves it."""

    kind: ClassVar[str] = "finished"
    terminal_state: str
    reason: str
    stage: str | None


@dataclass(frozen=True, slots=True)
class StaleEventIgnored(Effect):
    """A late event of an older generation, or for a finished response: dropped and counted."""

    kind: ClassVar[str] = "stale_event_ignored"
    event_type: str
    why: str


# What a transition returns beside the new state: the effects, in the order to execute them.
# Helpers append to the caller's list, so one step's effects keep the order they were decided in.
Effects = list[Effect]


# Every effect type, for exhaustive matches (``typing.assert_never``): an effect added above and
# not here fails tests/unit/test_effect_executor.py; one added here and not carried out fails mypy.
AnyEffect = (
    ClearPlayout
    | CancelResponse
    | BindResponse
    | StopGeneration
    | GateChanged
    | StartRecovery
    | AttemptRecovery
    | RecoveryFinished
    | TransferEnded
    | ScheduleTimer
    | CancelTimer
    | Reconcile
    | SendToolRequest
    | SettleUnsent
    | CancelToolCalls
    | PersistOutstanding
    | Say
    | NotifyAgent
    | ReleaseMedia
    | HangUp
    | Finished
    | StaleEventIgnored
)
