"""The session state machine, one rule per test, on a fake clock (plain floats).

Each test states the events, the exact effects (types, fields and order) and the state they leave,
for the rules of seed 000 (disconnect recovery, timeouts, terminal states) and seed 001 (separate
dimensions, one recovery generation with a deadline and bounded retries). Tests marked ``xfail``
pin bugs found in the machine; each fails until that bug is fixed (``strict`` then flags it).
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Any, ClassVar

import pytest

from session import effects as fx
from session import events as ev
from session.callback import may_park
from session.machine import (
    GateClosed,
    IllegalTransition,
    SessionTerminated,
    replay,
    retry_delay,
    step,
)
from session.state import (
    AgentLink,
    Deadline,
    Gate,
    Media,
    Outstanding,
    Policy,
    Recovery,
    Response,
    SessionState,
    Signaling,
    Turn,
)
from session.vocabulary import IntentStage

SID = "sess-1"
POLICY: dict[str, float] = {
    "recovery_timeout_s": 10.0,
    "honesty_after_s": 2.0,
    "max_duration_s": 600.0,
    "retry_base_s": 0.5,
    "retry_cap_s": 2.0,
    "retry_max_attempts": 4,
}
P = Policy.from_dict(POLICY)
T_ANSWER = 1.0
T_LOST = 10.0  # when the interruptions of these tests happen

Timed = list[tuple[ev.Event, float]]


def run(state: SessionState, timed: Timed) -> tuple[SessionState, list[list[fx.Effect]]]:
    """Fold ``timed`` into ``state``, keeping each step's effects."""
    all_effects = []
    for event, at in timed:
        state, effects = step(state, event, at)
        all_effects.append(effects)
    return state, all_effects


def offered(policy: dict[str, float] | None = None) -> SessionState:
    state, _ = step(
        SessionState(SID), ev.CallOffered("+15550001234", "service", policy or POLICY), 0
    )
    return state


def answered(policy: dict[str, float] | None = None) -> SessionState:
    state, _ = step(offered(policy), ev.CallAnswered(), T_ANSWER)
    return state


def speaking() -> SessionState:
    """Answered, turn t1 committed, response r1 playing (playback generation 0)."""
    state, _ = run(
        answered(),
        [
            (ev.TurnStarted("t1"), 2.0),
            (ev.TurnCommitted("t1"), 3.0),
            (ev.ResponseStarted("r1", "t1"), 4.0),
        ],
    )
    return state


def with_sent_write(state: SessionState, key: str = "k1", at: float = 5.0) -> SessionState:
    state, _ = run(
        state,
        [
            (ev.ToolIntent(key, "book", "write", f"digest-{key}", "t1"), at),
            (ev.ToolRequestSent(key), at),
        ],
    )
    return state


def interrupted(state: SessionState, kind: str = "media") -> SessionState:
    state, _ = step(state, INTERRUPT[kind], T_LOST)
    return state


INTERRUPT: dict[str, ev.Event] = {
    "media": ev.MediaLost(),
    "reinvite": ev.ReinviteStarted(),
    "transfer": ev.TransferStarted("sip:desk@example.org"),
    "agent_link": ev.AgentLinkLost(),
}


def restore(kind: str, generation: int) -> ev.Event:
    return {
        "media": ev.MediaRestored(generation),
        "reinvite": ev.ReinviteFinished(generation, ok=True),
        "transfer": ev.TransferFinished(generation, ok=False),
        "agent_link": ev.AgentLinkRestored(generation),
    }[kind]


def refused(state: SessionState, event: ev.Event, now: float = 50.0) -> IllegalTransition:
    """Assert ``event`` is refused in ``state`` with a message naming both; return the error."""
    before = state.to_dict()
    with pytest.raises(IllegalTransition) as caught:
        step(state, event, now)
    assert state.to_dict() == before
    assert caught.value.event_type == event.type
    assert event.type in str(caught.value)
    assert state.status() in str(caught.value)
    return caught.value


# --- happy path ---------------------------------------------------------------------------------


def test_an_offered_call_takes_its_policy_and_changes_nothing_else() -> None:
    state, effects = step(SessionState(SID), ev.CallOffered("+15550001234", "service", POLICY), 0)
    assert effects == []
    assert state == SessionState(SID, version=1, policy=P, signaling=Signaling.OFFERED)


def test_answering_starts_media_and_arms_the_maximum_duration() -> None:
    state, effects = step(offered(), ev.CallAnswered(), 1.5)
    assert effects == [fx.ScheduleTimer("max_duration", 601.5, 0)]
    assert (state.signaling, state.media, state.media_since, state.answered_at) == (
        Signaling.UP,
        Media.FLOWING,
        1.5,
        1.5,
    )
    assert state.deadlines == {"max_duration": Deadline(601.5, 0)}
    assert state.gate is Gate.OPEN and state.version == 2


def test_a_turn_and_its_response_run_through_an_open_gate() -> None:
    state, effects = run(
        answered(),
        [
            (ev.TurnStarted("t1"), 2.0),
            (ev.TurnCommitted("t1"), 3.0),
            (ev.ResponseStarted("r1", "t1"), 4.0),
        ],
    )
    assert effects == [[], [], [fx.BindResponse("r1", 0)]]
    assert state.turn == Turn("t1", committed=True)
    assert state.response == Response("r1", "t1", 0)
    assert state.version == 5

    done, effects_of_finish = step(state, ev.ResponseFinished("r1", heard_ms=1800), 6.0)
    assert effects_of_finish == []
    assert done.response is None and done.turn is None and done.version == 6


def test_caller_hangup_after_a_finished_response_completes_the_session() -> None:
    state, _ = step(speaking(), ev.ResponseFinished("r1", 1800), 6.0)
    ended, effects = step(state, ev.CallerHangup(), 7.0)
    assert effects == [
        fx.ClearPlayout(1),
        fx.CancelTimer("max_duration"),
        fx.GateChanged("open", "closed", 0.0),
        fx.ReleaseMedia(),
        fx.Finished("completed", "caller hung up", None),
    ]
    assert ended.ended is not None
    assert (ended.ended.terminal_state, ended.ended.reason, ended.ended.at) == (
        "completed",
        "caller hung up",
        7.0,
    )
    assert (ended.signaling, ended.media, ended.agent_link, ended.gate) == (
        Signaling.GONE,
        Media.RELEASED,
        AgentLink.CLOSED,
        Gate.CLOSED,
    )
    assert ended.deadlines == {} and ended.version == state.version + 1


