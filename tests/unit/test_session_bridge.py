"""A bridged transfer in the session machine (session.bridge): the transfer's freeze and guard,
then bridged until one side hangs up; a REFER refused falls back to a bridge; a target that never
answers takes the caller back to the agent."""

from __future__ import annotations

import pytest

from session import effects as fx
from session import events as ev
from session.machine import IllegalTransition, step
from session.state import Gate, SessionState, Signaling

SID = "sess-b"
POLICY = {"recovery_timeout_s": 10.0, "max_duration_s": 600.0, "transfer_timeout_s": 30.0}
TARGET = "sip:desk@cc.example.com"


def fold(*timed: tuple[ev.Event, float]) -> tuple[SessionState, list[fx.Effect]]:
    state, effects = SessionState(SID), []
    for event, at in timed:
        state, effects = step(state, event, at)
    return state, effects


UP = ((ev.CallOffered("+15550001234", "svc", POLICY), 0.0), (ev.CallAnswered(), 1.0))
SPEAKING = (*UP, (ev.TurnStarted("t1"), 2.0), (ev.TurnCommitted("t1"), 2.5))
SPEAKING = (*SPEAKING, (ev.ResponseStarted("r1", "t1"), 3.0))
BRIDGING = (*SPEAKING, (ev.TransferStarted(TARGET, "bridge"), 10.0))
BRIDGED = (*BRIDGING, (ev.BridgeUp(1), 12.0))


def test_a_bridge_starts_like_any_transfer() -> None:
    state, effects = fold(*BRIDGING)
    assert state.signaling is Signaling.TRANSFERRING and state.gate is Gate.FROZEN
    assert fx.CancelResponse("r1") in effects
    assert fx.ScheduleTimer("transfer_notify", 40.0, 1) in effects


def test_bridged_the_transfer_ends_and_the_gate_stays_frozen_for_the_people_talking() -> None:
    state, effects = fold(*BRIDGED)
    assert state.signaling is Signaling.BRIDGED and state.transfer is None
    assert state.recovery is None
    assert state.gate is Gate.FROZEN and state.transfer_status == 200
    assert fx.CancelTimer("transfer_notify") in effects
    # The transfer phase is over (completed, 2 s after it began); no recovery ever ran.
    assert fx.TransferEnded(1, "bridge", "completed", 2.0) in effects
    assert not any(isinstance(e, fx.RecoveryFinished | fx.StartRecovery) for e in effects)
    # No turns while bridged: the caller talks to a person, not to the agent.
    with pytest.raises(IllegalTransition):
        step(state, ev.TurnStarted("t2"), 13.0)
    # The guard's timer, if it fires anyway, changes nothing.
    after, out = step(state, ev.DeadlineFired("transfer_notify", 1), 40.0)
    assert after == state and isinstance(out[0], fx.StaleEventIgnored)


@pytest.mark.parametrize(
    ("event", "reason", "our_bye"),
    [
        (ev.BridgeEnded("target"), "bridged: the target hung up", True),
        (ev.BridgeEnded("caller"), "bridged: the caller hung up", False),
        (ev.CallerHangup(), "bridged: the caller hung up", False),
    ],
)
def test_either_side_hanging_up_ends_the_session_completed(
    event: ev.Event, reason: str, our_bye: bool
) -> None:
    state, _ = fold(*BRIDGED)
    state, effects = step(state, event, 60.0)
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.reason) == ("completed", reason)
    assert any(isinstance(e, fx.HangUp) for e in effects) is our_bye
    assert not any(isinstance(e, fx.Say) for e in effects)


def test_an_operator_hang_up_of_a_bridged_call_byes_the_caller() -> None:
    state, _ = fold(*BRIDGED)
    state, effects = step(state, ev.ServerHangup("canceled", "hung up by operator"), 60.0)
    assert state.ended is not None and fx.HangUp("hung up by operator") in effects


def test_a_tool_outcome_unknown_at_the_end_is_needs_human_at_stage_transfer() -> None:
    intent = (ev.ToolIntent("k1", "charge", "write", "d", "t1"), 4.0)
    sent = (ev.ToolRequestSent("k1"), 4.5)
    state, _ = fold(*SPEAKING, intent, sent, (ev.TransferStarted(TARGET, "bridge"), 10.0))
    state, _ = step(state, ev.BridgeUp(1), 12.0)
    state, _ = step(state, ev.BridgeEnded("caller"), 60.0)
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage) == ("needs_human", "transfer")


def test_a_target_that_does_not_answer_takes_the_caller_back_with_an_honest_line() -> None:
    state, effects = step(fold(*BRIDGING)[0], ev.TransferFinished(1, ok=False, status=486), 15.0)
    assert state.signaling is Signaling.UP
    assert fx.Say("transfer_failed") in effects


