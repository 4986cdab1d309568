"""Rejoin by resume handle: an INVITE that presents a session's handle brings its caller back.

Seed 000's three steps, for a phone call: the new dialog is the transport; the handle is the
session recovery (short-lived, scoped to one session and tenant, used once, verified against
its stored digest: session/resume.py); business reconciliation is the session's own
(session/away.py: the gate reconciles before anything new runs, and a receipt that exists is
read back, never re-run: seed 004, "reclaim, don't resend").

:func:`verify_and_take` runs on the store's writer thread, in one go: classify the handle,
rotate it (compare-and-set: of two calls presenting it at once one wins, the other is a
reuse), and take the session's lease over at the next fencing epoch, so any worker sharing the
store may serve the caller and the previous owner's late writes are refused. A refusal changes
nothing in any session (a reuse is then reported to the session by the caller of this, since
it may be a stolen handle).
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.base import ToolResult
from session.durable import DurableSession
from session.events import ResumeReused
from session.resume import REFUSAL_PHRASES, Handle, ResumeResult, issue, selector_of, verify
from session.state import Signaling
from session.store import SessionFinished, SessionStore, StoreError
from voicegate.call.heard import heard_last_line

# SIP answers to a call whose handle is refused (RFC 3261 21.4.4: 403, the reason phrase names
# the class of refusal, never the handle), or whose session has a caller on the line already.
REFUSED_STATUS = 403
BUSY_STATUS = 486
BUSY_PHRASE = "Session Already On A Call"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What presenting a handle came to. ``session``: taken over, on ``ok``; ``session_id``:
    whose handle it is, when that may be said inside this process (``ok``, ``reused``, busy);
    ``successor``: the rotated handle, the rejoined call's current one."""

    result: ResumeResult
    session_id: str = ""
    session: DurableSession | None = None
    successor: Handle | None = None
    busy: bool = False
    # Read back for the agent (never run again): every tool call of the session with a
    # definitive receipt, in the order asked; and the last prompt or response the caller heard.
    results: tuple[ToolResult, ...] = ()
    heard_last: str = ""
    # A caller back after a drop (voicegate/call/callbacks.py), not by handle: the session
    # records ``called_back`` (with the resume code, or the key press was enough).
    callback: bool = False
    with_code: bool = False

    @property
    def status(self) -> int:
        return BUSY_STATUS if self.busy else REFUSED_STATUS

    @property
    def phrase(self) -> str:
        return BUSY_PHRASE if self.busy else REFUSAL_PHRASES.get(self.result, "")

    def __repr__(self) -> str:
        return f"Verdict({self.result.value}, busy={self.busy})"


def verify_and_take(
    store: SessionStore,
    text: str,
    *,
    tenant: str,
    owner: str,
    now: float,
    ttl_s: float,
    live: frozenset[str] = frozenset(),
) -> Verdict:
    """Classify ``text`` for a call of ``tenant``; on ``ok``, rotate it and take the session over
    as ``owner``. ``now`` is wall time (handles are compared across workers). ``live``: the
    sessions with a call in this process (one whose BYE is still under way is busy)."""
    selector = selector_of(text)
    record = store.resume_handle(selector) if selector is not None else None
    result = verify(text, record, tenant=tenant, now=now)
    if record is None or result is not ResumeResult.OK:
        reused_of = record.session_id if record and result is ResumeResult.REUSED else ""
        return Verdict(result, reused_of)
    session_id = record.session_id
    summary = store.get(session_id)
    if summary is None or summary.terminal_state is not None:
        # Its session ended: nothing to come back to (a handle outlives nothing).
        return Verdict(ResumeResult.EXPIRED)
    state = DurableSession.load(store, session_id).state
    if state.signaling is not Signaling.AWAY or session_id in live:
        # The caller is still on a call of this session: not consumed, not changed.
        return Verdict(ResumeResult.OK, session_id, busy=True)
    if state.away_until is not None and now >= state.away_until:
        # A handle the API issued while away outlives the session's away time: the session
        # would refuse the rejoin (session/away.py), so nothing is used up or taken over; the
        # reaper's next sweep ends it as the transfer's end.
        return Verdict(ResumeResult.EXPIRED)
    successor = issue(session_id, tenant, now=now, ttl_s=ttl_s)
    if not store.use_handle(record.selector, successor.record):
        return Verdict(ResumeResult.REUSED, session_id)  # a racing call used it first
    try:
        session = DurableSession.take_over(store, session_id, owner=owner, now=now)
    except SessionFinished:
        return Verdict(ResumeResult.EXPIRED)  # ended (expired) between the read and now
    results, heard_last = read_back(store, session_id)
    return Verdict(ResumeResult.OK, session_id, session, successor, False, results, heard_last)


def read_back(store: SessionStore, session_id: str) -> tuple[tuple[ToolResult, ...], str]:
    results = []
    records = list(store.events(session_id))
    for record in records:
        if record.type == "tool_intent":
            key = str(record.payload.get("key", ""))
            receipt = store.receipt(key)
            if receipt is not None and receipt.outcome != "unknown":
                tool = str(record.payload.get("tool", ""))
                results.append(ToolResult(tool, key, receipt.outcome, dict(receipt.detail), True))
    # The same account as the desk's handoff (a line cut before a word of it was never heard).
    return tuple(results), heard_last_line(records)


def report_reuse(store: SessionStore, session_id: str, *, owner: str, now: float) -> bool:
    """A reuse of an away session's handle, recorded in its log (its writes stay frozen until a
    rejoin reconciles). A session served by a call elsewhere is left to that call: taking its
    lease would end it. Whether it was recorded."""
    try:
        state = DurableSession.load(store, session_id).state
        if state.signaling is not Signaling.AWAY:
            return False
        if store.handles_used(session_id) > state.signaling_generation:
            # A rejoin rotated a handle and has not logged "rejoined" yet (it is between its
            # take-over and its first write, on another worker): the session is its call's,
            # and taking the lease now would hang that caller up. Counted, not recorded.
            return False
        session = DurableSession.take_over(store, session_id, owner=owner, now=now)
        session.apply(ResumeReused(), now)
    except StoreError:
        return False
    return True
