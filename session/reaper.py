"""The read-path reaper (seed 004, "The turn that never finished finishing").

A session's owner touches it every few seconds while it serves the call. A session that is not
terminal and has not been written or touched for ``stale_after_s`` lost its process: the reaper
takes over its lease, then appends a synthesized ``session_reaped`` event, which ends it
``failed`` at stage ``process`` with what is known (outstanding tool intents are named and left
for reconciliation, never assumed). Idempotent by construction: a reaped session is terminal, so
it is never reaped again, and the take-over of an ended session is refused.
A session that is away (session.away: transferred out, its caller may come back with the
resume handle) has no owner touching it, and is not lost: the reaper leaves it alone until its
handle's lifetime has run out, then ends it ``completed`` (``transferred``) with an
``away_expired`` event instead of ``session_reaped``.
A live owner's touches keep its session fresh, so the reaper leaves it alone. An owner that
stalled past ``stale_after_s`` and comes back finds its lease taken: its late writes are refused
(LeaseLost) and it stops, so the reaper's verdict is final and the log never forks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from session.durable import DurableSession
from session.events import AwayExpired, CallbackEnded, Event, SessionReaped
from session.state import AWAY_STATUS, DROPPED_STATUS, SessionState, Signaling
from session.store import (
    LeaseLost,
    SequenceConflict,
    SessionFinished,
    SessionStore,
    SessionSummary,
)
from session.vocabulary import OwnerId

log = logging.getLogger("voicegate.reaper")

REASON_STALE = "the process serving the session stopped"
REASON_PREDECESSOR = "the process serving the session exited before the session ended"


REASON_NODE = "the node serving the session died"
REASON_AWAY_EXPIRED = "the resume handle expired unused"


def parked(summary: SessionSummary) -> bool:
    """Away or dropped: parked with no owner touching it, and not lost (it has its own end)."""
    return summary.status.startswith((AWAY_STATUS, DROPPED_STATUS))


def reap_one(
    store: SessionStore, summary: SessionSummary, *, me: str, now: float, reason: str
) -> bool:
    """Take the session over as ``me`` and finalise it.

    False if it ended meanwhile or another writer got there first (it took the session over
    after us, or ended it), and for a session that is away (:func:`expire_away` ends those).
    """
    if parked(summary):
        return False
    try:
        session = DurableSession.take_over(store, summary.session_id, owner=me, now=now)
        if session.state.terminal:
            return False
        if session.state.signaling in (Signaling.AWAY, Signaling.DROPPED):
            return False  # went away (or dropped) after the summary was read
        session.apply(SessionReaped(reason), now)
    except (LeaseLost, SequenceConflict, SessionFinished):
        return False
    log.warning(
        "session.reaped",
        extra={
            "session_id": summary.session_id,
            "owner": summary.owner,
            "by": me,
            "epoch": session.lease.epoch if session.lease else None,
            "reason": reason,
        },
    )
    return True


def reap_stale(store: SessionStore, *, me: str, now: float, stale_after_s: float) -> list[str]:
    """Finalise every open session whose log and heartbeat are older than ``stale_after_s``.

    ``me`` is the caller's owner id: the reaper takes each session over under it.
    """
    reaped = []
    for summary in store.open_sessions(updated_before=now - stale_after_s):
        if reap_one(store, summary, me=me, now=now, reason=REASON_STALE):
            reaped.append(summary.session_id)
    return reaped


def reap_predecessors(store: SessionStore, *, worker: str, me: str, now: float) -> list[str]:
    """At start-up: finalise what earlier incarnations of this worker left open.

    Owners are ``<worker>/<incarnation>`` (:class:`~session.vocabulary.OwnerId`); an incarnation
    of my worker that is not me is dead, whatever the age of its sessions (it is this very
    process's predecessor).
    """
    return reap_owned(
        store, prefix=OwnerId.prefix(worker), me=me, now=now, reason=REASON_PREDECESSOR
    )


def reap_owned(store: SessionStore, *, prefix: str, me: str, now: float, reason: str) -> list[str]:
    """Finalise every open session whose owner id starts with ``prefix`` (owners known dead: a
    worker's predecessors, a dead node's processes), except ``me``'s own."""
    reaped = []
    for summary in store.open_sessions(owner_prefix=prefix):
        if summary.owner == me:
            continue
        if reap_one(store, summary, me=me, now=now, reason=reason):
            reaped.append(summary.session_id)
    return reaped


def expire_away(store: SessionStore, *, me: str, now: float) -> list[str]:
    """End every away session whose resume handle's lifetime is over: ``completed``
    (``transferred``), as the transfer itself used to (session.away). A caller who rejoined
    meanwhile moved the session on (its lease and log), so it is left alone. Idempotent."""
    return _expire_parked(
        store, AWAY_STATUS, Signaling.AWAY, lambda state: state.away_until,
        AwayExpired(REASON_AWAY_EXPIRED), "session.away_expired", me=me, now=now,
    )  # fmt: skip


def expire_dropped(store: SessionStore, *, me: str, now: float) -> list[str]:
    """End every dropped session whose callback window is over, with the ending its recovery's
    deadline gave it at the drop (session.callback): ``timed_out`` at stage ``recovery``, the
    same reason (``failed`` at stage ``process`` for one its process's death parked). A caller
    who called back meanwhile moved it on, so it is left alone. One with a write outstanding
    waits until a sweep has asked the provider about it (settle_lapsed_drops in
    voicegate/tools/startup_reconcile.py): its ending must say what the provider did."""
    return _expire_parked(
        store, DROPPED_STATUS, Signaling.DROPPED, lambda state: state.dropped_until,
        CallbackEnded("window"), "session.callback_window_passed", me=me, now=now,
        settled=lambda state: not state.outstanding,
    )  # fmt: skip


def _expire_parked(
    store: SessionStore,
    status: str,
    parked: Signaling,
    until: Callable[[SessionState], float | None],
    ending: Event,
    logged: str,
    *,
    me: str,
    now: float,
    settled: Callable[[SessionState], bool] = lambda state: True,
) -> list[str]:
    # A parked session (away or dropped) whose time is over ends with ``ending``; one the
    # caller came back to between the read and the take-over is no longer parked.
    expired = []
    for summary in store.open_sessions():
        if not summary.status.startswith(status):
            continue
        state = DurableSession.load(store, summary.session_id).state
        deadline = until(state)
        if state.signaling is not parked or deadline is None or now < deadline:
            continue
        if not settled(state):
            continue
        try:
            session = DurableSession.take_over(store, summary.session_id, owner=me, now=now)
            if session.state.signaling is not parked:
                continue
            session.apply(ending, now)
        except (LeaseLost, SequenceConflict, SessionFinished):
            continue
        log.info(logged, extra={"session_id": summary.session_id, "by": me})
        expired.append(summary.session_id)
    return expired
