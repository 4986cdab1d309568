"""The typed refusals of the session machine (STYLE.md habit 1).

An event the machine cannot take raises one of these, naming the state it met and the event, and
changes nothing; the caller decides what the peer is told.
"""

from __future__ import annotations

from session.events import Event
from session.state import SessionState


class IllegalTransition(Exception):
    """``event`` cannot happen in ``state``; nothing changed. The caller decides what to answer."""

    def __init__(self, state: SessionState, event: Event, why: str) -> None:
        self.state_status = state.status()
        self.event_type = event.type
        self.why = why
        super().__init__(f"{event.type} is illegal in state [{self.state_status}]: {why}")


class GateClosed(IllegalTransition):
    """New work (a turn, a response, a write) while the side-effect gate is not open."""


class SessionTerminated(IllegalTransition):
    """Anything after the session reached its terminal state."""


__all__ = ["GateClosed", "IllegalTransition", "SessionTerminated"]
