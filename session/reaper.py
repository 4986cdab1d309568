"""The read-path reaper (seed 004, "The turn that never finished finishing").

A session's owner touches it every few seconds while it serves the call. A session that is not
terminal and has not been written or touched for ``stale_after_s`` lost its process: the reaper
appends a synthesized ``session_reaped`` event, which ends it ``failed`` at stage ``process``
with what is known (outstanding tool intents are named and left for reconciliation, never
assumed). Idempotent by construction: a reaped session is terminal, so it is never reaped again.
It never finalises a live session: a live owner's touches keep it fresh, and an append from the
owner racing the reaper makes one of the two fail on the log's sequence number.
"""

from __future__ import annotations

import logging

from session.durable import DurableSession
from session.events import SessionReaped
from session.store import SequenceConflict, SessionFinished, SessionStore, SessionSummary

log = logging.getLogger("voicegate.reaper")

REASON_STALE = "the process serving the session stopped"
REASON_PREDECESSOR = "the process serving the session exited before the session ended"


def reap_one(store: SessionStore, summary: SessionSummary, *, now: float, reason: str) -> bool:
    """Finalise one session; False if it ended meanwhile or another writer got there first."""
    try:
        session = DurableSession.load(store, summary.session_id)
        if session.state.terminal:
            return False
        session.apply(SessionReaped(reason), now)
    except (SequenceConflict, SessionFinished):
        return False
    log.warning(
        "session.reaped",
        extra={"session_id": summary.session_id, "owner": summary.owner, "reason": reason},
    )
    return True


def reap_stale(store: SessionStore, *, now: float, stale_after_s: float) -> list[str]:
    """Finalise every open session whose log and heartbeat are older than ``stale_after_s``."""
    reaped = []
    for summary in store.open_sessions(updated_before=now - stale_after_s):
        if reap_one(store, summary, now=now, reason=REASON_STALE):
            reaped.append(summary.session_id)
    return reaped


def reap_predecessors(store: SessionStore, *, worker: str, me: str, now: float) -> list[str]:
    """At start-up: finalise what earlier incarnations of this worker left open.

    Owners are ``<worker>/<incarnation>``; an incarnation of my worker that is not me is dead,
    whatever the age of its sessions (it is this very process's predecessor).
    """
    reaped = []
    for summary in store.open_sessions(owner_prefix=f"{worker}/"):
        if summary.owner == me:
            continue
        if reap_one(store, summary, now=now, reason=REASON_PREDECESSOR):
            reaped.append(summary.session_id)
    return reaped


def is_stale(summary: SessionSummary, *, now: float, stale_after_s: float) -> bool:
    return summary.terminal_state is None and summary.updated_at < now - stale_after_s
