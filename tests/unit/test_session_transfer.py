"""A blind transfer in the session machine (RFC 3515, RFC 5589 section 6): the gate freezes and
the response is cut, the NOTIFYs' progress is recorded, a final 2xx ends the session completed
with our BYE, a failure or a missing final NOTIFY takes the caller back to the agent with an
honest line, and a BYE that overtakes the final NOTIFY ends the session once."""

from __future__ import annotations

import pytest

from session import effects as fx
from session import events as ev
from session.machine import IllegalTransition, step
from session.state import AgentLink, Gate, Media, SessionState, Signaling, Transfer
from session.vocabulary import TransferStage

SID = "sess-t"
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
STARTED = (*SPEAKING, (ev.TransferStarted(TARGET), 10.0))


def test_starting_freezes_the_gate_cuts_the_response_and_arms_the_notify_guard() -> None:
    state, effects = fold(*STARTED)
    assert state.signaling is Signaling.TRANSFERRING and state.gate is Gate.FROZEN
    assert state.response is None and state.transfer_target == TARGET
    assert fx.CancelResponse("r1") in effects and fx.ClearPlayout(1) in effects
    # Its own phase, not a recovery: the guard decides, nothing is retried, nobody says
    # "reconnecting", and the status says what a desk should read.
    assert state.recovery is None
    assert state.transfer == Transfer(1, "blind", 10.0, TransferStage.REFERRING)
    assert "gate frozen, transferring (blind, referring)" in state.status()
    assert fx.ScheduleTimer("transfer_notify", 40.0, 1) in effects
    assert fx.GateChanged("open", "frozen", 0.0) in effects
    assert fx.NotifyAgent("interrupted", "transfer") in effects
    assert not any(isinstance(e, fx.StartRecovery) for e in effects)
    timers = {e.name for e in effects if isinstance(e, fx.ScheduleTimer)}
    assert timers == {"transfer_notify"}


def test_progress_is_recorded_and_a_final_2xx_ends_completed_with_our_bye() -> None:
    state, _ = fold(*STARTED, (ev.TransferProgress(100), 10.5), (ev.TransferProgress(180), 11.0))
    assert state.transfer_status == 180
    assert state.transfer is not None and state.transfer.stage is TransferStage.REFERRED
    state, effects = step(state, ev.TransferFinished(1, ok=True, status=200), 12.0)
    assert fx.TransferEnded(1, "blind", "completed", 2.0) in effects
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.reason) == ("completed", "transferred")
    assert state.transfer_status == 200 and state.transfer_target == TARGET
    # The BYE goes only now, and no prompt is played to a caller who talks to someone else.
    assert fx.HangUp("transferred") in effects
    assert not any(isinstance(e, fx.Say) for e in effects)
    assert fx.CancelTimer("transfer_notify") in effects


@pytest.mark.parametrize(
    ("status", "accepted", "outcome"),
    [(603, False, "refused"), (486, True, "failed"), (503, False, "refused")],
)
def test_a_refused_or_failed_transfer_takes_the_caller_back_with_an_honest_line(
    status: int, accepted: bool, outcome: str
) -> None:
    notified = ((ev.TransferProgress(100), 11.0),) if accepted else ()
    state, effects = fold(
        *STARTED, *notified, (ev.TransferFinished(1, ok=False, status=status), 12.0)
    )
    assert state.ended is None and state.signaling is Signaling.UP
    assert state.gate is Gate.OPEN and state.recovery is None and state.transfer is None
    assert fx.TransferEnded(1, "blind", outcome, 2.0) in effects
    assert state.transfer_status == status
    assert effects[-2:] == [
        fx.Say("transfer_failed"),
        fx.NotifyAgent("transfer_failed", str(status)),
    ]
    assert fx.NotifyAgent("resumed", "transfer") in effects
    assert fx.CancelTimer("transfer_notify") in effects
    assert not any(isinstance(e, fx.HangUp) for e in effects)
    # The agent may speak again at once.
    step(state, ev.TurnStarted("t2"), 13.0)


def test_no_final_notify_within_the_guard_takes_the_caller_back_and_a_late_one_is_stale() -> None:
    state, _ = fold(*STARTED, (ev.TransferProgress(100), 10.5))
    state, effects = step(state, ev.DeadlineFired("transfer_notify", 1), 40.0)
    assert state.ended is None and state.signaling is Signaling.UP and state.gate is Gate.OPEN
    assert fx.Say("transfer_failed") in effects and state.transfer_status == 408
    assert fx.TransferEnded(1, "blind", "timed_out", 30.0) in effects
    late, effects = step(state, ev.TransferFinished(1, ok=True, status=200), 41.0)
    assert late.ended is None and effects == [
        fx.StaleEventIgnored("transfer_finished", "no transfer is in progress")
    ]


