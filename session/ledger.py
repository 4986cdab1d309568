"""The side-effect rules, in one place (seed 000; ARCHITECTURE.md "Side effects"). Sans-IO.

A tool call that changes the world (a charge, a booking) goes through these stages, each durable
before the next is acted on, and each named so in the session log (``Outstanding.stage``):

    admitted (``intended``) -> [held] -> ``sent`` -> receipted (the ``tool_receipt`` event)

- **admitted**: :func:`admit` accepted the agent's ask (key, digest, no reuse, approval) and
  the ``tool_intent`` event is logged with its arguments; its request goes next.
- **held**: it was admitted while the gate was open, and the gate froze (media lost, the
  agent's link dropped, a re-INVITE...) before its request left. It is known unsent: nobody asks
  a provider about it. When reconciliation reopens the gate it is sent, once, with its key, if
  its approval still holds (:func:`release`), or it ends ``not_started`` with the reason
  :data:`APPROVAL_EXPIRED`: the agent gets that result, and says so to the caller (the demo
  agents play ``payment_not_started``).
- **sent**: ``tool_request_sent`` is logged, then the request leaves. From here on only the
  provider knows: a cut session asks its status endpoint by key (:func:`to_query`), never sends
  it again. But an interruption that stops the request before its HTTP began (it was logged
  sent, not yet durable-then-sent) logs ``tool_request_withheld``: it is held again, known
  unsent, rather than asked about (asking would fence a key nobody used).
- **receipted**: the receipt row is durable, then ``tool_receipt`` is folded in. What each
  receipt means is :data:`RECONCILIATION`, seed 000's table as a table.

An intent whose log says it never got past ``intended`` or ``held`` was never sent (the request
leaves only after ``tool_request_sent`` is durable), so a restart settles it ``not_started``
without a status query either (:func:`settle_plan`).

The classification of a provider's answer into an outcome (:func:`classify_request`,
:func:`classify_status`) is here too: voicegate/tools/ only moves bytes and rows.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from session import effects as fx
from session.state import Outstanding
from session.vocabulary import DEFINITIVE, EndingStage, IntentKind, IntentStage, Outcome, Terminal

APPROVAL_EXPIRED: Final = "approval expired while the call was interrupted"
NEVER_SENT: Final = "never sent: the call ended before its request could leave"

# --- admission ------------------------------------------------------------------------------------


def intent_digest(tool: str, arguments: Mapping[str, Any], session_id: str, turn_id: str) -> str:
    """sha256 of the canonical intent: the same ask in the same turn of a session is the same."""
    canonical = json.dumps(
        {"tool": tool, "arguments": arguments, "session": session_id, "turn": turn_id},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def intent_key(session_id: str, digest: str) -> str:
    """The idempotency key voicegate gives an ask that brings none of its own."""
    return f"vg-{session_id[:12]}-{digest[:24]}"


class Approval(enum.StrEnum):
    """What a write tool needs from the caller before it runs (``tools.<name>.approval``)."""

    NONE = "none"
    DTMF = "dtmf"  # a key press, asked while that key press is handled
    CALLER = "caller"  # a key press, or a spoken yes the session logged (caller_said confirmed)


@dataclass(frozen=True, slots=True)
class ToolRule:
    """What the ledger needs of a configured tool."""

    name: str
    kind: IntentKind
    approval: Approval = Approval.NONE
    approval_valid_s: float = 300.0


@dataclass(frozen=True, slots=True)
class Ask:
    """An agent's request for a tool, as the call saw it."""

    tool: str
    arguments: Mapping[str, Any]
    session_id: str
    turn_id: str
    key: str | None = None  # the agent's own idempotency key, if it brought one
    key_pressed: bool = False  # asked while the caller's key press was being handled
    spoken_yes: bool = False  # asked right after the caller's spoken confirmation was logged


@dataclass(frozen=True, slots=True)
class Known:
    """What is on record for a key: its intent's session and digest (None: not known, as for
    what a rejoin read back; the same key is then the same ask), and its definitive receipt's
    outcome and detail (None: no receipt yet, or only ``unknown``)."""

    session_id: str
    digest: str | None
    outcome: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Admitted:
    key: str
    digest: str
    needs_approval: bool
    approval_id: str  # logged as approval_given when needs_approval
    approval_valid_s: float | None  # how long a held write may still be sent (None: a read)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The same ask again: the original outcome (``pending`` while there is none), nothing sent."""

    key: str
    outcome: str
    detail: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Refused:
    key: str
    reason: str


Verdict = Admitted | Duplicate | Refused


