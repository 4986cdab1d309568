"""A transfer under way: its own phase, not a recovery (issue 35).

A transfer halts the session as an interruption does (seed 000: the gate freezes, the response
is cut, the tool requests on the wire are abandoned, never resent), but nothing of ours is
broken and nothing is retried: the caller's side carries out a REFER (RFC 5589 section 6), or we
call the target ourselves (a bridge, an attended consult leg, section 7). So it has its own
state (``SessionState.transfer``: generation, mode, stage, start), its own guard
(``transfer_notify``, ``Policy.transfer_timeout_s`` from the start, brief and consultation
included) and its own end (:class:`~session.effects.TransferEnded`, counted in
``voicegate_transfer_duration_seconds``): an attended transfer that waits a minute for a person
is a slow transfer, not a failed recovery, and no recovery metric or alert counts it.

While it runs, a media gap or the agent's link dropping is recorded in its dimension and not
recovered: the caller is being handed over, and "one moment, I am reconnecting" would be wrong.
If the transfer fails and the caller comes back to the agent, what is still broken then starts
its recovery; otherwise the gate reconciles (seed 000: never straight to open with something
outstanding).

The transitions here are the ones :mod:`session.machine`'s table names for transfer events;
:mod:`session.bridge` adds the bridge's; :mod:`session.transfer_phase` holds what the endings
share (the phase's end, its stale check).
"""

from __future__ import annotations

from dataclasses import replace

from session import away, ending
from session import effects as fx
from session import events as ev
from session.deadlines import Timer, arm
from session.errors import IllegalTransition
from session.gate import reconcile
from session.recovery import halt, interrupt
from session.state import AgentLink, Media, SessionState, Signaling, Terminal, Transfer
from session.transfer_phase import TRANSFER_MODES, end_phase, stale
from session.vocabulary import EndingStage, Interruption, TransferOutcome, TransferStage

Result = tuple[SessionState, fx.Effects]

# Status 408 stands for the guard's own timeout (no final NOTIFY, nobody answered in time).
GUARD_STATUS = 408
_FIRST_STAGE = {
    "blind": TransferStage.REFERRING,
    "bridge": TransferStage.CALLING,
    "attended": TransferStage.CALLING,
}


def on_transfer_started(state: SessionState, event: ev.TransferStarted, now: float) -> Result:
    if state.recovery is not None:
        # The REFER would go out on a dialog whose media or agent is still being recovered; the
        # caller could not be taken back honestly if it failed. Recover first.
        raise IllegalTransition(state, event, "the call is recovering")
    if event.mode not in TRANSFER_MODES:
        raise IllegalTransition(state, event, f"no transfer mode {event.mode!r}")
    out: fx.Effects = []
    state = halt(state, now, out)
    generation = state.recovery_generation + 1
    out.append(fx.NotifyAgent("interrupted", Interruption.TRANSFER))
    state = replace(
        state,
        signaling=Signaling.TRANSFERRING,
        transfer_target=event.target,
        transfer_status=0,
        transfer=Transfer(generation, event.mode, now, _FIRST_STAGE[event.mode]),
        recovery_generation=generation,
    )
    # RFC 5589: the outcome comes in NOTIFYs (or our leg's answer), pjsua's subscription would
    # wait 600 s for them: our guard decides, and takes the caller back to the agent.
    state = arm(state, Timer.TRANSFER, now + state.policy.transfer_timeout_s, generation, out)
    if event.mode == "attended":
        # RFC 5589 section 7: the caller waits while we consult the target; told so, honestly.
        out.append(fx.Say("transfer_consulting"))
    return state, out


def on_transfer_progress(state: SessionState, event: ev.TransferProgress, now: float) -> Result:
    # A NOTIFY comes only once the REFER was accepted (pjsua reports the REFER's 2xx as 100).
    transfer = state.transfer
    if transfer is not None and transfer.stage is not TransferStage.REFERRED:
        state = replace(state, transfer=replace(transfer, stage=TransferStage.REFERRED))
    return replace(state, transfer_status=event.status), []


def on_transfer_fell_back(state: SessionState, event: ev.TransferFellBack, now: float) -> Result:
    """The REFER was refused: the transfer stays under way (same guard), now as a bridge."""
    if why := stale(state, event.generation):
        return state, [fx.StaleEventIgnored(event.type, why)]
    assert state.transfer is not None
    transfer = replace(state.transfer, mode="bridge", stage=TransferStage.CALLING)
    return replace(state, transfer=transfer, transfer_status=event.status), []