def test_caller_hangup_before_answer_cancels_the_session() -> None:
    ended, effects = step(offered(), ev.CallerHangup(), 3.0)
    assert effects == [
        fx.ClearPlayout(1),
        fx.GateChanged("open", "closed", 0.0),
        fx.ReleaseMedia(),
        fx.Finished("canceled", "caller hung up before answer", None),
    ]
    assert ended.ended is not None and ended.ended.terminal_state == "canceled"
    assert ended.media is Media.NONE  # never had any to release


def test_step_moves_only_on_accepted_events() -> None:
    state, effects = step(SessionState(SID), ev.CallOffered("+15550001234", "service", POLICY), 0)
    assert effects == []
    before = state.to_dict()
    with pytest.raises(IllegalTransition):
        step(state, ev.TurnStarted("t1"), 0.5)
    assert state.to_dict() == before
    state, effects = step(state, ev.CallAnswered(), 1.0)
    assert effects == [fx.ScheduleTimer("max_duration", 601.0, 0)]
    assert state == answered()


# --- interruptions ------------------------------------------------------------------------------


DIMENSION_AFTER_LOSS: dict[str, tuple[Signaling, Media, AgentLink]] = {
    "media": (Signaling.UP, Media.INTERRUPTED, AgentLink.CONNECTED),
    "reinvite": (Signaling.REINVITE_PENDING, Media.FLOWING, AgentLink.CONNECTED),
    "transfer": (Signaling.TRANSFERRING, Media.FLOWING, AgentLink.CONNECTED),
    "agent_link": (Signaling.UP, Media.FLOWING, AgentLink.LOST),
}


# A transfer is an interruption with its own guard and no "reconnecting" line: test_transfer.py.
NOT_TRANSFER = [k for k in INTERRUPT if k != "transfer"]


@pytest.mark.parametrize("kind", NOT_TRANSFER)
def test_an_interruption_freezes_cuts_playback_and_starts_one_recovery_in_one_step(
    kind: str,
) -> None:
    before = speaking()
    state, effects = step(before, INTERRUPT[kind], T_LOST)
    first_retry = T_LOST + retry_delay(SID, 1, 0, P)
    assert effects == [
        fx.CancelResponse("r1"),
        fx.StopGeneration(),
        fx.ClearPlayout(1),
        fx.GateChanged("open", "frozen", 0.0),
        fx.StartRecovery(1, kind, T_LOST + 10.0),
        fx.NotifyAgent("interrupted", kind),
        fx.ScheduleTimer("recovery", T_LOST + 10.0, 1),
        fx.ScheduleTimer("honesty", T_LOST + 2.0, 1),
        fx.ScheduleTimer("recovery_retry", first_retry, 1, attempt=0),
    ]
    assert (state.signaling, state.media, state.agent_link) == DIMENSION_AFTER_LOSS[kind]
    assert (state.gate, state.gate_since) == (Gate.FROZEN, T_LOST)
    assert state.response is None and state.playback_generation == 1
    assert state.recovery == Recovery(1, (kind,), T_LOST, T_LOST + 10.0)
    assert state.recovery_generation == 1
    assert state.deadlines == {
        "max_duration": Deadline(601.0, 0),
        "recovery": Deadline(T_LOST + 10.0, 1),
        "honesty": Deadline(T_LOST + 2.0, 1),
        "recovery_retry": Deadline(first_retry, 1),
    }
    assert state.version == before.version + 1


def test_an_interruption_abandons_in_flight_tool_requests_but_keeps_their_intents() -> None:
    state = with_sent_write(answered())
    state, _ = run(state, [(ev.ToolIntent("k2", "book", "write", "d2", "t1"), 6.0)])
    after, effects = step(state, ev.MediaLost(), T_LOST)
    # k1 was sent (in flight); k2 was only admitted: it is held, to go when the gate reopens.
    assert effects[:3] == [
        fx.ClearPlayout(1),
        fx.GateChanged("open", "frozen", 0.0),
        fx.CancelToolCalls(("k1",)),
    ]
    assert isinstance(effects[3], fx.StartRecovery)
    k1, k2 = state.outstanding
    assert after.outstanding == (k1, replace(k2, stage=IntentStage.HELD))


def test_a_second_interruption_joins_the_running_recovery() -> None:
    state = interrupted(answered(), "media")
    state, effects = step(state, ev.AgentLinkLost(), 11.0)
    assert effects == [fx.ClearPlayout(2)]  # gate already frozen, no second recovery
    assert state.recovery == Recovery(1, ("media", "agent_link"), T_LOST, T_LOST + 10.0)
    assert state.recovery_generation == 1

    state, effects = step(state, ev.MediaRestored(1), 12.0)
    assert effects == []  # the agent link is still down: nothing opens
    assert state.recovery == Recovery(1, ("agent_link",), T_LOST, T_LOST + 10.0)
    assert state.gate is Gate.FROZEN and state.media is Media.FLOWING

    state, effects = step(state, ev.AgentLinkRestored(1), 13.0)
    assert effects[0] == fx.RecoveryFinished(1, ("agent_link",), "recovered", 3.0)
    assert effects[-1] == fx.GateChanged("frozen", "open", 3.0)
    assert state.recovery is None and state.gate is Gate.OPEN


# --- recovery and reconciliation ----------------------------------------------------------------


