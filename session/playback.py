"""Playback generations: how a cancelled response is kept from playing on.

Every cut (an interruption, a barge-in, the end) bumps ``playback_generation`` and clears the
playout queue in the same step; only audio of the current generation may play (seed 000, "cancel/
isolate the old response").
"""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session.errors import IllegalTransition
from session.events import Event, PromptCut
from session.state import SessionState


def cut_playback(state: SessionState, out: fx.Effects) -> SessionState:
    """Cancel the active response and bump the playback generation, in one step."""
    if state.response is not None:
        out.append(fx.CancelResponse(state.response.response_id))
        out.append(fx.StopGeneration())
    return bump_generation(replace(state, response=None), out)


def bump_generation(state: SessionState, out: fx.Effects) -> SessionState:
    """Clear the playout queue: only chunks of the next generation may play from now on."""
    generation = state.playback_generation + 1
    out.append(fx.ClearPlayout(generation))
    return replace(state, playback_generation=generation)


def end_response(state: SessionState, event: Event, response_id: str) -> SessionState:
    """The active response is over (played out or barged into); so is the turn it answered."""
    if state.response is None or state.response.response_id != response_id:
        raise IllegalTransition(state, event, f"response {response_id} is not active")
    turn = state.turn
    if turn is not None and turn.turn_id == state.response.turn_id:
        turn = None
    return replace(state, response=None, turn=turn)


def on_prompt_cut(
    state: SessionState, event: PromptCut, now: float
) -> tuple[SessionState, fx.Effects]:
    """A record for the log and the handoff: the session's lines are not a state of the machine,
    and the cut itself is the step written after it."""
    return state, []
