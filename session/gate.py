"""The side-effect gate (seed 000): frozen by any interruption, opened only by reconciliation.

``open`` admits new turns, responses and write tools; ``frozen`` (an interruption is running) and
``reconciling`` (transport back, outstanding intents being queried) admit only status queries and
reads; ``closed`` is for good (the session ended). The frozen time runs from the freeze through
reconciliation, and each change is reported with it (a ``GateChanged`` effect).

The gate moves the ledger's stages (session/ledger.py): leaving ``open`` holds every write
admitted and not yet sent; reopening releases them (sent, or settled if their approval lapsed).
"""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session import ledger
from session.errors import GateClosed
from session.events import Event
from session.state import Gate, SessionState, Signaling

_HELD = (Gate.FROZEN, Gate.RECONCILING)
_CALLER_THERE = frozenset(
    {Signaling.OFFERED, Signaling.UP, Signaling.REINVITE_PENDING, Signaling.TRANSFERRING}
)


def set_gate(state: SessionState, gate: Gate, now: float, out: fx.Effects) -> SessionState:
    """Move the gate to ``gate`` (no effect if it is there already)."""
    if state.gate is gate:
        return state
    frozen_s = 0.0
    if state.gate in _HELD and state.gate_since is not None:
        frozen_s = now - state.gate_since
    if gate is Gate.OPEN or gate is Gate.CLOSED:
        since = None
    elif state.gate in _HELD:
        since = state.gate_since  # frozen time runs on through reconciliation
        frozen_s = 0.0
    else:
        since = now
    out.append(fx.GateChanged(state.gate.value, gate.value, round(frozen_s, 6)))
    outstanding = state.outstanding
    if state.gate is Gate.OPEN:
        outstanding = ledger.hold(outstanding)
    elif gate is Gate.OPEN and state.signaling in _CALLER_THERE:
        # Only for a caller on the line (or calling back): a session whose call is gone, away
        # or dropped sends nothing; its held writes go when a caller is back and it reopens.
        outstanding = ledger.release(outstanding, now, out)
    return replace(state, gate=gate, gate_since=since, outstanding=outstanding)


def reconcile(state: SessionState, now: float, out: fx.Effects) -> SessionState:
    """The transport is back: open the gate, or first ask about the outstanding intents."""
    if state.gate is Gate.CLOSED:
        return state
    keys = ledger.to_query(state.outstanding)
    if not keys:
        # Seed 000: no outstanding calls -> open the gate (the old response stays cancelled).
        # Held intents are not outstanding calls: they never left, and go now.
        return set_gate(state, Gate.OPEN, now, out)
    state = set_gate(state, Gate.RECONCILING, now, out)
    out.append(fx.Reconcile(keys))
    return state


def require_open(state: SessionState, event: Event, what: str) -> None:
    """Refuse new work (``what``: turn, response, write tool call) unless the gate is open."""
    if state.gate is not Gate.OPEN:
        raise GateClosed(state, event, f"no new {what} while the gate is {state.gate.value}")
