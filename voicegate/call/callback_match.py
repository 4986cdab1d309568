"""The store's side of a callback (session/callback.py), run on its writer thread.

:func:`find_dropped` matches a new call to a dropped session: same tenant, same caller (by the
keyed digest its session keeps in its metadata, voicegate/call/callback_keys.py: never the
number), window still open. :func:`take_back` moves the session's lease to this process at the
next fencing epoch (as a rejoin by handle does, voicegate/call/rejoin.py) and reads back what
happened meanwhile; :func:`end_dropped` ends it when the caller chose a new session. Each
re-reads the session first, so a session ended, expired or taken by another worker meanwhile is
left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from session.durable import DurableSession
from session.events import CallbackEnded
from session.resume import ResumeResult
from session.state import DROPPED_STATUS, SessionState, Signaling
from session.store import SessionStore, StoreError
from voicegate.call.rejoin import Verdict, read_back

# The metadata key of the caller's keyed digest (no number is ever stored).
CALLER_KEY = "caller_key"


@dataclass(frozen=True, slots=True)
class Dropped:
    """A dropped session a caller may continue: its id and its resume code's digest ("": the
    key press is enough)."""

    session_id: str
    code_digest: str

    def __repr__(self) -> str:
        return f"Dropped({self.session_id}, code={'yes' if self.code_digest else 'no'})"


def _open(state: SessionState, now: float) -> bool:
    return (
        state.signaling is Signaling.DROPPED
        and state.dropped_until is not None
        and now < state.dropped_until
    )


def find_dropped(
    store: SessionStore, *, tenant: str, caller_key: str, now: float, busy: frozenset[str]
) -> Dropped | None:
    """The newest dropped session of ``tenant`` whose caller digest is ``caller_key`` and whose
    window is open at ``now``; None if there is none (the call starts a new session). ``busy``:
    sessions with a call in this process."""
    cursor: str | None = None
    while True:
        page, cursor = store.list(
            open_only=True, status_prefix=DROPPED_STATUS, tenant=tenant, cursor=cursor
        )
        for summary in page:
            if summary.meta.get(CALLER_KEY) != caller_key or summary.session_id in busy:
                continue
            state = DurableSession.load(store, summary.session_id).state
            if _open(state, now):
                return Dropped(summary.session_id, state.resume_code)
        if cursor is None:
            return None


def take_back(store: SessionStore, session_id: str, *, owner: str, now: float) -> Verdict | None:
    """Take the dropped session over as ``owner`` for the caller who chose to continue, with
    what its tools came to (read back, never re-run); None if it is no longer dropped."""
    try:
        if not _open(DurableSession.load(store, session_id).state, now):
            return None
        session = DurableSession.take_over(store, session_id, owner=owner, now=now)
    except StoreError:
        return None
    if not _open(session.state, now):
        return None  # called back elsewhere between the read and the take-over
    results, heard_last = read_back(store, session_id)
    return Verdict(ResumeResult.OK, session_id, session, None, False, results, heard_last)


def end_dropped(
    store: SessionStore, session_id: str, cause: str, *, owner: str, now: float
) -> bool:
    """End the dropped session as it would have ended (``cause``: why the caller did not go
    on); False if it is no longer dropped."""
    try:
        if DurableSession.load(store, session_id).state.signaling is not Signaling.DROPPED:
            return False
        session = DurableSession.take_over(store, session_id, owner=owner, now=now)
        if session.state.signaling is not Signaling.DROPPED:
            return False
        session.apply(CallbackEnded(cause), now)
    except StoreError:
        return False
    return True