@pytest.mark.parametrize("kind", NOT_TRANSFER)
def test_restored_with_nothing_outstanding_finishes_recovery_and_opens_the_gate(kind: str) -> None:
    state = interrupted(speaking(), kind)
    restored, effects = step(state, restore(kind, 1), 13.5)
    assert effects == [
        fx.RecoveryFinished(1, (kind,), "recovered", 3.5),
        fx.CancelTimer("recovery"),
        fx.CancelTimer("honesty"),
        fx.CancelTimer("recovery_retry"),
        fx.NotifyAgent("resumed", kind),
        fx.GateChanged("frozen", "open", 3.5),
    ]
    assert restored.recovery is None and restored.gate is Gate.OPEN
    assert restored.gate_since is None
    assert restored.deadlines == {"max_duration": Deadline(601.0, 0)}
    assert (restored.signaling, restored.media, restored.agent_link) == (
        Signaling.UP,
        Media.FLOWING,
        AgentLink.CONNECTED,
    )
    # The old response stays cancelled: it is not played again.
    assert restored.response is None and restored.playback_generation == 1
    assert restored.version == state.version + 1


def test_restored_with_outstanding_intents_enters_reconciliation() -> None:
    state = interrupted(with_sent_write(with_sent_write(answered()), "k2"), "media")
    restored, effects = step(state, ev.MediaRestored(1), 14.0)
    assert effects == [
        fx.RecoveryFinished(1, ("media",), "recovered", 4.0),
        fx.CancelTimer("recovery"),
        fx.CancelTimer("honesty"),
        fx.CancelTimer("recovery_retry"),
        fx.NotifyAgent("resumed", "media"),
        fx.GateChanged("frozen", "reconciling", 0.0),
        fx.Reconcile(("k1", "k2")),
    ]
    assert restored.gate is Gate.RECONCILING
    assert restored.gate_since == T_LOST  # frozen time runs on through reconciliation
    assert restored.recovery is None and restored.outstanding_keys() == ("k1", "k2")


def reconciling_two() -> SessionState:
    state = interrupted(with_sent_write(with_sent_write(answered()), "k2"), "media")
    state, _ = step(state, ev.MediaRestored(1), 14.0)
    return state


@pytest.mark.parametrize("last", ["committed", "failed", "not_started"])
def test_receipts_open_the_gate_when_the_last_intent_is_resolved(last: str) -> None:
    state, effects = step(reconciling_two(), ev.ToolReceipt("k1", "committed"), 15.0)
    assert effects == [fx.NotifyAgent("tool_receipt", "k1 committed")]
    assert state.gate is Gate.RECONCILING and state.outstanding_keys() == ("k2",)

    state, effects = step(state, ev.ToolReceipt("k2", last), 16.0)
    assert effects == [
        fx.NotifyAgent("tool_receipt", f"k2 {last}"),
        fx.GateChanged("reconciling", "open", 6.0),
    ]
    assert state.gate is Gate.OPEN and state.outstanding == ()
    # Not started is only recorded: the old write is never replayed (seed 000).
    assert not any(isinstance(e, fx.SendToolRequest) for e in effects)


def test_an_unknown_receipt_ends_in_needs_human_and_keeps_the_intent() -> None:
    state = reconciling_two()
    ended, effects = step(state, ev.ToolReceipt("k1", "unknown", "provider timeout"), 16.0)
    reason = "2 tool calls with unknown outcome"
    assert effects == [
        fx.CancelToolCalls(("k2",)),  # still in flight: no further calls
        fx.ClearPlayout(2),
        fx.PersistOutstanding(("k1", "k2")),
        fx.Say("outcome_unknown"),
        fx.CancelTimer("max_duration"),
        fx.GateChanged("reconciling", "closed", 6.0),
        fx.ReleaseMedia(),
        fx.HangUp(reason),
        fx.Finished("needs_human", reason, "reconciliation"),
    ]
    assert ended.ended is not None
    assert (ended.ended.terminal_state, ended.ended.stage) == ("needs_human", "reconciliation")
    assert ended.outstanding == (
        Outstanding("k1", "book", "write", "digest-k1", "t1", stage="unknown"),
        Outstanding("k2", "book", "write", "digest-k2", "t1", stage="sent"),
    )
    assert ended.acceptable_terminal_states() == ("needs_human",)
    with pytest.raises(SessionTerminated):
        step(ended, ev.ToolReceipt("k2", "committed"), 17.0)


# --- stale events -------------------------------------------------------------------------------


def second_recovery(kind: str) -> SessionState:
    """A recovery (or a transfer) of generation 1 finished; generation 2 of the same kind is
    running."""
    state = interrupted(answered(), kind)
    state, _ = run(state, [(restore(kind, 1), 12.0), (INTERRUPT[kind], 20.0)])
    running = state.recovery or state.transfer
    assert running is not None and running.generation == 2
    return state


STALE_CASES: list[tuple[str, ev.Event, str]] = [
    ("media", ev.MediaRestored(1), "generation 1 is not the current 2"),
    ("agent_link", ev.AgentLinkRestored(1), "generation 1 is not the current 2"),
    ("reinvite", ev.ReinviteFinished(1), "generation 1 is not the current 2"),
    ("transfer", ev.TransferFinished(1, ok=True), "generation 1 is not the transfer's 2"),
    ("media", ev.MediaRestored(3), "generation 3 is not the current 2"),
    ("media", ev.DeadlineFired("recovery", 1), "no current deadline recovery/1"),
    ("media", ev.DeadlineFired("honesty", 1), "no current deadline honesty/1"),
    ("media", ev.RecoveryRetryDue(1, 0), "generation 1 is not the current 2"),
    ("media", ev.RecoveryRetryDue(2, 5), "attempt 5 is not the current 0"),
]


@pytest.mark.parametrize(("kind", "event", "why"), STALE_CASES)
def test_an_event_of_an_older_generation_is_ignored_and_changes_nothing(
    kind: str, event: ev.Event, why: str
) -> None:
    state = second_recovery(kind)
    after, effects = step(state, event, 21.0)
    assert effects == [fx.StaleEventIgnored(event.type, why)]
    assert after is state


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (ev.MediaRestored(1), "media is not interrupted"),
        (ev.AgentLinkRestored(1), "the agent link is not lost"),
        (ev.ReinviteFinished(1), "no re-INVITE is pending"),
        (ev.TransferFinished(1), "no transfer is in progress"),
        (ev.RecoveryRetryDue(1, 0), "no recovery is running"),
        (ev.DeadlineFired("recovery", 1), "no current deadline recovery/1"),
    ],
)
def test_an_event_after_its_recovery_finished_is_ignored(event: ev.Event, why: str) -> None:
    state, _ = step(interrupted(answered(), "media"), ev.MediaRestored(1), 12.0)
    after, effects = step(state, event, 13.0)
    assert effects == [fx.StaleEventIgnored(event.type, why)]
    assert after is state