def test_a_bye_before_the_final_notify_ends_the_session_once() -> None:
    state, effects = fold(*STARTED, (ev.TransferProgress(100), 10.5), (ev.CallerHangup(), 11.0))
    assert state.ended is not None
    assert state.ended.terminal_state == "completed"
    assert state.ended.reason == "caller left during transfer (last NOTIFY 100)"
    assert not any(isinstance(e, fx.HangUp) for e in effects)  # the caller's BYE ended it
    assert fx.TransferEnded(1, "blind", "caller_left", 1.0) in effects
    with pytest.raises(IllegalTransition):
        step(state, ev.TransferFinished(1, ok=True, status=200), 11.1)


def test_a_bye_after_the_final_notify_changes_nothing() -> None:
    state, _ = fold(*STARTED, (ev.TransferFinished(1, ok=True, status=200), 11.0))
    with pytest.raises(IllegalTransition):
        step(state, ev.CallerHangup(), 11.01)
    assert state.ended is not None and state.ended.reason == "transferred"


def test_an_outstanding_payment_is_never_assumed_by_a_transfer() -> None:
    state, effects = fold(
        *UP,
        (ev.ToolIntent("k1", "charge", "write", "d1", ""), 2.0),
        (ev.ToolRequestSent("k1"), 2.1),
        (ev.TransferStarted(TARGET), 3.0),
    )
    # The request on the wire is abandoned, never resent; its intent stays for reconciliation.
    assert fx.CancelToolCalls(("k1",)) in effects
    assert not any(isinstance(e, fx.SendToolRequest) for e in effects)
    state, effects = step(state, ev.TransferFinished(1, ok=True, status=200), 4.0)
    assert state.ended is not None and state.ended.terminal_state == "needs_human"
    assert state.ended.stage == "transfer"
    assert fx.PersistOutstanding(("k1",)) in effects
    assert not any(isinstance(e, fx.SendToolRequest) for e in effects)


def test_a_transfer_during_a_recovery_is_refused_and_changes_nothing() -> None:
    state, _ = fold(*UP, (ev.MediaLost(), 5.0))
    with pytest.raises(IllegalTransition, match="the call is recovering"):
        step(state, ev.TransferStarted(TARGET), 6.0)


def test_old_checkpoints_without_transfer_fields_still_load() -> None:
    state, _ = fold(*STARTED)
    data = state.to_dict()
    del data["transfer_target"], data["transfer_status"]
    loaded = SessionState.from_dict(data)
    assert loaded.transfer_target == "" and loaded.signaling is Signaling.TRANSFERRING


def test_a_media_gap_during_a_transfer_is_recorded_not_recovered() -> None:
    # The transferee often stops its RTP to us while it calls the target: that is no fault of
    # ours, so no recovery, no "reconnecting", no probes.
    state, effects = fold(*STARTED, (ev.MediaLost(), 11.0))
    assert state.media is Media.INTERRUPTED and state.recovery is None
    assert not any(isinstance(e, fx.StartRecovery | fx.Say | fx.ScheduleTimer) for e in effects)
    state, effects = step(state, ev.MediaRestored(1), 12.0)
    assert state.media is Media.FLOWING and state.recovery is None and effects == []
    # ... and a gap still open when the transfer fails is recovered from then on.
    state, _ = fold(*STARTED, (ev.MediaLost(), 11.0))
    state, effects = step(state, ev.TransferFinished(1, ok=False, status=486), 12.0)
    assert state.recovery is not None and state.recovery.interruptions == ("media",)
    assert fx.StartRecovery(1, "media", 22.0) in effects
    assert state.gate is Gate.FROZEN  # reconciles once the media is back


def test_an_agent_link_lost_and_back_during_a_transfer_needs_no_recovery() -> None:
    state, effects = fold(*STARTED, (ev.AgentLinkLost(), 11.0))
    assert state.agent_link is AgentLink.LOST and state.recovery is None
    assert not any(isinstance(e, fx.StartRecovery) for e in effects)
    # It names the transfer's generation: an older one is stale.
    stale, effects = step(state, ev.AgentLinkRestored(0), 11.5)
    assert stale.agent_link is AgentLink.LOST and isinstance(effects[0], fx.StaleEventIgnored)
    state, _ = step(state, ev.AgentLinkRestored(1), 12.0)
    state, effects = step(state, ev.DeadlineFired("transfer_notify", 1), 40.0)
    assert state.agent_link is AgentLink.CONNECTED and state.gate is Gate.OPEN
    assert not any(isinstance(e, fx.StartRecovery) for e in effects)


