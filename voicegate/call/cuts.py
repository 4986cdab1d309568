"""What a session event is about to cut, found before the event is applied (issue 35).

The session machine cuts playback itself on an interruption (lost media, a re-INVITE, a transfer,
a dropped agent link) and on every ending (session/playback.py ``cut_playback``): the response it
was playing is over inside the machine in that same step, so a ``response_interrupted`` written
after it would be stale. What the caller heard has to be recorded first. The machine is pure, so
stepping the event on the current state and throwing the result away says, without changing
anything, whether the event will cut the playout, and which response with it;
voicegate/call/acting.py asks this before every step and has the call cut and record first
(voicegate/call/responses.py ``Responses.cut_for_session``).
"""

from __future__ import annotations

from dataclasses import dataclass

from session import effects as fx
from session import events as sev
from session.machine import IllegalTransition, step
from session.state import SessionState
from session.vocabulary import Interruption

# The interruptions that cut playback, by the event that starts them: the reason a PlaybackCut
# gives the agent (docs/agent-protocol.md, "Cuts": playback.cleared's reasons).
_INTERRUPTED_BY: dict[type[sev.Event], Interruption] = {
    sev.MediaLost: Interruption.MEDIA,
    sev.ReinviteStarted: Interruption.REINVITE,
    sev.TransferStarted: Interruption.TRANSFER,
    sev.AgentLinkLost: Interruption.AGENT_LINK,
}


@dataclass(frozen=True, slots=True)
class SessionCut:
    """``event`` will clear the playout: ``reason`` is the PlaybackCut reason the agent gets,
    ``response_id`` the agent's response the step cancels (None when only the session's own
    lines are playing), ``stops_generation`` whether the step tells the agent to stop producing
    (recording the cut first ends the response, so the step itself no longer says it)."""

    reason: str
    response_id: str | None
    stops_generation: bool


def cut_ahead(state: SessionState, event: sev.Event, now: float) -> SessionCut | None:
    """The cut ``event`` would make if applied to ``state`` now, or None (no cut, or the machine
    refuses the event: then nothing is cut ahead of it either). Pure: ``state`` is untouched."""
    if isinstance(event, sev.ResponseInterrupted):
        return None  # a barge-in or a cancel: the call cut the playout before writing it
    try:
        after, effects = step(state, event, now)
    except IllegalTransition:
        return None
    if not any(isinstance(effect, fx.ClearPlayout) for effect in effects):
        return None
    cancelled = next((e.response_id for e in effects if isinstance(e, fx.CancelResponse)), None)
    stops = any(isinstance(effect, fx.StopGeneration) for effect in effects)
    return SessionCut(cut_reason(event, after), cancelled, stops)


def cut_reason(event: sev.Event, after: SessionState) -> str:
    """Why the session cut playback, in docs/agent-protocol.md's words: ``timeout`` (a deadline
    ended the call), ``ending`` (any other ending: a hang-up by either side, the server shutting
    down, a failed dialog), or the interruption ``event`` starts (``media``, ``reinvite``,
    ``transfer``, ``agent_link``). Named by the event, not by the recovery it may start or join:
    a transfer is not always run as a recovery."""
    ended = after.ended
    if ended is not None:
        return "timeout" if ended.terminal_state == "timed_out" else "ending"
    kind = _INTERRUPTED_BY.get(type(event))
    if kind is None and after.recovery is not None:
        # A transfer that failed with the media (or the agent's link) still broken: the call
        # goes on, and the recovery the step started cut the playout.
        return after.recovery.interruptions[-1]
    return kind.value if kind is not None else "ending"