# --- leaving during recovery --------------------------------------------------------------------


def test_caller_hangup_during_recovery_cancels_it_at_once() -> None:
    state = interrupted(answered(), "media")
    ended, effects = step(state, ev.CallerHangup(), 12.0)
    assert effects == [
        fx.ClearPlayout(2),
        fx.RecoveryFinished(1, ("media",), "canceled", 2.0),
        fx.CancelTimer("honesty"),
        fx.CancelTimer("max_duration"),
        fx.CancelTimer("recovery"),
        fx.CancelTimer("recovery_retry"),
        fx.GateChanged("frozen", "closed", 2.0),
        fx.ReleaseMedia(),
        fx.Finished("canceled", "caller hung up during recovery", None),
    ]
    assert ended.ended is not None and ended.ended.terminal_state == "canceled"
    assert ended.recovery is None and ended.deadlines == {}
    assert ended.media is Media.RELEASED


@pytest.mark.parametrize(
    "event",
    [
        ev.MediaRestored(1),
        ev.DeadlineFired("recovery", 1),
        ev.RecoveryRetryDue(1, 0),
        ev.CallerHangup(),
        ev.OperatorResolution("completed"),
    ],
)
def test_every_event_after_the_end_raises_session_terminated(event: ev.Event) -> None:
    ended, _ = step(interrupted(answered(), "media"), ev.CallerHangup(), 12.0)
    error = refused(ended, event, 13.0)
    assert isinstance(error, SessionTerminated)
    assert "the session ended canceled" in str(error)


def test_caller_hangup_with_an_intent_outstanding_needs_a_human() -> None:
    ended, effects = step(
        interrupted(with_sent_write(answered()), "media"), ev.CallerHangup(), 12.0
    )
    assert ended.ended is not None
    assert (ended.ended.terminal_state, ended.ended.stage) == ("needs_human", "hangup")
    assert fx.PersistOutstanding(("k1",)) in effects
    assert fx.RecoveryFinished(1, ("media",), "canceled", 2.0) in effects


# --- timeouts -----------------------------------------------------------------------------------


def test_the_recovery_deadline_times_out_with_seed_000s_effects_in_order() -> None:
    state = interrupted(with_sent_write(speaking()), "media")
    ended, effects = step(state, ev.DeadlineFired("recovery", 1), 20.0)
    reason = "media not recovered within 10 s"
    assert effects == [
        fx.StopGeneration(),  # turn t1 is still open with the agent
        fx.CancelToolCalls(("k1",)),
        fx.ClearPlayout(2),
        fx.PersistOutstanding(("k1",)),
        fx.RecoveryFinished(1, ("media",), "timed_out", 10.0),
        fx.Say("outcome_unknown"),
        fx.CancelTimer("honesty"),
        fx.CancelTimer("max_duration"),
        fx.CancelTimer("recovery_retry"),
        fx.GateChanged("frozen", "closed", 10.0),
        fx.ReleaseMedia(),
        fx.HangUp(reason),
        fx.Finished("timed_out", reason, "recovery"),
    ]
    assert ended.ended is not None
    assert (ended.ended.terminal_state, ended.ended.reason, ended.ended.stage) == (
        "timed_out",
        reason,
        "recovery",
    )
    assert ended.outstanding_keys() == ("k1",)  # kept for reconciliation, never assumed
    assert ended.turn is None and ended.response is None and ended.media is Media.RELEASED


def test_a_timeout_with_nothing_outstanding_says_timed_out() -> None:
    _, effects = step(interrupted(answered(), "agent_link"), ev.DeadlineFired("recovery", 1), 20.0)
    reason = "agent_link not recovered within 10 s"
    assert effects == [
        fx.ClearPlayout(2),
        fx.RecoveryFinished(1, ("agent_link",), "timed_out", 10.0),
        fx.Say("timed_out"),
        fx.CancelTimer("honesty"),
        fx.CancelTimer("max_duration"),
        fx.CancelTimer("recovery_retry"),
        fx.GateChanged("frozen", "closed", 10.0),
        fx.ReleaseMedia(),
        fx.HangUp(reason),
        fx.Finished("timed_out", reason, "recovery"),
    ]


def test_the_honesty_deadline_tells_the_caller_once() -> None:
    state = interrupted(answered(), "media")
    after, effects = step(state, ev.DeadlineFired("honesty", 1), 12.0)
    assert effects == [fx.Say("reconnecting")]
    assert "honesty" not in after.deadlines and after.version == state.version + 1
    again, effects = step(after, ev.DeadlineFired("honesty", 1), 12.5)
    assert effects == [fx.StaleEventIgnored("deadline_fired", "no current deadline honesty/1")]
    assert again is after


def test_the_maximum_duration_times_out_a_quiet_call() -> None:
    ended, effects = step(answered(), ev.DeadlineFired("max_duration", 0), 601.0)
    reason = "call reached its maximum duration of 600 s"
    assert effects == [
        fx.ClearPlayout(1),
        fx.Say("timed_out"),
        fx.GateChanged("open", "closed", 0.0),
        fx.ReleaseMedia(),
        fx.HangUp(reason),
        fx.Finished("timed_out", reason, "max_duration"),
    ]
    assert ended.ended is not None and ended.ended.stage == "max_duration"


# --- the owner's process died -------------------------------------------------------------------


