"""Bridged transfer: voicegate calls the target itself and stays in the media path (the
conference bridge carries the caller's audio to the target and back) until one side hangs up.
Also the one step an attended transfer adds to a blind one: its consult leg answered.

Sans-IO, the handlers :mod:`session.machine`'s table names for the bridge's events (a refused
REFER falling back to a bridge, and the consult leg's answer, are session.transfer's). A bridge is
a transfer (``transfer_started`` with mode ``bridge``, or a blind one that ``transfer_fell_back``
after its REFER was refused): the gate freezes, the response is cut, and the transfer's guard
runs, as for a blind transfer. Then:

- ``bridge_up`` (the target answered, media connected): signaling ``bridged``; the transfer
  phase ends ``completed`` (the caller is with a person now, not waiting for us) and every
  deadline but max duration is dropped (the guard, no-input's ladder). The gate stays frozen:
  no turns, responses or tools while people talk, and the agent's link dropping or the agent
  failing ends nothing: its part is over.
- ``bridge_ended``: whoever hung up, the session ends ``completed``, reason "bridged: the caller
  hung up" or "bridged: the target hung up" (``needs_human`` at stage ``transfer`` with a tool
  outcome still unknown, as for a blind transfer); the side still there gets our BYE.
- the target's leg not answered in time, busy or failed: ``transfer_finished`` with ``ok`` false,
  the blind transfer's failure path (RFC 5589 section 6.1: the caller stays with the agent and
  hears "I could not reach a colleague").
"""

from __future__ import annotations

from dataclasses import replace

from session import effects as fx
from session import ending
from session import events as ev
from session.deadlines import KEPT_WHEN_BRIDGED, drop
from session.errors import IllegalTransition
from session.state import SessionState, Signaling
from session.transfer_phase import end_phase, stale
from session.vocabulary import EndingStage, Terminal, TransferOutcome

Result = tuple[SessionState, fx.Effects]

BRIDGE_ENDERS = ("caller", "target")


def on_bridge_up(state: SessionState, event: ev.BridgeUp, now: float) -> Result:
    if why := stale(state, event.generation):
        return state, [fx.StaleEventIgnored(event.type, why)]
    out: fx.Effects = []
    state = end_phase(state, TransferOutcome.COMPLETED, now, out)
    # The rest of the timers, and no-input's ladder: its "still there?" would reach nobody (our
    # media port is off the caller) and its end would hang up on two people talking.
    dropped = tuple(name for name in sorted(state.deadlines) if name not in KEPT_WHEN_BRIDGED)
    state = drop(state, dropped, out)
    return replace(state, signaling=Signaling.BRIDGED, transfer_status=200), out


def on_bridge_ended(state: SessionState, event: ev.BridgeEnded, now: float) -> Result:
    if event.by not in BRIDGE_ENDERS:
        raise IllegalTransition(state, event, f"by must be one of {', '.join(BRIDGE_ENDERS)}")
    out: fx.Effects = []
    who = "the caller" if event.by == "caller" else "the target"
    reason = f"bridged: {who} hung up"
    terminal, stage = Terminal.COMPLETED, None
    if state.outstanding:
        terminal, stage = Terminal.NEEDS_HUMAN, EndingStage.TRANSFER
        reason = f"{reason}, {ending.unknown_outcomes(state)}"
    # The caller is still on the line when the target left: our BYE ends the caller's leg.
    return ending.terminate(
        state, terminal, reason, stage, now, out, caller_present=event.by == "target"
    ), out
