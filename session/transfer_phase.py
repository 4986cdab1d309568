"""The transfer phase's primitives, shared by the transfer's transitions (session.transfer), the
bridge's (session.bridge) and every ending (session.ending): whether an event belongs to the
transfer under way, and the phase's end."""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session.deadlines import Timer, drop
from session.state import SessionState
from session.vocabulary import TransferOutcome

TRANSFER_MODES = ("blind", "bridge", "attended")  # what transfer_started may name


def stale(state: SessionState, generation: int) -> str | None:
    """Why an event of the transfer of ``generation`` is stale, or None if it is the one under
    way's."""
    transfer = state.transfer
    if transfer is None:
        return "no transfer is in progress"
    if generation != transfer.generation:
        return f"generation {generation} is not the transfer's {transfer.generation}"
    return None


def end_phase(
    state: SessionState, outcome: TransferOutcome, now: float, out: fx.Effects
) -> SessionState:
    """The transfer phase is over (``outcome``): reported, and its guard dropped. The signaling
    state is the caller's to set (with the target, back with the agent, gone)."""
    transfer = state.transfer
    if transfer is None:
        return state
    out.append(
        fx.TransferEnded(
            transfer.generation, transfer.mode, outcome.value, round(now - transfer.started_at, 6)
        )
    )
    return drop(replace(state, transfer=None), (Timer.TRANSFER,), out)