def admit(ask: Ask, rule: ToolRule | None, known: Known | None) -> Verdict:
    """Whether ``ask`` may become an intent. ``known``: what the store, or the session's own
    outstanding intents, hold for its key. The gate is the machine's to check: a write asked
    while it is not open is refused there (``tool_intent`` needs an open gate)."""
    digest = intent_digest(ask.tool, ask.arguments, ask.session_id, ask.turn_id)
    key = ask.key or intent_key(ask.session_id, digest)
    if rule is None:
        return Refused(key, f"no tool named {ask.tool!r} is configured")
    if known is not None:
        if known.session_id != ask.session_id or known.digest not in (None, digest):
            return Refused(key, "this key was used for a different request")
        outcome = known.outcome if known.outcome in DEFINITIVE else "pending"
        return Duplicate(key, outcome or "pending", dict(known.detail))
    needs_approval = rule.kind is IntentKind.WRITE and rule.approval is not Approval.NONE
    approved = ask.key_pressed or (ask.spoken_yes and rule.approval is Approval.CALLER)
    if needs_approval and not approved:
        how = "by key press" if rule.approval is Approval.DTMF else "by key press or by voice"
        return Refused(key, f"the caller has not confirmed it {how}")
    # A write's authority (the caller's yes, or the agent's ask with none needed) holds for
    # approval_valid_s: a write held past it by an interruption is not sent on it.
    valid_s = rule.approval_valid_s if rule.kind is IntentKind.WRITE else None
    return Admitted(key, digest, needs_approval, f"{ask.turn_id}:{digest[:16]}", valid_s)


# --- stages ---------------------------------------------------------------------------------------


def hold(outstanding: Sequence[Outstanding]) -> tuple[Outstanding, ...]:
    """The gate leaves ``open``: every write admitted and not yet sent is held (known unsent)."""
    return tuple(
        replace(o, stage=IntentStage.HELD)
        if o.kind is IntentKind.WRITE and o.stage is IntentStage.INTENDED
        else o
        for o in outstanding
    )


def release(
    outstanding: Sequence[Outstanding], now: float, out: fx.Effects
) -> tuple[Outstanding, ...]:
    """The gate reopens: each held intent is sent (once, with its key) if its approval still
    holds at ``now``; otherwise it is settled ``not_started`` (:data:`APPROVAL_EXPIRED`), which
    leaves it held until that receipt is durable and folded in."""
    released = []
    for o in outstanding:
        if o.stage is not IntentStage.HELD:
            released.append(o)
        elif o.valid_until is None or now <= o.valid_until:
            released.append(replace(o, stage=IntentStage.INTENDED))
            out.append(fx.SendToolRequest(o.key))
        else:
            released.append(o)
            out.append(fx.SettleUnsent(o.key, APPROVAL_EXPIRED))
    return tuple(released)


def to_query(outstanding: Sequence[Outstanding]) -> tuple[str, ...]:
    """The keys reconciliation asks providers about: those that may have reached one. Admitted
    and held intents are known unsent, and asking about a key would fence it for good (the
    reference provider records "never seen" as final)."""
    return tuple(o.key for o in outstanding if o.stage in (IntentStage.SENT, IntentStage.UNKNOWN))


def settled_on_record(stored: str | None) -> bool:
    """Whether the receipt on record for a key (its outcome, None: none) settles it. Only a
    definitive one does: with none, or an ``unknown``, its provider's status endpoint is
    asked (live, and after a restart alike), never its request sent again."""
    return stored in DEFINITIVE


