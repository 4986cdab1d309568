"""A session's state: its separate dimensions (seed 001), and a one-line status derived from them.

There is deliberately no single ``connected`` flag: signaling, media, the agent link and the
side-effect gate fail and recover independently, and the status line is computed from all of them.
The state is a frozen value; the machine returns a new one for every event that changes anything.
``to_dict``/``from_dict`` give the checkpoint form (seed 000: version, last event, active
turn/response, playback generation, outstanding intents with digests, approvals, deadlines and the
acceptable terminal states).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from session.vocabulary import (
    TERMINAL_STATES,
    EndingStage,
    IntentKind,
    IntentStage,
    Interruption,
    Terminal,
    TransferStage,
)


class Signaling(enum.StrEnum):
    NONE = "none"
    OFFERED = "offered"
    UP = "up"
    REINVITE_PENDING = "reinvite_pending"
    TRANSFERRING = "transferring"
    BRIDGED = "bridged"  # a bridged transfer: the caller talks to the target through us
    # Transferred out (blind or attended) and our leg hung up, but the caller may come back with
    # the session's resume handle until ``away_until`` (session.away): not terminal yet.
    AWAY = "away"
    # The media was lost for good (not a BYE from the caller) and our leg hung up, but the caller
    # may call back from the same number until ``dropped_until`` (session.callback): not terminal.
    DROPPED = "dropped"
    GONE = "gone"


class Media(enum.StrEnum):
    NONE = "none"
    FLOWING = "flowing"
    INTERRUPTED = "interrupted"
    RELEASED = "released"


class AgentLink(enum.StrEnum):
    CONNECTED = "connected"
    LOST = "lost"
    CLOSED = "closed"


class Gate(enum.StrEnum):
    OPEN = "open"
    FROZEN = "frozen"
    RECONCILING = "reconciling"
    CLOSED = "closed"


# The start of status() for a session that is away: the reaper finds them by it (session.reaper).
AWAY_STATUS = f"signaling {Signaling.AWAY.value}"
# ... and for a session dropped that may be called back (session.callback).
DROPPED_STATUS = f"signaling {Signaling.DROPPED.value}"

# Terminal and TERMINAL_STATES live in session.vocabulary; imported here for the importers of
# session.state (voicegate/control/http_api.py imports TERMINAL_STATES from here).
__all__ = [
    "AWAY_STATUS",
    "DROPPED_STATUS",
    "TERMINAL_STATES",
    "AgentLink",
    "Deadline",
    "Ending",
    "Gate",
    "Media",
    "Outstanding",
    "Policy",
    "Recovery",
    "Response",
    "SessionState",
    "Signaling",
    "Terminal",
    "Transfer",
    "Turn",
]


@dataclass(frozen=True, slots=True)
class Policy:
    """The deadlines and retry budget of one session, fixed when it is offered."""

    recovery_timeout_s: float = 20.0
    honesty_after_s: float = 2.0
    max_duration_s: float = 3600.0
    no_input_s: float = 0.0  # 0: no no-input deadline
    no_input_grace_s: float = 10.0
    retry_base_s: float = 0.25
    retry_cap_s: float = 4.0
    retry_max_attempts: int = 8
    # Our guard on a blind transfer's final NOTIFY (pjsua's own subscription waits 600 s).
    transfer_timeout_s: float = 60.0
    # How long a resume handle lives (session.resume_ttl_s), so how long a caller transferred out
    # may come back (session.away). 0, as in logs from before rejoin existed: a transfer that
    # succeeds ends the session at once.
    resume_ttl_s: float = 0.0
    # How long a caller whose media was lost for good may call back (session.callback_window_s,
    # session.callback). 0, as in logs from before callbacks existed: the session ends at once.
    callback_window_s: float = 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True, slots=True)
class Outstanding:
    """A tool intent without a final receipt."""

    key: str
    tool: str
    kind: IntentKind
    digest: str
    turn_id: str
    stage: IntentStage = IntentStage.INTENDED
    # The request's arguments as the intent event logged them: a restart reconciles (and an
    # operator reads) the real request, not a copy that lived only in memory.
    arguments: Mapping[str, Any] = field(default_factory=dict)
    # Session time until which the caller's approval holds (None: the tool needs none, or the
    # intent predates the setting): a held intent is sent after it only if it is still valid.
    valid_until: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.valid_until is None:
            del data["valid_until"]  # as intents were stored before approvals could lapse
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outstanding:
        return cls(
            **{
                **data,
                "kind": IntentKind(data["kind"]),
                "stage": IntentStage(data["stage"]),
            }
        )


# The names of a recovery's own deadlines (session.deadlines.RECOVERY_TIMERS; that module
# imports this one): what an old checkpoint's transfer-as-a-recovery leaves behind.
_RECOVERY_DEADLINES = ("recovery", "honesty", "recovery_retry")


@dataclass(frozen=True, slots=True)
class Deadline:
    due: float
    generation: int


@dataclass(frozen=True, slots=True)
class Recovery:
    """The one recovery attempt that currently owns the session (seed 001)."""

    generation: int
    interruptions: tuple[Interruption, ...]
    started_at: float
    deadline: float
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class Transfer:
    """The transfer under way (session.transfer): its own phase, not a recovery. ``generation``
    is drawn from the counter recoveries use, so the events of a transfer carry a number no
    recovery of the session ever had, as they did when a transfer ran as one."""

    generation: int
    mode: str  # blind, bridge (also a blind one fallen back) or attended
    started_at: float
    stage: TransferStage


@dataclass(frozen=True, slots=True)
class Turn:
    turn_id: str
    committed: bool = False


@dataclass(frozen=True, slots=True)
class Response:
    response_id: str
    turn_id: str
    generation: int


@dataclass(frozen=True, slots=True)
class Ending:
    terminal_state: Terminal
    reason: str
    stage: EndingStage | None
    at: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ending:
        stage = data["stage"]
        return cls(
            Terminal(data["terminal_state"]),
            data["reason"],
            None if stage is None else EndingStage(stage),
            data["at"],
        )


@dataclass(frozen=True, slots=True)
class SessionState:
    session_id: str
    version: int = 0  # seq of the last event folded in
    policy: Policy = field(default_factory=Policy)
    signaling: Signaling = Signaling.NONE
    media: Media = Media.NONE
    media_since: float | None = None
    agent_link: AgentLink = AgentLink.CONNECTED
    gate: Gate = Gate.OPEN
    gate_since: float | None = None
    turn: Turn | None = None
    response: Response | None = None
    playback_generation: int = 0
    recovery: Recovery | None = None
    # The last generation a recovery or a transfer took (events name theirs by it).
    recovery_generation: int = 0
    transfer: Transfer | None = None
    outstanding: tuple[Outstanding, ...] = ()
    approvals: tuple[str, ...] = ()
    deadlines: Mapping[str, Deadline] = field(default_factory=dict)
    answered_at: float | None = None
    ended: Ending | None = None
    # The last transfer: its target and the last sipfrag status its NOTIFYs reported (0: none).
    transfer_target: str = ""
    transfer_status: int = 0
    # Away (session.away): until when the caller may come back; and how many times a caller has
    # rejoined this session (its signaling generation: each rejoin is a new dialog).
    away_until: float | None = None
    signaling_generation: int = 0
    # Dropped (session.callback): until when the caller may call back, and the ending it gets
    # if nobody does (the one it would have had at once before callbacks).
    dropped_until: float | None = None
    dropped_reason: str = ""
    # ... and the stage of that ending: "" for media lost (timed_out at stage recovery),
    # "process" for a caller cut off by its process's death (failed at stage process).
    dropped_stage: str = ""
    # The keyed digest of the short resume code the caller was read when a write started
    # (voicegate/call/callback_codes.py); "" while none was issued. Never the code itself.
    resume_code: str = ""

    # --- derived ---------------------------------------------------------------------------------

    @property
    def terminal(self) -> bool:
        return self.ended is not None

    def outstanding_keys(self) -> tuple[str, ...]:
        return tuple(o.key for o in self.outstanding)

    def acceptable_terminal_states(self) -> tuple[str, ...]:
        """Where this session may still end; ``completed``/``canceled`` need nothing unknown."""
        if self.ended is not None:
            return (self.ended.terminal_state,)
        if self.outstanding:
            return (Terminal.TIMED_OUT.value, Terminal.FAILED.value, Terminal.NEEDS_HUMAN.value)
        return TERMINAL_STATES

    def transfer_summary(self) -> str:
        """``transferring (attended, consulting)``: what a desk's screen shows (never
        "recovering": a transfer is not a fault); "" without a transfer under way."""
        transfer = self.transfer
        if transfer is None:
            return ""
        what = ", ".join(part for part in (transfer.mode, transfer.stage.value) if part)
        return f"transferring ({what})" if what else "transferring"

    def status(self) -> str:
        """One line for people: every dimension, never one ``connected`` flag."""
        if self.ended is not None:
            stage = f" at {self.ended.stage}" if self.ended.stage else ""
            return f"{self.ended.terminal_state}{stage}: {self.ended.reason}"
        parts = [
            f"signaling {self.signaling.value}",
            f"media {self.media.value}",
            f"agent {self.agent_link.value}",
            f"gate {self.gate.value}",
        ]
        if self.recovery is not None:
            parts.append(
                f"recovering {'+'.join(self.recovery.interruptions)} "
                f"(generation {self.recovery.generation})"
            )
        if self.transfer is not None:
            parts.append(self.transfer_summary())
        if self.response is not None:
            parts.append(f"speaking {self.response.response_id}")
        elif self.turn is not None:
            parts.append(f"turn {self.turn.turn_id}")
        if self.outstanding:
            parts.append(f"{len(self.outstanding)} tool call(s) outstanding")
        return ", ".join(parts)

    # --- checkpoint form -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["acceptable_terminal_states"] = list(self.acceptable_terminal_states())
        data["outstanding"] = [o.to_dict() for o in self.outstanding]
        data["deadlines"] = {k: dataclasses.asdict(v) for k, v in sorted(self.deadlines.items())}
        if not self.dropped_stage:
            del data["dropped_stage"]  # checkpoints and histories from before parking
        if self.transfer is None:
            del data["transfer"]  # ... and from before a transfer was its own phase
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionState:
        def opt(kind: Any, value: Any) -> Any:
            return None if value is None else kind(**value)

        recovery = data.get("recovery")
        transfer = data.get("transfer")
        deadlines = data["deadlines"]
        if recovery is not None and Interruption.TRANSFER in recovery["interruptions"]:
            # A checkpoint from when a transfer ran as a recovery: its phase, as far as the
            # checkpoint tells (not its mode), as a live transfer has it: no recovery and none
            # of a recovery's timers (what else broke is in its dimension, and is recovered if
            # the caller comes back), the guard kept.
            generation = recovery["generation"]
            transfer = {
                "generation": generation,
                "mode": "",
                "started_at": recovery["started_at"],
                "stage": TransferStage.REFERRING,
            }
            recovery = None
            deadlines = {
                name: due
                for name, due in deadlines.items()
                if name not in _RECOVERY_DEADLINES or due["generation"] != generation
            }
        return cls(
            session_id=data["session_id"],
            version=data["version"],
            policy=Policy.from_dict(data["policy"]),
            signaling=Signaling(data["signaling"]),
            media=Media(data["media"]),
            media_since=data["media_since"],
            agent_link=AgentLink(data["agent_link"]),
            gate=Gate(data["gate"]),
            gate_since=data["gate_since"],
            turn=opt(Turn, data["turn"]),
            response=opt(Response, data["response"]),
            playback_generation=data["playback_generation"],
            recovery=None
            if recovery is None
            else Recovery(
                **{**recovery, "interruptions": tuple(map(Interruption, recovery["interruptions"]))}
            ),
            recovery_generation=data["recovery_generation"],
            transfer=None
            if transfer is None
            else Transfer(**{**transfer, "stage": TransferStage(transfer["stage"])}),
            outstanding=tuple(Outstanding.from_dict(o) for o in data["outstanding"]),
            approvals=tuple(data["approvals"]),
            deadlines={k: Deadline(**v) for k, v in deadlines.items()},
            answered_at=data["answered_at"],
            ended=None if data["ended"] is None else Ending.from_dict(data["ended"]),
            # Checkpoints written before transfers existed have neither.
            transfer_target=data.get("transfer_target", ""),
            transfer_status=data.get("transfer_status", 0),
            # ... and checkpoints from before rejoin neither of these.
            away_until=data.get("away_until"),
            signaling_generation=data.get("signaling_generation", 0),
            # ... and checkpoints from before callbacks none of these.
            dropped_until=data.get("dropped_until"),
            dropped_reason=data.get("dropped_reason", ""),
            dropped_stage=data.get("dropped_stage", ""),
            resume_code=data.get("resume_code", ""),
        )
