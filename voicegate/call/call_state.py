"""What every part of one live call reads: its phase, media channel, durable session and agent.

The parts of a call (voicegate/call/*.py) each own their own state; this is the little they
share. The call's task (live_call.py) sets the channel, the session and the agent; the phase is
moved on by the task (answered, ended, halted) and by the hang-up that sends the BYE (hangup.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agents.base import Agent
from session.durable import DurableSession
from session.state import Outstanding, SessionState
from telephony.media_bridge import MediaChannel


class CallPhase(enum.Enum):
    RINGING = "ringing"
    ANSWERED = "answered"
    ENDING = "ending"
    ENDED = "ended"


@dataclass(slots=True)
class CallState:
    call_id: str
    tenant: str = "default"  # config/tenants.py: its agent and transfer settings apply
    phase: CallPhase = CallPhase.RINGING
    channel: MediaChannel | None = None
    session: DurableSession | None = None
    agent: Agent | None = None
    # Set by the session's ReleaseMedia effect: no caller audio in, no agent audio out.
    media_released: bool = False
    # A call we placed (voicegate/call/legs.py), not one offered to us.
    outbound: bool = False

    @property
    def session_state(self) -> SessionState | None:
        return self.session.state if self.session else None

    def next_id(self, kind: str, n: int) -> str:
        """The ``n``-th turn (``t``) or response (``r``) id of this call, unique within its
        session: a call that rejoined or called back (signaling generation g > 0) numbers its
        own from 1 again, so its ids carry the generation (``g2.r1``), and the log never holds
        two responses or turns with one id."""
        state = self.session_state
        generation = state.signaling_generation if state is not None else 0
        return f"{kind}{n}" if generation == 0 else f"g{generation}.{kind}{n}"

    def current_turn(self) -> str:
        state = self.session_state
        return state.turn.turn_id if state and state.turn else ""

    def outstanding(self, key: str) -> Outstanding | None:
        state = self.session_state
        if state is None:
            return None
        return next((o for o in state.outstanding if o.key == key), None)