def test_owner_lost_ends_the_call_but_leaves_intents_to_reconcile() -> None:
    state = interrupted(with_sent_write(speaking()), "media")
    after, effects = step(state, ev.OwnerLost("the process serving the call died"), 12.0)
    assert effects == [
        fx.StopGeneration(),  # turn t1 was still open
        fx.ClearPlayout(2),
        fx.RecoveryFinished(1, ("media",), "failed", 2.0),
        fx.CancelTimer("honesty"),
        fx.CancelTimer("max_duration"),
        fx.CancelTimer("recovery"),
        fx.CancelTimer("recovery_retry"),
        fx.GateChanged("frozen", "reconciling", 0.0),
        fx.Reconcile(("k1",)),
    ]
    assert after.ended is None  # the reaper finalises it once the intents are settled
    assert (after.signaling, after.media, after.agent_link) == (
        Signaling.GONE,
        Media.RELEASED,
        AgentLink.CLOSED,
    )
    assert after.recovery is None and after.deadlines == {} and after.turn is None
    # Settling the intent opens the gate, but no new work can start: the call is gone.
    settled, effects = step(after, ev.ToolReceipt("k1", "committed"), 13.0)
    assert effects == [
        fx.NotifyAgent("tool_receipt", "k1 committed"),
        fx.GateChanged("reconciling", "open", 3.0),
    ]
    refused(settled, ev.TurnStarted("t2"))
    refused(settled, ev.ToolIntent("k2", "book", "write", "d2", "t2"))
    reaped, effects = step(settled, ev.SessionReaped("worker died"), 14.0)
    assert reaped.ended is not None and reaped.ended.terminal_state == "failed"
    assert not any(isinstance(e, fx.HangUp | fx.Say) for e in effects)  # nobody on the line


def test_an_unknown_receipt_after_owner_lost_needs_a_human_without_speaking() -> None:
    state, _ = step(with_sent_write(answered()), ev.OwnerLost("died"), 12.0)
    ended, effects = step(state, ev.ToolReceipt("k1", "unknown"), 13.0)
    assert ended.ended is not None and ended.ended.terminal_state == "needs_human"
    assert not any(isinstance(e, fx.HangUp | fx.Say) for e in effects)
    assert fx.PersistOutstanding(("k1",)) in effects


def paying_with_code(window_s: float = 120.0) -> SessionState:
    """Answered with callbacks on, a write sent and its resume code read out."""
    state = with_sent_write(answered({**POLICY, "callback_window_s": window_s}))
    state, _ = step(state, ev.ResumeCodeIssued("code-digest"), 5.5)
    return state


def test_a_caller_cut_off_by_the_process_mid_write_is_parked_for_a_callback() -> None:
    state = paying_with_code()
    assert may_park(state)
    after, effects = step(state, ev.OwnerLost("the process serving the call died", park=True), 12.0)
    # Settled as any owner-lost session is (asked about by key, never sent again), but kept.
    assert fx.Reconcile(("k1",)) in effects
    assert not any(isinstance(e, fx.Finished | fx.HangUp | fx.Say) for e in effects)
    assert (after.signaling, after.dropped_until, after.dropped_stage) == (
        Signaling.DROPPED,
        132.0,
        "process",
    )
    assert after.ended is None and after.status().startswith("signaling dropped")
    settled, _ = step(after, ev.ToolReceipt("k1", "committed"), 13.0)
    assert settled.outstanding == () and settled.signaling is Signaling.DROPPED
    # The caller calls back with the code: a new generation, and nothing left to ask about.
    back, _ = step(settled, ev.CalledBack(1, with_code=True), 20.0)
    assert back.signaling is Signaling.OFFERED and back.gate is Gate.OPEN
    assert back.dropped_stage == ""


def test_a_parked_session_nobody_calls_back_ends_as_the_reaper_would_have() -> None:
    state, _ = step(paying_with_code(), ev.OwnerLost("the process died", park=True), 12.0)
    state, _ = step(state, ev.ToolReceipt("k1", "committed"), 13.0)
    refused(state, ev.CallbackEnded("window"))  # the window is still open at 12 + 120
    ended, effects = step(state, ev.CallbackEnded("window"), 133.0)
    assert ended.ended is not None
    assert (ended.ended.terminal_state, ended.ended.stage) == ("failed", "process")
    assert ended.ended.reason == "the process died"
    assert not any(isinstance(e, fx.HangUp | fx.Say) for e in effects)


def test_an_unknown_outcome_while_parked_needs_a_human_at_once() -> None:
    state, _ = step(paying_with_code(), ev.OwnerLost("died", park=True), 12.0)
    ended, _ = step(state, ev.ToolReceipt("k1", "unknown"), 13.0)
    assert ended.ended is not None and ended.ended.terminal_state == "needs_human"


@pytest.mark.parametrize(
    "make",
    [
        lambda: with_sent_write(answered({**POLICY, "callback_window_s": 120.0})),  # no code
        lambda: paying_with_code(window_s=0.0),  # callbacks off
    ],
    ids=["without_a_code", "callbacks_off"],
)
def test_only_a_caller_who_was_read_a_code_is_parked(make: Any) -> None:
    state = make()
    assert not may_park(state)
    refused(state, ev.OwnerLost("died", park=True))
    after, _ = step(state, ev.OwnerLost("died"), 12.0)
    assert after.signaling is Signaling.GONE


def test_a_parked_state_survives_its_checkpoint_and_older_ones_lack_the_field() -> None:
    state, _ = step(paying_with_code(), ev.OwnerLost("died", park=True), 12.0)
    data = json.loads(json.dumps(state.to_dict()))
    assert SessionState.from_dict(data) == state
    assert "dropped_stage" not in answered().to_dict()


# --- the side-effect gate -----------------------------------------------------------------------


def frozen() -> SessionState:
    return interrupted(answered(), "media")


GATED_EVENTS: list[ev.Event] = [
    ev.TurnStarted("t9"),
    ev.ResponseStarted("r9", "t9"),
    ev.ToolIntent("k9", "book", "write", "d9", "t9"),
]


@pytest.mark.parametrize("make", [frozen, reconciling_two], ids=["frozen", "reconciling"])
@pytest.mark.parametrize("event", GATED_EVENTS, ids=lambda e: e.type)
def test_new_work_through_a_closed_gate_raises_gate_closed(make: Any, event: ev.Event) -> None:
    state = make()
    error = refused(state, event)
    assert isinstance(error, GateClosed)
    assert f"while the gate is {state.gate.value}" in str(error)


def test_a_read_tool_call_is_allowed_while_frozen() -> None:
    state = frozen()
    after, effects = step(state, ev.ToolIntent("k9", "lookup", "read", "d9", "t1"), 11.0)
    assert effects == [fx.SendToolRequest("k9")]
    assert after.outstanding == (Outstanding("k9", "lookup", "read", "d9", "t1"),)
    sent, effects = step(after, ev.ToolRequestSent("k9"), 11.5)
    assert effects == [] and sent.outstanding[0].stage == "sent"
    assert sent.gate is Gate.FROZEN


