"""Outbound legs of this process: a call voicegate places (``POST /v1/calls``).

A placed call is a :class:`~voicegate.call.live_call.LiveCall` like an inbound one, with the
same session semantics once answered (its agent starts on the answer). What differs is before the
answer: its session starts with ``call_placed`` and rings under a ring deadline (session.legs),
the SIP thread sends the INVITE (telephony.events.Dial) only once that is durable, and an
unanswered end is one explicit outcome (busy, declined, no answer, failed), counted in
``voicegate_outbound_calls_total{outcome}``.

Slots: an outbound leg takes one of the worker's call slots (PJSUA_MAX_CALLS) like any call, so a
worker refuses a placement up front (503, ``no free call slot``) when its live calls fill
``sip.max_calls``; an INVITE that still meets a full PJSIP is reported as the outcome ``failed``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from session.legs import leg_outcome
from session.state import SessionState
from session.vocabulary import EndingStage, LegOutcome
from telephony import events as ev
from telephony.sip_message import mask_number, request_user


@dataclass(frozen=True, slots=True)
class OutboundLeg:
    """What to place: ``target`` (a bare SIP URI, allowed by the tenant's
    ``outbound.allowed_targets``), the headers its INVITE carries and its From (the tenant's
    ``outbound.caller_id``; empty: voicegate's own URI)."""

    target: str
    ring_timeout_s: float
    headers: tuple[tuple[str, str], ...] = ()
    caller_id: str = ""
    referred_by: str = ""
    """A followed inbound REFER's new call: the session id of the call whose REFER it follows.
    pjsua sends its INVITE itself, from inside the REFER's callback (telephony.refer), so no
    Dial follows the session's start, and the INVITE may leave before that is durable."""


@dataclass(frozen=True, slots=True)
class PlaceRefused:
    """Why a placement changed nothing: ``status`` is the HTTP answer (403 target not allowed,
    503 no free call slot or draining), ``field`` the body's field concerned."""

    status: int
    message: str
    field: str = ""


def new_leg_offer(target: str) -> ev.CallOffered:
    """The call as the rest of the call's code reads an offer: a fresh id, ``target`` as the
    remote party (masked wherever it is shown), its user part as the number called, masked
    here: an inbound call's called_user is our own number, an outbound leg's is the callee's
    (STYLE.md habit 10), and it is only ever shown (the log, the session meta, /v1/calls, the
    agent's context), never dialled: the leg dials ``target``."""
    user = request_user(f"INVITE {target} SIP/2.0")
    return ev.CallOffered(
        call_id=uuid.uuid4().hex,
        sip_call_id="",
        remote_uri=target,
        local_uri="",
        called_user=mask_number(user),
        transport="udp",
    )


def unanswered_outcome(state: SessionState | None, status: int, plan_given: bool) -> LegOutcome:
    """How a leg that ended before its answer turned out, for the metric."""
    ended = state.ended if state is not None else None
    if ended is not None and ended.stage == EndingStage.RINGING:
        return LegOutcome.NO_ANSWER
    if plan_given:
        return LegOutcome.CANCELED  # we gave it up: an operator, a shutdown
    return leg_outcome(status)
