"""The recovery probe: the answer to the in-dialog OPTIONS of an ``AttemptRecovery`` (seed 001,
"the current generation performs one scheduled attempt within the shared deadline").

Fake clock (plain floats). 481, 408 and transport failures mean the dialog is gone: the session
ends ``failed`` at ``signaling`` at once, with no BYE. Any other answer proves the dialog exists:
the recovery keeps waiting within its deadline. Late answers (an older generation, no recovery)
are stale.
"""

from __future__ import annotations

import pytest

from session import effects as fx
from session import events as ev
from session.machine import IllegalTransition, retry_delay, step
from session.state import Gate, Policy, SessionState, Signaling

SID = "probe-1"
POLICY: dict[str, float] = {
    "recovery_timeout_s": 10.0,
    "honesty_after_s": 2.0,
    "max_duration_s": 600.0,
    "retry_base_s": 0.5,
    "retry_cap_s": 2.0,
    "retry_max_attempts": 4,
}
T_LOST = 10.0
T_RETRY = T_LOST + retry_delay(SID, 1, 0, Policy.from_dict(POLICY))


def fold(state: SessionState, *timed: tuple[ev.Event, float]) -> SessionState:
    for event, at in timed:
        state, _ = step(state, event, at)
    return state


def probing(*, with_write: bool = False) -> SessionState:
    """Answered, media lost at T_LOST, the first retry made (AttemptRecovery 1/0 sent)."""
    state = fold(
        SessionState(SID),
        (ev.CallOffered("+15550001234", "service", POLICY), 0.0),
        (ev.CallAnswered(), 1.0),
    )
    if with_write:
        state = fold(
            state,
            (ev.ToolIntent("k1", "book", "write", "digest-k1", "t1"), 5.0),
            (ev.ToolRequestSent("k1"), 5.0),
        )
    state = fold(state, (ev.MediaLost(), T_LOST))
    state, effects = step(state, ev.RecoveryRetryDue(1, 0), T_RETRY)
    assert effects[0] == fx.AttemptRecovery(1, 0, ("media",))
    return state


GONE = [
    (
        481,
        "Call/Transaction Does Not Exist",
        "OPTIONS answered 481 Call/Transaction Does Not Exist",
    ),
    (408, "Request Timeout", "OPTIONS answered 408 Request Timeout"),
    (503, "Transport Error", "OPTIONS answered 503 Transport Error"),
    (503, "Transport failure (PJSIP_ETPNOTAVAIL)", "OPTIONS answered 503 Transport failure"),
    (0, "", "OPTIONS got no answer (transport error)"),
]


@pytest.mark.parametrize(("status", "reason", "said"), GONE, ids=[str(g[:2]) for g in GONE])
def test_a_gone_dialog_fails_the_session_at_once_without_a_bye(
    status: int, reason: str, said: str
) -> None:
    state = probing()
    ended, effects = step(state, ev.RecoveryProbed(1, 0, status, reason), 11.5)
    assert ended.ended is not None
    assert (ended.ended.terminal_state, ended.ended.stage) == ("failed", "signaling")
    assert ended.ended.reason.startswith(f"dialog gone: {said}")
    assert ended.ended.at == 11.5
    kinds = [type(e) for e in effects]
    assert fx.HangUp not in kinds and fx.Say not in kinds  # nobody to send a BYE to, or tell
    assert [e for e in effects if isinstance(e, fx.RecoveryFinished)] == [
        fx.RecoveryFinished(1, ("media",), "failed", 1.5)
    ]
    assert effects[-1] == fx.Finished("failed", ended.ended.reason, "signaling")
    assert ended.recovery is None and ended.deadlines == {} and ended.gate is Gate.CLOSED
    assert ended.signaling is Signaling.GONE and ended.version == state.version + 1