def test_a_write_intended_before_the_freeze_is_not_sent_while_frozen() -> None:
    state, _ = step(answered(), ev.ToolIntent("k1", "book", "write", "d1", "t1"), 5.0)
    state = interrupted(state, "media")
    assert isinstance(refused(state, ev.ToolRequestSent("k1")), GateClosed)


# --- illegal events -----------------------------------------------------------------------------


class NotHandled(ev.Event):
    type: ClassVar[str] = "not_handled"


ILLEGAL: list[tuple[str, Any, ev.Event]] = [
    ("answer unoffered", lambda: SessionState(SID), ev.CallAnswered()),
    ("offer twice", offered, ev.CallOffered()),
    ("answer twice", answered, ev.CallAnswered()),
    ("media lost before answer", offered, ev.MediaLost()),
    ("media lost twice", frozen, ev.MediaLost()),
    ("agent lost before answer", offered, ev.AgentLinkLost()),
    (
        "re-INVITE during transfer",
        lambda: interrupted(answered(), "transfer"),
        ev.ReinviteStarted(),
    ),
    ("transfer progress without transfer", answered, ev.TransferProgress(180)),
    ("turn before answer", offered, ev.TurnStarted("t1")),
    (
        "second open turn",
        lambda: run(answered(), [(ev.TurnStarted("t1"), 2)])[0],
        ev.TurnStarted("t2"),
    ),
    ("commit unknown turn", answered, ev.TurnCommitted("t7")),
    ("second response", speaking, ev.ResponseStarted("r2", "t1")),
    ("tool kind", answered, ev.ToolIntent("k1", "book", "delete", "d", "t1")),
    (
        "intent twice",
        lambda: with_sent_write(answered()),
        ev.ToolIntent("k1", "book", "write", "d", "t1"),
    ),
    ("send unknown intent", answered, ev.ToolRequestSent("k7")),
    ("send twice", lambda: with_sent_write(answered()), ev.ToolRequestSent("k1")),
    ("receipt unknown key", answered, ev.ToolReceipt("k7", "committed")),
    ("receipt bad outcome", lambda: with_sent_write(answered()), ev.ToolReceipt("k1", "maybe")),
    (
        "approval twice",
        lambda: run(answered(), [(ev.ApprovalGiven("a1"), 2)])[0],
        ev.ApprovalGiven("a1"),
    ),
    ("server hangup outcome", answered, ev.ServerHangup("timed_out")),
    ("operator terminal", answered, ev.OperatorResolution("done")),
    ("event without handler", answered, NotHandled()),
]


@pytest.mark.parametrize(("case", "make", "event"), ILLEGAL, ids=[c[0] for c in ILLEGAL])
def test_an_illegal_event_raises_naming_event_and_state(
    case: str, make: Any, event: ev.Event
) -> None:
    state = make()
    error = refused(state, event)
    assert not isinstance(error, SessionTerminated)
    assert str(error).startswith(f"{event.type} is illegal in state [{state.status()}]")


def test_an_illegal_event_message_reads_whole() -> None:
    error = refused(offered(), ev.TurnStarted("t1"))
    assert str(error) == (
        "turn_started is illegal in state [signaling offered, media none, agent connected, "
        "gate open]: the call is not up"
    )


# --- barge-in -------------------------------------------------------------------------------------


def test_barge_in_bumps_the_playback_generation() -> None:
    state = speaking()
    after, effects = step(state, ev.ResponseInterrupted("r1", heard_ms=300), 5.0)
    assert effects == [
        fx.ClearPlayout(1),
        fx.NotifyAgent("response_interrupted", "r1 heard_ms=300"),
    ]
    assert after.response is None and after.turn is None and after.playback_generation == 1
    assert after.gate is Gate.OPEN and after.version == state.version + 1
    # The next response binds to the new generation, so old chunks cannot play.
    _, steps = run(after, [(ev.TurnStarted("t2"), 6.0), (ev.ResponseStarted("r2", "t2"), 7.0)])
    assert steps[-1] == [fx.BindResponse("r2", 1)]


# --- retry schedule -----------------------------------------------------------------------------


def drive_retries(policy: dict[str, float]) -> tuple[list[fx.AttemptRecovery], list[float]]:
    """Lose media at T_LOST and fire every scheduled retry at its due time."""
    state, effects = step(answered(policy), ev.MediaLost(), T_LOST)
    attempts: list[fx.AttemptRecovery] = []
    delays: list[float] = []
    now = T_LOST
    while True:
        timers = [
            e for e in effects if isinstance(e, fx.ScheduleTimer) and e.name == "recovery_retry"
        ]
        if not timers:
            return attempts, delays
        (timer,) = timers
        assert state.deadlines["recovery_retry"] == Deadline(timer.due, timer.generation)
        assert state.recovery is not None and timer.due < state.recovery.deadline
        delays.append(timer.due - now)
        now = timer.due
        state, effects = step(state, ev.RecoveryRetryDue(timer.generation, timer.attempt), now)
        attempts += [e for e in effects if isinstance(e, fx.AttemptRecovery)]


def test_retries_are_seeded_by_session_and_generation() -> None:
    first = drive_retries(POLICY)
    assert drive_retries(POLICY) == first  # same session and generation: same schedule
    assert retry_delay(SID, 1, 3, P) == retry_delay(SID, 1, 3, P)
    mine = [retry_delay(SID, 1, attempt, P) for attempt in range(4)]
    assert [retry_delay("sess-2", 1, attempt, P) for attempt in range(4)] != mine
    assert [retry_delay(SID, 2, attempt, P) for attempt in range(4)] != mine


def test_retries_stop_after_the_maximum_attempts_each_within_the_cap() -> None:
    policy = {**POLICY, "recovery_timeout_s": 1000.0}
    attempts, delays = drive_retries(policy)
    assert [(a.generation, a.attempt, a.interruptions) for a in attempts] == [
        (1, n, ("media",)) for n in range(4)
    ]
    assert len(delays) == 4
    assert all(P.retry_base_s / 2 <= d <= P.retry_cap_s for d in delays)


