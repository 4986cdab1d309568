"""The words a session's log, store and API share, each defined once.

Every enum is str-valued (``enum.StrEnum``): a member equals, hashes and serializes (JSON, SQLite)
as its value, so logs and stores written before these types existed read the same, and code
outside ``session/`` that still compares plain strings keeps working. The values are stable
names in stored logs: rename one and old logs stop meaning what they said; add new names instead.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class Terminal(enum.StrEnum):
    """Where a session ends: exactly one of these, and it never leaves it (seed 000)."""

    COMPLETED = "completed"
    CANCELED = "canceled"
    TIMED_OUT = "timed_out"
    FAILED = "failed"  # with the stage that failed (EndingStage)
    NEEDS_HUMAN = "needs_human"


TERMINAL_STATES: Final = tuple(t.value for t in Terminal)


class EndingStage(enum.StrEnum):
    """Where a session that did not simply end was when it ended: ``Ending.stage``."""

    SIGNALING = "signaling"  # the dialog failed (PJSIP ended it, or a probe found it gone)
    SESSION_TIMER = "session_timer"  # RFC 4028
    RECOVERY = "recovery"  # the recovery's deadline passed
    NO_INPUT = "no_input"
    MAX_DURATION = "max_duration"
    RECONCILIATION = "reconciliation"  # a receipt came back unknown
    HANGUP = "hangup"  # someone hung up with outcomes unknown
    TRANSFER = "transfer"  # transferred with outcomes unknown
    OPERATOR = "operator"
    AGENT = "agent"  # the agent failed (an exception in an in-process agent)
    AGENT_LINK = "agent_link"  # a remote agent's link stayed down past its reconnect deadline
    PROCESS = "process"  # the process serving it died (the reaper)
    RINGING = "ringing"  # an outbound leg nobody answered in time (session.legs)


class Outcome(enum.StrEnum):
    """A tool call's receipt (ARCHITECTURE.md "Side effects"; seed 000's reconciliation table)."""

    COMMITTED = "committed"
    FAILED = "failed"  # the provider refused: it did not do it
    NOT_STARTED = "not_started"  # confirmed never started: a new intent may follow, no replay
    UNKNOWN = "unknown"  # never assumed: the session goes to needs_human


RECEIPT_OUTCOMES: Final = tuple(o.value for o in Outcome)
# The outcomes that settle an intent; ``unknown`` settles nothing.
DEFINITIVE: Final = (Outcome.COMMITTED, Outcome.FAILED, Outcome.NOT_STARTED)


class IntentKind(enum.StrEnum):
    READ = "read"  # allowed while the gate is frozen or reconciling
    WRITE = "write"  # only through an open gate


INTENT_KINDS: Final = tuple(k.value for k in IntentKind)


class IntentStage(enum.StrEnum):
    """How far an outstanding tool intent got (``Outstanding.stage``; session/ledger.py).

    An intent that ends (its receipt is recorded) leaves the session's outstanding intents:
    "receipted" is not a stage of the state, it is the ``tool_receipt`` event."""

    INTENDED = "intended"  # admitted and persisted; its request not sent yet (it will be)
    HELD = "held"  # admitted while the gate was open, unsent when it froze: sent when it reopens
    SENT = "sent"  # on the wire: cancelled, never resent, when the session is cut
    UNKNOWN = "unknown"  # its receipt came back unknown


class Interruption(enum.StrEnum):
    """What freezes the gate and cuts the response (seed 001's separate dimensions). A transfer
    does too, but it is its own phase (session.transfer), never a recovery: ``RECOVERABLE`` are
    what a recovery recovers from, and what its metrics and alert count."""

    MEDIA = "media"
    REINVITE = "reinvite"
    TRANSFER = "transfer"
    AGENT_LINK = "agent_link"


RECOVERABLE = (Interruption.MEDIA, Interruption.REINVITE, Interruption.AGENT_LINK)


class TransferStage(enum.StrEnum):
    """Where a transfer under way is (``Transfer.stage``, shown in the session's status)."""

    CALLING = "calling"  # our leg to the target rings: a bridge's, or an attended consult leg
    CONSULTING = "consulting"  # attended: the person answered; the REFER has not gone yet
    REFERRING = "referring"  # blind: the REFER is out, not yet accepted
    REFERRED = "referred"  # the REFER was accepted: its NOTIFYs report the target's progress


class TransferOutcome(enum.StrEnum):
    """How a transfer phase ended (``TransferEnded.outcome``, the label of
    ``voicegate_transfer_duration_seconds``)."""

    COMPLETED = "completed"  # the caller is with the target (final 2xx NOTIFY, or bridged)
    REFUSED = "refused"  # the REFER, or the target's leg (503), refused before it ran
    FAILED = "failed"  # the target's side failed (a final NOTIFY 3xx-6xx, busy, no answer)
    DECLINED = "declined"  # attended: the person declined (603)
    CANCELED = "canceled"  # attended: called off before the hand-over (487)
    TIMED_OUT = "timed_out"  # the guard (transfer.notify_timeout_s) fired first
    CALLER_LEFT = "caller_left"  # the caller hung up while it ran
    ENDED = "ended"  # the session ended otherwise (an operator, the agent, the process)


class RecoveryOutcome(enum.StrEnum):
    """How a recovery ended (``RecoveryFinished.outcome``)."""

    RECOVERED = "recovered"
    TIMED_OUT = "timed_out"
    CANCELED = "canceled"  # the caller left, or the session ended otherwise
    FAILED = "failed"  # the dialog or the owner is gone


class LegOutcome(enum.StrEnum):
    """How an outbound leg (session.legs) turned out: counted in
    ``voicegate_outbound_calls_total{outcome}``."""

    ANSWERED = "answered"
    NO_ANSWER = "no_answer"  # rang past its ring timeout, or the callee said 480
    BUSY = "busy"  # 486, 600
    DECLINED = "declined"  # 603
    FAILED = "failed"  # any other final answer, or the call never left (no free slot)
    CANCELED = "canceled"  # we gave it up before an answer (an operator, a shutdown)


LEG_OUTCOMES: Final = tuple(o.value for o in LegOutcome)


class SpeechDecision(enum.StrEnum):
    """What an agent did with an utterance (events.CallerSaid): acted on it, took it as the
    caller's confirmation of a write (the approval), asked again because the recogniser rejected
    it or it made no sense in the dialog state, or offered the keypad instead."""

    ACCEPTED = "accepted"
    CONFIRMED = "confirmed"
    REJECTED = "rejected"
    REPROMPTED = "reprompted"
    KEYPAD_OFFERED = "keypad_offered"


SPEECH_DECISIONS: Final = tuple(d.value for d in SpeechDecision)


class BadOwnerId(ValueError):
    """Text that is not ``<worker>/<incarnation>``."""


@dataclass(frozen=True, slots=True)
class OwnerId:
    """Who serves a session: ``<worker>/<incarnation>``, as the store's lease and summary keep it.

    ``worker`` is the configured name (``session.worker_name``, no ``/``); ``incarnation`` is new
    at every start of the process, so a worker's predecessors are the owners with its worker and
    another incarnation.
    """

    worker: str
    incarnation: str

    def __post_init__(self) -> None:
        for part, value in (("worker", self.worker), ("incarnation", self.incarnation)):
            if not value or "/" in value:
                raise BadOwnerId(f"owner {part} {value!r} must be non-empty, without '/'")

    @classmethod
    def parse(cls, text: str) -> OwnerId:
        """Read an owner id; raises :class:`BadOwnerId` unless it is exactly ``a/b``."""
        worker, slash, incarnation = text.partition("/")
        if not slash:
            raise BadOwnerId(f"owner {text!r} is not <worker>/<incarnation>")
        return cls(worker, incarnation)

    def format(self) -> str:
        """The stored form, ``<worker>/<incarnation>``."""
        return f"{self.worker}/{self.incarnation}"

    def __str__(self) -> str:
        return self.format()

    @staticmethod
    def prefix(worker: str) -> str:
        """What every owner id of ``worker`` starts with (the store's ``owner_prefix``)."""
        return f"{worker}/"

    @staticmethod
    def worker_of(text: str) -> str:
        """The worker of a stored owner id; raises :class:`BadOwnerId` for anything else."""
        return OwnerId.parse(text).worker