def test_no_input_asks_nobody_during_a_transfer() -> None:
    policy = {**POLICY, "no_input_s": 5.0}
    up = ((ev.CallOffered("+15550001234", "svc", policy), 0.0), (ev.CallAnswered(), 1.0))
    state, _ = fold(*up, (ev.TransferStarted(TARGET), 2.0))
    state, effects = step(state, ev.DeadlineFired("no_input", 0), 6.0)
    assert not any(isinstance(e, fx.Say) for e in effects)


def test_recovery_retries_logged_during_a_transfer_by_older_releases_fold_as_no_ops() -> None:
    # Before a transfer was its own phase it ran as a recovery, whose retries were logged.
    state, _ = fold(*STARTED)
    after, effects = step(state, ev.RecoveryRetryDue(1, 0), 10.2)
    assert effects == [] and after.version == state.version + 1
    assert after.transfer == state.transfer and after.deadlines == state.deadlines


def test_a_checkpoint_of_a_transfer_running_as_a_recovery_loads_as_the_transfer_phase() -> None:
    # What the release before wrote mid-transfer with the caller's RTP gone (ed48d6c's fold of
    # STARTED, then media_lost at 11.0): the transfer's recovery, joined by the media, with its
    # deadline, honesty and retry timers beside the guard.
    state, _ = fold(*STARTED, (ev.MediaLost(), 11.0))
    data = state.to_dict()
    del data["transfer"]
    data["recovery"] = {
        "generation": 1,
        "interruptions": ["transfer", "media"],
        "started_at": 10.0,
        "deadline": 45.0,
        "attempt": 1,
    }
    data["deadlines"] = {
        "recovery": {"due": 45.0, "generation": 1},
        "recovery_retry": {"due": 10.9, "generation": 1},
        "transfer_notify": {"due": 40.0, "generation": 1},
        "max_duration": {"due": 601.0, "generation": 0},
    }
    loaded = SessionState.from_dict(data)
    assert loaded.transfer == Transfer(1, "", 10.0, TransferStage.REFERRING)
    assert loaded.recovery is None and loaded.media is Media.INTERRUPTED
    assert set(loaded.deadlines) == {"transfer_notify", "max_duration"}
    assert "transferring (referring)" in loaded.status()
    # The new machine carries on from it: the transfer fails, the gap is recovered under the
    # transfer's generation, and the media coming back ends that recovery.
    back, effects = step(loaded, ev.TransferFinished(1, ok=False, status=486), 12.0)
    assert back.recovery is not None and back.recovery.generation == 1
    assert fx.StartRecovery(1, "media", 22.0) in effects
    restored, _ = step(back, ev.MediaRestored(1), 13.0)
    assert restored.recovery is None and restored.gate is Gate.OPEN
    # ... or it succeeds.
    after, _ = step(loaded, ev.TransferFinished(1, ok=True, status=200), 12.0)
    assert after.ended is not None and after.ended.reason == "transferred"


def test_a_log_from_when_transfers_ran_as_recoveries_folds_as_it_did() -> None:
    # The two steps such logs hold that a transfer no longer makes: a retry of its recovery
    # (a no-op) and a probe's answer; one that found the dialog gone ends the session as then.
    state, _ = fold(*STARTED, (ev.RecoveryRetryDue(1, 0), 10.3))
    alive, effects = step(state, ev.RecoveryProbed(1, 0, 200, "OK"), 10.4)
    assert effects == [] and alive.version == state.version + 1 and alive.ended is None
    gone, _ = step(state, ev.RecoveryProbed(1, 0, 481, "Call/Transaction Does Not Exist"), 10.4)
    assert gone.ended is not None
    assert (gone.ended.terminal_state, gone.ended.stage) == ("failed", "signaling")
    # A gap during the transfer, the transfer failing, then the media back, as logged then.
    state, _ = fold(
        *STARTED,
        (ev.MediaLost(), 11.0),
        (ev.TransferFinished(1, ok=False, status=486), 12.0),
        (ev.MediaRestored(1), 13.0),
    )
    assert state.version == 9 and state.recovery is None and state.gate is Gate.OPEN