def test_retries_stop_at_the_recovery_deadline() -> None:
    policy = {**POLICY, "recovery_timeout_s": 1.2, "retry_max_attempts": 50}
    attempts, delays = drive_retries(policy)
    assert 0 < len(attempts) < 50
    assert T_LOST + sum(delays) < T_LOST + 1.2
    assert all(d <= P.retry_cap_s for d in delays)


def test_no_retry_is_scheduled_without_a_budget() -> None:
    state, effects = step(answered({**POLICY, "retry_max_attempts": 0}), ev.MediaLost(), T_LOST)
    assert not any(isinstance(e, fx.ScheduleTimer) and e.name == "recovery_retry" for e in effects)
    assert "recovery_retry" not in state.deadlines


# --- status -------------------------------------------------------------------------------------


def test_status_names_every_dimension_and_never_a_lone_connected_flag() -> None:
    state = with_sent_write(speaking())
    assert state.status() == (
        "signaling up, media flowing, agent connected, gate open, speaking r1, "
        "1 tool call(s) outstanding"
    )
    state = interrupted(state, "agent_link")
    assert state.status() == (
        "signaling up, media flowing, agent lost, gate frozen, "
        "recovering agent_link (generation 1), turn t1, 1 tool call(s) outstanding"
    )
    for s in (SessionState(SID), offered(), answered(), state):
        parts = s.status().split(", ")
        assert "connected" not in parts
        assert [p.split(" ")[0] for p in parts[:4]] == ["signaling", "media", "agent", "gate"]


def test_a_terminal_status_names_the_state_stage_and_reason() -> None:
    ended, _ = step(interrupted(answered(), "media"), ev.DeadlineFired("recovery", 1), 20.0)
    assert ended.status() == "timed_out at recovery: media not recovered within 10 s"
    done, _ = step(answered(), ev.CallerHangup(), 5.0)
    assert done.status() == "completed: caller hung up"


# --- events in the log --------------------------------------------------------------------------


SAMPLES: list[ev.Event] = [
    ev.CallOffered("+15550001234", "service", {"recovery_timeout_s": 5.0}),
    ev.CallPlaced("sip:****567@cc.example", 20.0, {"recovery_timeout_s": 5.0}),
    ev.LegUnanswered(486, "Busy Here"),
    ev.CallAnswered(),
    ev.ReinviteStarted(),
    ev.ReinviteFinished(3, ok=False),
    ev.TransferStarted("sip:desk@example.org"),
    ev.TransferProgress(180),
    ev.TransferFinished(2, ok=False),
    ev.TransferFellBack(2, 603),
    ev.ConsultAnswered(2),
    ev.BridgeUp(2),
    ev.BridgeEnded("target"),
    ev.CallerHangup(),
    ev.DialogFailed(408, "no ACK"),
    ev.AgentFailed("on_dtmf raised ValueError"),
    ev.SessionExpired("No session refresh received."),
    ev.ServerHangup("canceled", "agent gave up"),
    ev.MediaLost(),
    ev.MediaRestored(4),
    ev.AgentLinkLost(),
    ev.AgentLinkRestored(5),
    ev.AgentLinkFailed("not back within 5 s"),
    ev.TurnStarted("t1"),
    ev.TurnCommitted("t1"),
    ev.ResponseStarted("r1", "t1"),
    ev.ResponseInterrupted("r1", 250),
    ev.BargeInJudged("r1", "false", 250),
    ev.PromptCut("say2", "reconnecting", 640),
    ev.ResponseFinished("r1", 900),
    ev.ToolIntent("k1", "book", "read", "abc", "t1"),
    ev.ToolRequestSent("k1"),
    ev.ToolReceipt("k1", "failed", "card declined"),
    ev.ToolReceiptConflicted("k1", "committed", "failed"),
    ev.ToolRequestWithheld("k1"),
    ev.ApprovalGiven("a1"),
    ev.CallerSaid("fifty nine cents", "amount", 0.62, "accepted"),
    ev.DeadlineFired("honesty", 2),
    ev.RecoveryRetryDue(2, 3),
    ev.RecoveryProbed(2, 1, 481, "Call/Transaction Does Not Exist"),
    ev.OperatorResolution("needs_human", "called back"),
    ev.OwnerLost("the process serving the call died"),
    ev.SessionReaped("worker died"),
    ev.CallRejoined(1, "******1234", "header"),
    ev.AwayExpired("the resume handle expired unused"),
    ev.ResumeReused(),
    ev.CalledBack(1, "******1234", with_code=True),
    ev.CallbackEnded("declined"),
    ev.ResumeCodeIssued("3f2a"),
]


def test_the_samples_cover_every_event_type() -> None:
    assert sorted(e.type for e in SAMPLES) == sorted(ev.EVENT_TYPES)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.type)
def test_every_event_round_trips_through_its_log_form(event: ev.Event) -> None:
    payload = json.loads(json.dumps(event.to_dict()))
    assert set(payload) == {f.name for f in fields(event)}
    assert ev.event_from_dict(event.type, payload) == event


def test_an_unknown_event_type_or_field_raises_unknown_event() -> None:
    with pytest.raises(ev.UnknownEvent, match="unknown event type 'call_exploded'"):
        ev.event_from_dict("call_exploded", {})
    with pytest.raises(ev.UnknownEvent, match="bad payload for media_restored"):
        ev.event_from_dict("media_restored", {"generation": 1, "extra": True})
    assert issubclass(ev.UnknownEvent, ValueError)


# --- checkpoints and replay ---------------------------------------------------------------------


HISTORY: Timed = [
    (ev.CallOffered("+15550001234", "service", POLICY), 0.0),
    (ev.CallAnswered(), 1.0),
    (ev.TurnStarted("t1"), 2.0),
    (ev.TurnCommitted("t1"), 3.0),
    (ev.ApprovalGiven("a1"), 3.5),
    (ev.ToolIntent("k1", "book", "write", "digest-k1", "t1"), 4.0),
    (ev.ToolRequestSent("k1"), 4.1),
    (ev.ResponseStarted("r1", "t1"), 4.5),
    (ev.MediaLost(), 10.0),
    (ev.DeadlineFired("honesty", 1), 12.0),
    (ev.MediaRestored(1), 13.0),
]


