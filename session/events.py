"""Everything that can happen to a session, as plain immutable values.

Events are what the runtime feeds the state machine (``session.machine``) and what the store keeps
in a session's log; :func:`event_from_dict` reads them back for replay. An event's ``type`` is its
stable name in the log: renaming one breaks old logs, so add new names instead.

Events that end a recovery or a transfer, or fire a timer, carry the ``generation`` they belong
to (a transfer takes its number from the same counter, session.transfer): only the current
generation may move the session (seed 001, "Retry within a deadline and an ownership
boundary"); the machine ignores and counts the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class Event:
    type: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- signaling ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallOffered(Event):
    """The first event of every session. ``policy`` fixes its deadlines for good (replays too)."""

    type: ClassVar[str] = "call_offered"
    caller: str = ""
    called_user: str = ""
    policy: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CallPlaced(Event):
    """The first event of a session whose call voicegate places (an outbound leg,
    session.legs): it rings at ``target`` (masked) for at most ``ring_timeout_s``. ``policy``
    as for :class:`CallOffered`."""

    type: ClassVar[str] = "call_placed"
    target: str = ""
    ring_timeout_s: float = 30.0
    policy: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LegUnanswered(Event):
    """An outbound leg ended before it was answered: the callee's final answer (``status``
    486, 603, 404, ...), or ours for a call that never left (503, "no free call slot")."""

    type: ClassVar[str] = "leg_unanswered"
    status: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CallAnswered(Event):
    """The dialog is confirmed (PJSIP's CONFIRMED state: the caller's ACK to our 200, or an
    outbound leg's callee answered): media flows, and the no-input and max-duration timers start."""

    type: ClassVar[str] = "call_answered"


@dataclass(frozen=True, slots=True)
class ReinviteStarted(Event):
    """The caller sent a re-INVITE on the established dialog (hold, a new codec or address): an
    interruption, like a media gap, until :class:`ReinviteFinished`."""

    type: ClassVar[str] = "reinvite_started"


@dataclass(frozen=True, slots=True)
class ReinviteFinished(Event):
    """The re-INVITE is over: its new media is up (``ok``), or we answered it with an error and the
    previous session and media stay (RFC 6141). ``generation``: the recovery it ends."""

    type: ClassVar[str] = "reinvite_finished"
    generation: int = 0
    ok: bool = True


@dataclass(frozen=True, slots=True)
class TransferStarted(Event):
    """A transfer begins, its own phase (session.transfer), not a recovery: the gate freezes
    for the reason ``transfer``, the response is cut, the guard ``transfer_notify`` is armed.
    ``mode``: ``blind`` (REFER), ``bridge`` (we call the target and stay in the media path,
    session.bridge) or ``attended`` (a consult leg first, then REFER with Replaces); logs from
    before modes existed are blind."""

    type: ClassVar[str] = "transfer_started"
    target: str = ""
    mode: str = "blind"


@dataclass(frozen=True, slots=True)
class TransferFellBack(Event):
    """The blind transfer's REFER was refused (``status``) and ``transfer.fallback`` is bridge:
    the same transfer goes on as a bridge to the same target (session.bridge)."""

    type: ClassVar[str] = "transfer_fell_back"
    generation: int = 0
    status: int = 0


@dataclass(frozen=True, slots=True)
class ConsultAnswered(Event):
    """An attended transfer's consult leg was answered: the REFER with Replaces follows once
    this is durable (RFC 5589 section 7)."""

    type: ClassVar[str] = "consult_answered"
    generation: int = 0


@dataclass(frozen=True, slots=True)
class BridgeUp(Event):
    """The target answered the bridge's leg and both legs' media are connected."""

    type: ClassVar[str] = "bridge_up"
    generation: int = 0


@dataclass(frozen=True, slots=True)
class BridgeEnded(Event):
    """One side of a bridge hung up (``by``: ``caller`` or ``target``); the other is hung up."""

    type: ClassVar[str] = "bridge_ended"
    by: str = "caller"


@dataclass(frozen=True, slots=True)
class TransferProgress(Event):
    """A provisional NOTIFY of a transfer under way: its sipfrag ``status`` (pjsua reports the
    REFER's own 2xx as 100 "Accepted"). A record for the session's status; it moves nothing else."""

    type: ClassVar[str] = "transfer_progress"
    status: int = 100


@dataclass(frozen=True, slots=True)
class TransferFinished(Event):
    """The transfer's outcome. ``ok``: the caller now talks to the target, and this session's
    part is done (away, or ended); else the caller is back with the agent, told honestly, and
    what broke meanwhile is recovered from then on. ``generation``: the transfer's."""

    type: ClassVar[str] = "transfer_finished"
    generation: int = 0
    ok: bool = True
    # The final NOTIFY's sipfrag status, or the REFER's own refusal (0 in logs before it existed).
    status: int = 0


@dataclass(frozen=True, slots=True)
class CallRejoined(Event):
    """A caller transferred out came back on a new dialog with the session's resume handle
    (session.away). ``generation`` is the session's new signaling generation (one more than
    the last); ``via`` says where the handle was (``header``: X-Voicegate-Resume, ``uui``:
    hex User-to-User); ``caller`` is masked. Never the handle itself."""

    type: ClassVar[str] = "rejoined"
    generation: int = 0
    caller: str = ""
    via: str = ""


@dataclass(frozen=True, slots=True)
class AwayExpired(Event):
    """The resume handle of a session that is away ran out unused: the reaper ends it."""

    type: ClassVar[str] = "away_expired"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CalledBack(Event):
    """A caller whose call dropped (media lost for good) called back from the same number to
    the same tenant within the window, and chose to continue (session.callback). ``generation``
    is the new signaling generation; ``caller`` is masked; ``with_code``: the resume code was
    asked for and entered right. Never the code or the number."""

    type: ClassVar[str] = "called_back"
    generation: int = 0
    caller: str = ""
    with_code: bool = False


@dataclass(frozen=True, slots=True)
class CallbackEnded(Event):
    """A dropped session ends as it would have at the drop: its window passed (``window``,
    the reaper), or the caller who called back chose a new session (``declined``), let the
    offer time out (``no_answer``) or used up the code's attempts (``code_refused``)."""

    type: ClassVar[str] = "callback_ended"
    cause: str = "window"


@dataclass(frozen=True, slots=True)
class ResumeCodeIssued(Event):
    """A write started: the caller is read a short resume code to continue after a drop.
    ``digest``: the code's keyed digest, scoped to the session (never the code)."""

    type: ClassVar[str] = "resume_code_issued"
    digest: str = ""


@dataclass(frozen=True, slots=True)
class ResumeReused(Event):
    """A used (rotated) resume handle of this session was presented again: it may have been
    stolen, so write tools freeze until reconciliation (session.away)."""

    type: ClassVar[str] = "resume_reused"


@dataclass(frozen=True, slots=True)
class CallerHangup(Event):
    """The caller ended the dialog: their BYE, or their CANCEL before we answered. While bridged
    it is :class:`BridgeEnded` by the caller."""

    type: ClassVar[str] = "caller_hangup"


@dataclass(frozen=True, slots=True)
class DialogFailed(Event):
    """PJSIP ended the dialog itself (no ACK, transport error, ...): neither side hung up."""

    type: ClassVar[str] = "dialog_failed"
    status: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class AgentFailed(Event):
    """The agent itself failed (an in-process agent raised, or could not be made): the call
    cannot go on; ``reason`` is what failed, never the agent's data."""

    type: ClassVar[str] = "agent_failed"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class SessionExpired(Event):
    """RFC 4028: no session refresh arrived in time; PJSIP ended the dialog with BYE."""

    type: ClassVar[str] = "session_expired"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ServerHangup(Event):
    """Voicegate ended the call: ``outcome`` ``completed`` (the agent finished) or ``canceled``."""

    type: ClassVar[str] = "server_hangup"
    outcome: str = "completed"
    reason: str = ""


# --- media and agent link -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MediaLost(Event):
    """No caller RTP for ``media.gap_threshold_s`` on an answered call (not bridged): an
    interruption, until :class:`MediaRestored` or the recovery's deadline."""

    type: ClassVar[str] = "media_lost"


@dataclass(frozen=True, slots=True)
class MediaRestored(Event):
    """Caller RTP flows again (or the stream is on hold) during the recovery of ``generation``."""

    type: ClassVar[str] = "media_restored"
    generation: int = 0


@dataclass(frozen=True, slots=True)
class AgentLinkLost(Event):
    """A remote agent's link dropped (socket closed, an error, silence, a sequence gap): an
    interruption while voicegate redials."""

    type: ClassVar[str] = "agent_link_lost"


@dataclass(frozen=True, slots=True)
class AgentLinkRestored(Event):
    """The remote agent's link resumed in time; ``generation``: the recovery it ends."""

    type: ClassVar[str] = "agent_link_restored"
    generation: int = 0


@dataclass(frozen=True, slots=True)
class AgentLinkFailed(Event):
    """A remote agent's link stayed down past ``agent.reconnect_deadline_s`` (or the agent broke
    the protocol past its error budget): the call cannot go on. ``reason`` names what failed,
    never a token or the agent's data."""

    type: ClassVar[str] = "agent_link_failed"
    reason: str = ""


# --- conversation -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnStarted(Event):
    """The caller began turn ``turn_id``: enough speech (``audio.turn_min_speech_ms``), or a key
    press (a whole turn, committed at once). Refused while the gate is not open."""

    type: ClassVar[str] = "turn_started"
    turn_id: str = ""


@dataclass(frozen=True, slots=True)
class TurnCommitted(Event):
    """The caller's turn ``turn_id`` is complete: the speech stopped, or a key was pressed."""

    type: ClassVar[str] = "turn_committed"
    turn_id: str = ""


@dataclass(frozen=True, slots=True)
class ResponseStarted(Event):
    """The agent opened response ``response_id`` in answer to ``turn_id`` (the current turn, if
    any): its audio plays in the current playback generation. Refused while the gate is not open
    or another response is active."""

    type: ClassVar[str] = "response_started"
    response_id: str = ""
    turn_id: str = ""


@dataclass(frozen=True, slots=True)
class ResponseInterrupted(Event):
    """The active response was cut before it played out, whoever cut it: a barge-in (speech or a
    key), the agent's cancel, the server shutting down, or a step of the session's own that cuts
    playback (lost media, a re-INVITE, a transfer started by the API, the agent or a key, a
    dropped agent link, a hang-up by either side, any other ending), written just before that
    step; ``heard_ms`` of it had been heard. The agent is told."""

    type: ClassVar[str] = "response_interrupted"
    response_id: str = ""
    heard_ms: int = 0


@dataclass(frozen=True, slots=True)
class BargeInJudged(Event):
    """What a speech barge-in turned out to be (issue 21): ``confirmed`` when a caller turn was
    committed within the window after it, ``false`` when none was (noise, a cough) and the agent
    was told it may resume; ``heard_ms`` of the cut response had been heard. A record only."""

    type: ClassVar[str] = "barge_in_judged"
    response_id: str = ""
    outcome: str = ""
    heard_ms: int = 0


@dataclass(frozen=True, slots=True)
class PromptCut(Event):
    """A line of the session's own (a prompt it said: "one moment", "I could not reach a
    colleague", a shutdown notice) was cut before it played out, by whatever cut the playout,
    written just before the step that cuts it; ``heard_ms`` of it had been heard. A record only:
    the line is not the agent's, so the agent is not told."""

    type: ClassVar[str] = "prompt_cut"
    say_id: str = ""  # the line's id in the playout: say1, say2, ...
    prompt: str = ""  # the prompt's name
    heard_ms: int = 0


@dataclass(frozen=True, slots=True)
class ResponseFinished(Event):
    """A response ended uncut: it played out, or a newer one of the agent's superseded it while it
    drained; ``heard_ms`` of it had been heard."""

    type: ClassVar[str] = "response_finished"
    response_id: str = ""
    heard_ms: int = 0


# --- side effects -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolIntent(Event):
    """A tool call the agent asked for passed the ledger (session/ledger.py), and the gate for a
    write: the intent ``key`` is recorded with its ``arguments`` before anything is sent. Its step
    sends it (``send_tool_request``)."""

    type: ClassVar[str] = "tool_intent"
    key: str = ""
    tool: str = ""
    kind: str = "write"
    digest: str = ""
    turn_id: str = ""
    # The event log is the truth for tools (seed 000): the arguments travel in the event that
    # creates the intent, so a crash before the intent row loses nothing.
    arguments: Mapping[str, Any] = field(default_factory=dict)
    # How long the approval it was admitted under holds, from this event (session/ledger.py):
    # a held intent is sent after that only on a new approval. None: no approval to lapse.
    approval_valid_s: float | None = None


@dataclass(frozen=True, slots=True)
class ToolRequestSent(Event):
    """The request of intent ``key`` is about to leave: written, and durable, before its HTTP
    begins, so from here only the provider knows whether it ran."""

    type: ClassVar[str] = "tool_request_sent"
    key: str = ""


@dataclass(frozen=True, slots=True)
class ToolRequestWithheld(Event):
    """A request logged sent never left: the interruption that froze the gate stopped it
    before its first byte (its ``tool_request_sent`` was durable, its HTTP had not begun). It is
    known unsent, so it is held again, not asked about (session/ledger.py)."""

    type: ClassVar[str] = "tool_request_withheld"
    key: str = ""


@dataclass(frozen=True, slots=True)
class ToolReceipt(Event):
    """The receipt of intent ``key``, written once its row is durable: the provider's answer to
    the request or to the status query (reconciliation), or ``not_started`` for a request known
    never sent; ``detail``: the reason given, if any. ``outcome``: one of
    :class:`~session.vocabulary.Outcome`; anything else is refused."""

    type: ClassVar[str] = "tool_receipt"
    key: str = ""
    outcome: str = "committed"
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ToolReceiptConflicted(Event):
    """A provider's answer for ``key`` contradicts the receipt already stored (seed 000's
    "conflicting receipt"): nobody can say what happened, so a person must."""

    type: ClassVar[str] = "tool_receipt_conflicted"
    key: str = ""
    stored: str = ""  # the outcome on record
    offered: str = ""  # the outcome that contradicts it


@dataclass(frozen=True, slots=True)
class ApprovalGiven(Event):
    """A write tool call that needs the caller's approval (``tools.<name>.approval``) had it (a key
    press, or a spoken yes): written just before its :class:`ToolIntent`. ``approval_id``: the turn
    and the request's digest, so one approval admits one request."""

    type: ClassVar[str] = "approval_given"
    approval_id: str = ""


@dataclass(frozen=True, slots=True)
class CallerSaid(Event):
    """An utterance the agent's recogniser heard, and what the agent did with it. ``text`` has
    digit runs masked (never a card number or a code); ``decision``: one of
    :data:`session.vocabulary.SPEECH_DECISIONS`; ``reason`` why it was rejected, if it was."""

    type: ClassVar[str] = "caller_said"
    text: str = ""
    grammar: str = ""
    confidence: float = 0.0
    decision: str = "accepted"
    reason: str = ""


# --- time and people ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadlineFired(Event):
    """A timer that a ``schedule_timer`` effect set came due: ``name`` of ``generation``; one
    that is no longer current is stale. ``name``: one of :class:`~session.deadlines.Timer`;
    ``recovery_retry`` comes as :class:`RecoveryRetryDue` instead."""

    type: ClassVar[str] = "deadline_fired"
    name: str = ""
    generation: int = 0


@dataclass(frozen=True, slots=True)
class RecoveryRetryDue(Event):
    """The recovery's next scheduled attempt came due (the ``recovery_retry`` timer): attempt
    ``attempt`` of the recovery of ``generation``. Its step makes the attempt
    (``attempt_recovery``)."""

    type: ClassVar[str] = "recovery_retry_due"
    generation: int = 0
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class RecoveryProbed(Event):
    """The answer to the in-dialog OPTIONS that an ``AttemptRecovery`` effect sent (seed 001: "the
    current generation performs one scheduled attempt within the shared deadline").

    ``status`` is the SIP status of the answer; PJSIP reports a transport failure as 503 with
    "Transport" in ``reason``, and 0 means no answer arrived at all.
    """

    type: ClassVar[str] = "recovery_probed"
    generation: int = 0
    attempt: int = 0
    status: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class OperatorResolution(Event):
    """A person's ruling on how the session ends: ``terminal_state``, one its outstanding intents
    allow (``acceptable_terminal_states``), with a ``note``. Taken in any state; nothing in
    voicegate writes it yet (no route takes it)."""

    type: ClassVar[str] = "operator_resolution"
    terminal_state: str = "canceled"
    note: str = ""


@dataclass(frozen=True, slots=True)
class OwnerLost(Event):
    """The process serving the session died: the caller is gone, but outstanding tool intents
    are still to be reconciled before the session is finalised (seed 000's third step).

    ``park``: the caller was cut off mid-call with a write under way (its resume code read out),
    so, as after media lost for good, the session waits ``callback_window_s`` for a callback
    (session/callback.py) instead of being finalised; its intents are settled meanwhile. The
    taker decides (:func:`session.callback.may_park`), so older logs fold as they did.
    """

    type: ClassVar[str] = "owner_lost"
    reason: str = ""
    park: bool = False  # absent from logs written before parking: False


@dataclass(frozen=True, slots=True)
class SessionReaped(Event):
    """Synthesized by the reaper for a session whose process died (seed 004)."""

    type: ClassVar[str] = "session_reaped"
    reason: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        CallOffered,
        CallPlaced,
        LegUnanswered,
        CallAnswered,
        ReinviteStarted,
        ReinviteFinished,
        TransferStarted,
        TransferProgress,
        TransferFinished,
        TransferFellBack,
        ConsultAnswered,
        BridgeUp,
        BridgeEnded,
        CallRejoined,
        AwayExpired,
        CalledBack,
        CallbackEnded,
        ResumeCodeIssued,
        ResumeReused,
        CallerHangup,
        DialogFailed,
        AgentFailed,
        SessionExpired,
        ServerHangup,
        MediaLost,
        MediaRestored,
        AgentLinkLost,
        AgentLinkRestored,
        AgentLinkFailed,
        TurnStarted,
        TurnCommitted,
        ResponseStarted,
        ResponseInterrupted,
        BargeInJudged,
        PromptCut,
        ResponseFinished,
        ToolIntent,
        ToolRequestSent,
        ToolRequestWithheld,
        ToolReceipt,
        ToolReceiptConflicted,
        ApprovalGiven,
        CallerSaid,
        DeadlineFired,
        RecoveryRetryDue,
        RecoveryProbed,
        OperatorResolution,
        OwnerLost,
        SessionReaped,
    )
}


class UnknownEvent(ValueError):
    pass


def event_from_dict(event_type: str, payload: Mapping[str, Any]) -> Event:
    """Rebuild an event from its log entry; unknown types and fields raise :class:`UnknownEvent`."""
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise UnknownEvent(f"unknown event type {event_type!r}")
    try:
        return cls(**payload)
    except TypeError as exc:
        raise UnknownEvent(f"bad payload for {event_type}: {exc}") from None