def settle_plan(outstanding: Sequence[Outstanding]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """After the call is gone (a restart, the reaper): (keys to ask providers about, keys known
    unsent, to settle ``not_started`` with :data:`NEVER_SENT`)."""
    query = to_query(outstanding)
    return query, tuple(o.key for o in outstanding if o.key not in query)


# --- receipts: seed 000's reconciliation table ----------------------------------------------------


class Evidence(enum.StrEnum):
    """What reconciliation learned of an intent."""

    COMMITTED = "committed"
    FAILED = "failed"
    NOT_STARTED = "not_started"
    UNKNOWN = "unknown"
    CONFLICTING_RECEIPT = "conflicting_receipt"
    APPROVAL_EXPIRED = "approval_expired"


@dataclass(frozen=True, slots=True)
class Row:
    """One row of seed 000's table: what the runtime may do, and what it must not."""

    receipt: Outcome | None  # what is recorded (None: the receipt on record stays)
    settles: bool  # the intent leaves the outstanding ones
    ends: Terminal | None  # the session ends so (None: it goes on under policy)
    stage: EndingStage | None
    say: str | None  # what the caller hears when the session ends here
    may: str
    must_not: str


# Seed 000, "Reconciliation conclusion | What the runtime may do | What it must not do". The gate
# opens once nothing that may have reached a provider is left unsettled (gate.py); a row that
# ends the session closes it for good.
RECONCILIATION: Final[Mapping[Evidence, Row]] = {
    Evidence.COMMITTED: Row(
        Outcome.COMMITTED, True, None, None, None,
        may="persist the receipt, tell the caller what is known, continue under policy",
        must_not="assume a rollback because of what a model says",
    ),
    Evidence.FAILED: Row(
        Outcome.FAILED, True, None, None, None,
        may="persist the receipt, tell the caller it did not happen, continue under policy",
        must_not="retry the write by itself",
    ),
    Evidence.NOT_STARTED: Row(
        Outcome.NOT_STARTED, True, None, None, None,
        may="record the conclusion; a new, newly authorised intent may follow",
        must_not="replay the old write request",
    ),
    Evidence.APPROVAL_EXPIRED: Row(
        # Seed 000 keeps the gate for an expired permission, lest a write run on it. A held
        # intent is known unsent, so nothing is uncertain: it is recorded not_started (the
        # agent and the caller are told why) and only a new approval can bring a new intent.
        Outcome.NOT_STARTED, True, None, None, None,
        may="record it not_started with the reason; the agent is told, and tells the caller",
        must_not="send the held request on the approval that lapsed",
    ),
    Evidence.UNKNOWN: Row(
        Outcome.UNKNOWN, False, Terminal.NEEDS_HUMAN, EndingStage.RECONCILIATION,
        "outcome_unknown",
        may="keep the intent, stop automatic continuation, hand the caller to a person",
        must_not="accept a new write, or claim the outcome is certain",
    ),
    Evidence.CONFLICTING_RECEIPT: Row(
        None, False, Terminal.NEEDS_HUMAN, EndingStage.RECONCILIATION, "outcome_unknown",
        may="keep the receipt on record and the intent outstanding, hand over to a person",
        must_not="pick one of the two answers",
    ),
}  # fmt: skip


def evidence_of(outcome: str, reason: str = "") -> Evidence:
    """The row a ``tool_receipt`` of ``outcome`` falls in (an expired approval is a
    ``not_started`` receipt that says so)."""
    if outcome == Outcome.NOT_STARTED and reason == APPROVAL_EXPIRED:
        return Evidence.APPROVAL_EXPIRED
    return Evidence(outcome)


# --- a provider's answer --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """A provider's HTTP answer within the contract: its status and JSON object. Answers outside
    it (too large, not JSON, ...) never get here: voicegate/tools/client.py counts them."""

    http_status: int
    data: Mapping[str, Any]


def classify_request(answer: Answer) -> tuple[Outcome, dict[str, Any]]:
    """The outcome of a write's answer. Only a 2xx that says committed is committed; a 4xx
    (but 408 and 429, which ask to come back) is a refusal; anything else may have happened and
    is unknown, for the status endpoint to settle."""
    data, http_status = dict(answer.data), answer.http_status
    status = data.get("status")
    if 200 <= http_status < 300 and status == Outcome.COMMITTED:
        return Outcome.COMMITTED, data
    if 400 <= http_status < 500 and http_status not in (408, 429):
        reason = data.get("reason") or data.get("error") or f"HTTP {http_status}"
        return Outcome.FAILED, {**data, "reason": str(reason), "http_status": http_status}
    return Outcome.UNKNOWN, {"reason": f"HTTP {http_status} with status {status!r}", **data}


def classify_status(answer: Answer) -> tuple[Outcome, dict[str, Any]] | None:
    """The outcome a status answer gives; None when it says nothing usable (ask again)."""
    data, http_status = dict(answer.data), answer.http_status
    status = data.get("status")
    if http_status == 404 and status in (None, Outcome.NOT_STARTED):
        return Outcome.NOT_STARTED, {"reason": "the provider never saw this key"}
    if http_status != 200:
        return None
    if status in DEFINITIVE:
        return Outcome(str(status)), data
    return Outcome.UNKNOWN, {"reason": f"provider says {status!r}", **data}


class Failure(enum.StrEnum):
    """How a request failed without an answer."""

    NEVER_CONNECTED = "never_connected"  # no TCP connection: the provider cannot have seen it
    TIMED_OUT = "timed_out"
    UNREADABLE = "unreadable"  # it reached the provider, whose answer could not be read
    TRANSPORT = "transport"  # the connection broke after it was made


def classify_failure(failure: Failure) -> Outcome:
    """Never in the caller's favour: only a request that never left is ``not_started``."""
    return Outcome.NOT_STARTED if failure is Failure.NEVER_CONNECTED else Outcome.UNKNOWN