def on_consult_answered(state: SessionState, event: ev.ConsultAnswered, now: float) -> Result:
    """An attended transfer's consult leg answered: the person is consulted, the REFER with
    Replaces follows (RFC 5589 section 7); the transfer stays under way until its final
    NOTIFY."""
    if why := stale(state, event.generation):
        return state, [fx.StaleEventIgnored(event.type, why)]
    assert state.transfer is not None
    return replace(state, transfer=replace(state.transfer, stage=TransferStage.CONSULTING)), []


def on_transfer_finished(state: SessionState, event: ev.TransferFinished, now: float) -> Result:
    if why := stale(state, event.generation):
        return state, [fx.StaleEventIgnored(event.type, why)]
    out: fx.Effects = []
    if not event.ok:
        return back_to_agent(state, event.status, _failure(state, event.status), now, out), out
    # The caller is with the target now: this session's part ends, honestly, and our BYE goes
    # only now, after the final 2xx NOTIFY (RFC 5589 section 6). No prompt: the caller is
    # talking to someone else.
    state = replace(state, transfer_status=event.status or 200)
    state = end_phase(state, TransferOutcome.COMPLETED, now, out)
    if away.may_go_away(state):
        # Not the end yet: the caller may come back with the session's handle (session.away).
        return away.go_away(state, now, out), out
    if state.outstanding:
        reason = f"transferred with {ending.unknown_outcomes(state)}"
        return ending.terminate(
            state, Terminal.NEEDS_HUMAN, reason, EndingStage.TRANSFER, now, out, caller_present=True
        ), out
    return ending.terminate(
        state, Terminal.COMPLETED, "transferred", None, now, out, caller_present=True
    ), out


def on_guard_fired(state: SessionState, now: float, out: fx.Effects) -> SessionState:
    """No outcome in time: we stop waiting (seed 001: a deadline) and take the caller back; a
    NOTIFY or an answer that still comes is stale."""
    return back_to_agent(state, GUARD_STATUS, TransferOutcome.TIMED_OUT, now, out)


def back_to_agent(
    state: SessionState, status: int, outcome: TransferOutcome, now: float, out: fx.Effects
) -> SessionState:
    """RFC 5589 section 6.1 (failed transfer): the caller stays with us and the agent, and is
    told honestly that nobody could be reached. What broke meanwhile is recovered now; else
    the gate reconciles (seed 000's table) before the agent may act again."""
    transfer = state.transfer
    state = replace(state, signaling=Signaling.UP, transfer_status=status)
    state = end_phase(state, outcome, now, out)
    out.append(fx.NotifyAgent("resumed", Interruption.TRANSFER))
    broken = []
    if state.media is Media.INTERRUPTED:
        broken.append(Interruption.MEDIA)
    if state.agent_link is AgentLink.LOST:
        broken.append(Interruption.AGENT_LINK)
    # Under the transfer's generation: the restoring event of a gap that began during the
    # transfer names it (the runtime's, and logs from when a transfer ran as a recovery).
    generation = transfer.generation if transfer is not None else None
    for kind in broken:
        state = interrupt(state, kind, now, out, generation=generation)
    if not broken:
        state = reconcile(state, now, out)
    out.append(fx.Say("transfer_failed"))
    out.append(fx.NotifyAgent("transfer_failed", str(status)))
    return state


def _failure(state: SessionState, status: int) -> TransferOutcome:
    """What a failed ``status`` means where the transfer is (the metric's outcome)."""
    transfer = state.transfer
    stage = transfer.stage if transfer is not None else TransferStage.REFERRED
    if stage is TransferStage.REFERRING:
        return TransferOutcome.REFUSED  # the REFER itself, before the far end accepted it
    if stage in (TransferStage.CALLING, TransferStage.CONSULTING):
        if status == 487:
            return TransferOutcome.CANCELED
        if status == 603 and stage is TransferStage.CONSULTING:
            return TransferOutcome.DECLINED
        if status == 503:
            return TransferOutcome.REFUSED  # no slot, or the target's side unavailable
    return TransferOutcome.FAILED