def test_a_checkpoint_round_trips_through_json() -> None:
    state, _ = run(SessionState(SID), HISTORY[:-1])
    data = state.to_dict()
    assert data["acceptable_terminal_states"] == ["timed_out", "failed", "needs_human"]
    assert SessionState.from_dict(json.loads(json.dumps(data))) == state
    ended, _ = step(state, ev.DeadlineFired("recovery", 1), 20.0)
    assert SessionState.from_dict(json.loads(json.dumps(ended.to_dict()))) == ended


def test_replay_from_a_checkpoint_or_from_scratch_equals_the_live_state() -> None:
    live, _ = run(SessionState(SID), HISTORY)
    assert live.gate is Gate.RECONCILING and live.version == len(HISTORY)
    assert replay(SessionState(SID), HISTORY) == live
    for cut in range(len(HISTORY) + 1):
        checkpoint, _ = run(SessionState(SID), HISTORY[:cut])
        restored = SessionState.from_dict(json.loads(json.dumps(checkpoint.to_dict())))
        assert replay(restored, HISTORY[cut:]) == live


# --- bugs found by these tests, fixed; kept as regressions ---------------------------


def test_deadline_fired_for_the_retry_timer_changes_nothing() -> None:
    state = interrupted(answered(), "media")
    assert "recovery_retry" in state.deadlines
    after, effects = step(state, ev.DeadlineFired("recovery_retry", 1), 10.1)
    assert effects == [
        fx.StaleEventIgnored("deadline_fired", "retries arrive as recovery_retry_due")
    ]
    assert after == state  # actual: deadlines lose "recovery_retry", version unchanged


def test_an_unscheduled_retry_is_stale() -> None:
    state = interrupted(answered({**POLICY, "retry_max_attempts": 0}), "media")
    assert "recovery_retry" not in state.deadlines
    after, effects = step(state, ev.RecoveryRetryDue(1, 0), 10.5)
    # actual: [AttemptRecovery(1, 0, ("media",))] and recovery.attempt == 1
    assert [type(e) for e in effects] == [fx.StaleEventIgnored]
    assert after is state


def test_no_attempt_beyond_the_budget() -> None:
    policy = {**POLICY, "recovery_timeout_s": 1000.0}
    attempts, _ = drive_retries(policy)
    assert len(attempts) == 4
    state = interrupted(answered(policy), "media")
    for attempt in range(4):
        state, _ = step(state, ev.RecoveryRetryDue(1, attempt), 11.0 + attempt)
    assert "recovery_retry" not in state.deadlines
    _, effects = step(state, ev.RecoveryRetryDue(1, 4), 20.0)
    # actual: [AttemptRecovery(1, 4, ("media",))]
    assert not any(isinstance(e, fx.AttemptRecovery) for e in effects)


def test_retry_delay_never_exceeds_the_cap() -> None:
    policy = Policy(retry_base_s=1.0, retry_cap_s=0.25)
    assert retry_delay(SID, 1, 0, policy) <= policy.retry_cap_s  # actual: 0.5


@pytest.mark.parametrize("terminal", ["completed", "canceled"])
def test_operator_cannot_complete_with_outstanding_intents(terminal: str) -> None:
    state = with_sent_write(answered())
    assert terminal not in state.acceptable_terminal_states()
    try:
        ended, _ = step(state, ev.OperatorResolution(terminal, "looked fine"), 30.0)
    except IllegalTransition:
        return
    assert ended.ended is not None
    assert ended.ended.terminal_state in state.acceptable_terminal_states()  # actual: terminal


def test_a_timeout_asks_the_agent_to_stop_once() -> None:
    _, effects = step(speaking(), ev.DeadlineFired("max_duration", 0), 601.0)
    # actual: [StopGeneration, CancelResponse("r1"), StopGeneration, ClearPlayout(1), ...]
    assert [type(e) for e in effects].count(fx.StopGeneration) == 1


def test_caller_hangup_before_the_offer_is_illegal() -> None:
    refused(SessionState(SID), ev.CallerHangup())  # actual: completed, "caller hung up"


def test_an_agent_that_fails_ends_the_session_failed_at_stage_agent_and_tells_the_caller() -> None:
    state, effects = step(answered(), ev.AgentFailed("on_dtmf raised ValueError"), 20.0)
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage) == ("failed", "agent")
    assert state.ended.reason == "agent failed: on_dtmf raised ValueError"
    kinds = [type(e) for e in effects]
    assert kinds.index(fx.Say) < kinds.index(fx.HangUp)
    assert fx.Say("technical_problem") in effects


def test_an_agent_link_that_does_not_come_back_ends_failed_at_stage_agent_link() -> None:
    state, _ = step(answered(), ev.AgentLinkLost(), 11.0)
    state, effects = step(state, ev.AgentLinkFailed("not back within 5 s"), 16.0)
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage) == ("failed", "agent_link")
    assert state.ended.reason == "agent link failed: not back within 5 s"
    kinds = [type(e) for e in effects]
    # Seed 004: the caller is told before the BYE; the recovery is reported as over.
    assert kinds.index(fx.Say) < kinds.index(fx.HangUp)
    assert fx.Say("technical_problem") in effects


def test_an_agent_that_fails_with_a_tool_call_in_flight_needs_a_human() -> None:
    state, effects = step(with_sent_write(speaking()), ev.AgentFailed("crashed"), 20.0)
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage) == ("needs_human", "agent")
    assert fx.Say("outcome_unknown") in effects


def test_a_judged_barge_in_is_a_record_that_moves_nothing_but_the_version() -> None:
    state = answered()
    for outcome in ("confirmed", "false"):
        after, effects = step(state, ev.BargeInJudged("r1", outcome, 250), 5.0)
        assert effects == [] and after == replace(state, version=state.version + 1)
    with pytest.raises(IllegalTransition, match="bogus"):
        step(state, ev.BargeInJudged("r1", "bogus", 250), 5.0)