def test_a_gone_dialog_says_what_is_unknown_and_keeps_it_for_reconciliation() -> None:
    state = probing(with_write=True)
    ended, effects = step(
        state, ev.RecoveryProbed(1, 0, 481, "Call/Transaction Does Not Exist"), 11.0
    )
    reason = (
        "dialog gone: OPTIONS answered 481 Call/Transaction Does Not Exist, "
        "with 1 tool call with unknown outcome"
    )
    # The order seed 000 gives for an ending; no Say and no HangUp: the dialog is gone.
    assert effects == [
        fx.CancelToolCalls(("k1",)),
        fx.ClearPlayout(2),
        fx.PersistOutstanding(("k1",)),
        fx.RecoveryFinished(1, ("media",), "failed", 1.0),
        fx.CancelTimer("honesty"),
        fx.CancelTimer("max_duration"),
        fx.CancelTimer("recovery"),
        fx.CancelTimer("recovery_retry"),
        fx.GateChanged("frozen", "closed", 1.0),
        fx.ReleaseMedia(),
        fx.Finished("failed", reason, "signaling"),
    ]
    assert ended.outstanding_keys() == ("k1",)  # never assumed
    assert ended.acceptable_terminal_states() == ("failed",)


@pytest.mark.parametrize(
    ("status", "reason"),
    [(200, "OK"), (405, "Method Not Allowed"), (501, "Not Implemented"), (503, "Busy")],
)
def test_any_other_answer_keeps_waiting_within_the_deadline(status: int, reason: str) -> None:
    state = probing()
    after, effects = step(state, ev.RecoveryProbed(1, 0, status, reason), 11.0)
    assert effects == []
    assert after.version == state.version + 1  # logged: the answer is part of the history
    assert after == SessionState.from_dict({**state.to_dict(), "version": after.version})
    # The dialog exists, but the media did not come back: the shared deadline still ends it.
    ended, effects = step(after, ev.DeadlineFired("recovery", 1), T_LOST + 10.0)
    assert ended.ended is not None
    assert (ended.ended.terminal_state, ended.ended.stage) == ("timed_out", "recovery")
    assert fx.HangUp("media not recovered within 10 s") in effects


def test_the_recovery_can_still_succeed_after_a_live_answer() -> None:
    state = probing()
    state, _ = step(state, ev.RecoveryProbed(1, 0, 200, "OK"), 11.0)
    restored, effects = step(state, ev.MediaRestored(1), 12.0)
    assert restored.gate is Gate.OPEN and restored.recovery is None
    assert fx.RecoveryFinished(1, ("media",), "recovered", 2.0) in effects


def test_an_answer_of_an_older_generation_is_stale() -> None:
    state = probing()
    state = fold(state, (ev.MediaRestored(1), 12.0), (ev.MediaLost(), 13.0))
    assert state.recovery is not None and state.recovery.generation == 2
    after, effects = step(state, ev.RecoveryProbed(1, 0, 481, "gone"), 13.5)
    assert effects == [fx.StaleEventIgnored("recovery_probed", "generation 1 is not the current 2")]
    assert after is state


def test_an_answer_with_no_recovery_running_is_stale() -> None:
    state = fold(probing(), (ev.MediaRestored(1), 12.0))
    assert state.recovery is None
    after, effects = step(state, ev.RecoveryProbed(1, 0, 481, "gone"), 12.5)
    assert effects == [fx.StaleEventIgnored("recovery_probed", "no recovery is running")]
    assert after is state


def test_an_answer_after_the_owner_was_lost_is_stale() -> None:
    state = fold(probing(with_write=True), (ev.OwnerLost("died"), 11.0))
    assert state.signaling is Signaling.GONE and state.ended is None
    after, effects = step(state, ev.RecoveryProbed(1, 0, 481, "gone"), 11.5)
    assert effects == [fx.StaleEventIgnored("recovery_probed", "no recovery is running")]
    assert after is state


def test_an_answer_to_an_attempt_never_made_is_refused() -> None:
    state = probing()  # attempt 0 made, attempt 1 scheduled
    with pytest.raises(IllegalTransition, match=r"attempt 1 was not made \(1 so far\)"):
        step(state, ev.RecoveryProbed(1, 1, 481, "gone"), 11.0)


def test_the_probe_event_round_trips_through_its_log_form() -> None:
    event = ev.RecoveryProbed(3, 1, 481, "Call/Transaction Does Not Exist")
    assert ev.event_from_dict("recovery_probed", event.to_dict()) == event