def test_a_refused_refer_falls_back_to_a_bridge_under_the_same_guard() -> None:
    blind = (*SPEAKING, (ev.TransferStarted(TARGET), 10.0))
    state, effects = step(fold(*blind)[0], ev.TransferFellBack(1, 603), 10.5)
    assert state.signaling is Signaling.TRANSFERRING and state.transfer_status == 603
    assert effects == []  # no "I could not reach a colleague": the bridge is tried first
    state, _ = step(state, ev.BridgeUp(1), 12.0)
    assert state.signaling is Signaling.BRIDGED


def test_bad_modes_and_enders_are_refused_and_change_nothing() -> None:
    up, _ = fold(*UP)
    with pytest.raises(IllegalTransition):
        step(up, ev.TransferStarted(TARGET, "consultative"), 5.0)
    bridged, _ = fold(*BRIDGED)
    with pytest.raises(IllegalTransition):
        step(bridged, ev.BridgeEnded("nobody"), 60.0)
    with pytest.raises(IllegalTransition):
        step(up, ev.BridgeEnded("caller"), 5.0)


def test_an_attended_transfer_tells_the_caller_to_hold_and_records_the_consult_answer() -> None:
    state, effects = fold(*SPEAKING, (ev.TransferStarted(TARGET, "attended"), 10.0))
    assert fx.Say("transfer_consulting") in effects and state.gate is Gate.FROZEN
    state, effects = step(state, ev.ConsultAnswered(1), 11.0)
    assert state.signaling is Signaling.TRANSFERRING and effects == []
    # The REFER with Replaces then ends it like a blind transfer: a final 2xx NOTIFY.
    state, effects = step(state, ev.TransferFinished(1, ok=True, status=200), 12.0)
    assert state.ended is not None and state.ended.reason == "transferred"
    # A consult that fails instead takes the caller off hold, back to the agent.
    failed, effects = step(
        fold(*SPEAKING, (ev.TransferStarted(TARGET, "attended"), 10.0))[0],
        ev.TransferFinished(1, ok=False, status=486),
        11.0,
    )
    assert failed.signaling is Signaling.UP and fx.Say("transfer_failed") in effects


# The server's default session policy: a no-input ladder of 60 s, then 10 s of grace.
LADDER = {**POLICY, "no_input_s": 60.0, "no_input_grace_s": 10.0}
QUIET_UP = ((ev.CallOffered("+15550001234", "svc", LADDER), 0.0), (ev.CallAnswered(), 1.0))
QUIET_SPEAKING = (*QUIET_UP, (ev.TurnStarted("t1"), 2.0), (ev.TurnCommitted("t1"), 2.5))
QUIET_BRIDGED = (
    *QUIET_SPEAKING,
    (ev.TransferStarted(TARGET, "bridge"), 10.0),
    (ev.BridgeUp(1), 12.0),
)


def fire_due(state: SessionState, until: float) -> tuple[SessionState, list[fx.Effect]]:
    """The fake clock runs to ``until``: every deadline due by then fires, in due order."""
    seen: list[fx.Effect] = []
    while state.ended is None and state.deadlines:
        name, deadline = min(state.deadlines.items(), key=lambda item: item[1].due)
        if deadline.due > until:
            break
        state, out = step(state, ev.DeadlineFired(name, deadline.generation), deadline.due)
        seen.extend(out)
    return state, seen


def test_a_bridged_call_is_not_hung_up_for_the_callers_silence() -> None:
    state, effects = fold(*QUIET_BRIDGED)
    assert fx.CancelTimer("no_input") in effects
    assert set(state.deadlines) == {"max_duration"}  # the call's cost still bounds it
    # Past the ladder's 60 + 10 s, up to max duration: nobody asked "still there?", nothing ended.
    state, seen = fire_due(state, 590.0)
    assert state.ended is None and state.signaling is Signaling.BRIDGED
    assert not any(isinstance(e, fx.Say | fx.HangUp) for e in seen)
    state, seen = fire_due(state, 601.0)
    assert state.ended is not None and state.ended.stage == "max_duration"


def test_a_turn_open_when_the_bridge_began_does_not_restart_the_ladder() -> None:
    talking = (*QUIET_UP, (ev.TurnStarted("t1"), 2.0))
    state, _ = fold(*talking, (ev.TransferStarted(TARGET, "bridge"), 10.0), (ev.BridgeUp(1), 12.0))
    state, effects = step(state, ev.TurnCommitted("t1"), 13.0)
    assert "no_input" not in state.deadlines
    assert not any(isinstance(e, fx.ScheduleTimer) for e in effects)


@pytest.mark.parametrize(
    "event", [ev.AgentLinkFailed("link lost for good"), ev.AgentFailed("on_transfer raised")]
)
def test_the_agent_going_away_while_bridged_ends_nothing(event: ev.Event) -> None:
    state, _ = fold(*QUIET_BRIDGED)
    after, effects = step(state, event, 30.0)
    assert after == state and after.ended is None
    assert len(effects) == 1 and isinstance(effects[0], fx.StaleEventIgnored)
    # The people still end the call as usual.
    after, _ = step(after, ev.BridgeEnded("target"), 90.0)
    assert after.ended is not None and after.ended.terminal_state == "completed"
