"""Properties of the session state machine, driven by hypothesis with random event sequences.

The stateful test feeds ``step`` every event type (ids from small sets so they sometimes match,
generations near the current one, invalid outcomes and kinds too) on a fake clock that only moves
forward, and fires the deadlines the state lists at their due time. After every step it checks the
invariants of seed 000 (one terminal state, the side-effect gate) and seed 001 (generations, one
recovery owns the session), and that live state equals the fold of the logged events (STYLE.md
habit 6) from scratch and from a JSON checkpoint.

The bugs these tests found are fixed and pinned as regressions in ``test_session_machine.py``
(or in the test module of the transition at fault: ``test_session_callback.py``, ...).
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Any

import hypothesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from session import effects as fx
from session import events as ev
from session.event_reference import effects_of
from session.ledger import to_query
from session.machine import (
    TRANSITIONS,
    GateClosed,
    Ignore,
    IllegalTransition,
    SessionTerminated,
    replay,
    step,
)
from session.state import TERMINAL_STATES, Gate, SessionState

SESSION_ID = "prop-session"
TURN_IDS = ("t1", "t2")
RESPONSE_IDS = ("r1", "r2")
KEYS = ("k1", "k2", "k3")
APPROVALS = ("a1", "a2")
DEADLINE_NAMES = (
    "recovery",
    "honesty",
    "max_duration",
    "recovery_retry",
    "no_input",
    "no_input_final",
    "ring",
    "no_such_timer",
)

Logged = list[tuple[ev.Event, float]]
INTERRUPTIONS = (ev.MediaLost, ev.AgentLinkLost, ev.ReinviteStarted, ev.TransferStarted)
# Answers to a recovery probe (an in-dialog OPTIONS): the first four mean the dialog is gone.
PROBE_ANSWERS = (
    (481, "Call/Transaction Does Not Exist"),
    (408, "Request Timeout"),
    (503, "Transport Error"),
    (0, ""),
    (200, "OK"),
    (405, "Method Not Allowed"),
    (501, "Not Implemented"),
    (503, "Service Unavailable"),
)
GONE_ANSWERS = PROBE_ANSWERS[:4]


POLICIES: st.SearchStrategy[dict[str, float]] = st.fixed_dictionaries(
    {},
    optional={
        "recovery_timeout_s": st.sampled_from([20.0, 3.0, 0.5, 0.0]),
        "honesty_after_s": st.sampled_from([2.0, 0.2]),
        "max_duration_s": st.sampled_from([3600.0, 90.0, 0.0]),
        "retry_base_s": st.sampled_from([0.25, 0.1, 1.0]),
        "retry_cap_s": st.sampled_from([4.0, 1.0, 0.1]),
        "retry_max_attempts": st.integers(0, 5),
        "no_input_s": st.sampled_from([0.0, 5.0, 30.0]),
        "no_input_grace_s": st.sampled_from([1.0, 10.0]),
        # 0: a transfer that succeeds ends the session (logs from before rejoin); else it is
        # away until then (session.away).
        "resume_ttl_s": st.sampled_from([0.0, 600.0, 2.0]),
        # 0: media lost for good ends the session at the deadline (logs from before callbacks);
        # else it is dropped until then (session.callback).
        "callback_window_s": st.sampled_from([0.0, 120.0, 2.0]),
    },
)


def near(value: int) -> st.SearchStrategy[int]:
    return st.sampled_from(sorted({max(0, value - 1), value, value + 1}))


def any_event(state: SessionState) -> st.SearchStrategy[ev.Event]:
    """Every event type, with fields that are sometimes right for ``state`` and often not."""
    attempt = state.recovery.attempt if state.recovery is not None else 0
    return _any_event(state.recovery_generation, attempt)


@functools.cache
def _any_event(generation: int, current_attempt: int) -> st.SearchStrategy[ev.Event]:
    # Cached: building strategies costs far more than drawing from them.
    return st.one_of(list(blind_strategies(generation, current_attempt).values()))


EventStrategies = dict[type[ev.Event], st.SearchStrategy[ev.Event]]


def blind_strategies(generation: int, current_attempt: int) -> EventStrategies:
    gen = near(generation)
    attempt = near(current_attempt)
    turn_ids = st.sampled_from(TURN_IDS)
    response_ids = st.sampled_from(RESPONSE_IDS)
    keys = st.sampled_from(KEYS)
    return {
        ev.CallOffered: st.builds(
            ev.CallOffered,
            caller=st.sampled_from(["+15550001234", ""]),
            called_user=st.just("service"),
            policy=POLICIES,
        ),
        ev.CallPlaced: st.builds(
            ev.CallPlaced,
            target=st.just("sip:desk@example.org"),
            ring_timeout_s=st.sampled_from([1.0, 30.0]),
            policy=POLICIES,
        ),
        ev.CallAnswered: st.just(ev.CallAnswered()),
        ev.ReinviteStarted: st.just(ev.ReinviteStarted()),
        ev.ReinviteFinished: st.builds(ev.ReinviteFinished, generation=gen, ok=st.booleans()),
        ev.TransferStarted: st.builds(
            ev.TransferStarted,
            target=st.just("sip:desk@example.org"),
            mode=st.sampled_from(["blind", "bridge", "attended", "bogus"]),
        ),
        ev.TransferFellBack: st.builds(ev.TransferFellBack, generation=gen, status=st.just(603)),
        ev.BridgeUp: st.builds(ev.BridgeUp, generation=gen),
        ev.ConsultAnswered: st.builds(ev.ConsultAnswered, generation=gen),
        ev.TransferProgress: st.builds(
            ev.TransferProgress, status=st.sampled_from([100, 180, 200, 503])
        ),
        ev.TransferFinished: st.builds(ev.TransferFinished, generation=gen, ok=st.booleans()),
        ev.MediaLost: st.just(ev.MediaLost()),
        ev.MediaRestored: st.builds(ev.MediaRestored, generation=gen),
        ev.AgentLinkLost: st.just(ev.AgentLinkLost()),
        ev.AgentLinkRestored: st.builds(ev.AgentLinkRestored, generation=gen),
        ev.TurnStarted: st.builds(ev.TurnStarted, turn_id=turn_ids),
        ev.TurnCommitted: st.builds(ev.TurnCommitted, turn_id=turn_ids),
        ev.ResponseStarted: st.builds(
            ev.ResponseStarted, response_id=response_ids, turn_id=turn_ids
        ),
        ev.ResponseInterrupted: st.builds(
            ev.ResponseInterrupted, response_id=response_ids, heard_ms=st.just(120)
        ),
        ev.ResponseFinished: st.builds(
            ev.ResponseFinished, response_id=response_ids, heard_ms=st.just(900)
        ),
        ev.BargeInJudged: st.builds(
            ev.BargeInJudged,
            response_id=response_ids,
            outcome=st.sampled_from(["confirmed", "false", "bogus"]),
            heard_ms=st.just(120),
        ),
        ev.PromptCut: st.builds(
            ev.PromptCut,
            say_id=st.sampled_from(["say1", "say2"]),
            prompt=st.sampled_from(["reconnecting", "still_there"]),
            heard_ms=st.sampled_from([0, 640]),
        ),
        ev.ToolIntent: st.builds(
            ev.ToolIntent,
            key=keys,
            tool=st.sampled_from(["book", "lookup"]),
            kind=st.sampled_from(["write", "read", "delete"]),
            digest=st.just("d"),
            turn_id=turn_ids,
            approval_valid_s=st.sampled_from([None, 0.5, 300.0]),
        ),
        ev.ToolRequestSent: st.builds(ev.ToolRequestSent, key=keys),
        ev.ToolRequestWithheld: st.builds(ev.ToolRequestWithheld, key=keys),
        ev.ApprovalGiven: st.builds(ev.ApprovalGiven, approval_id=st.sampled_from(APPROVALS)),
        ev.CallerSaid: st.builds(
            ev.CallerSaid,
            text=st.sampled_from(["yes", "fifty nine cents", ""]),
            grammar=st.just("confirm"),
            confidence=st.just(0.6),
            decision=st.sampled_from(["accepted", "confirmed", "rejected", "bogus"]),
        ),
        ev.ToolReceipt: st.builds(
            ev.ToolReceipt,
            key=keys,
            outcome=st.sampled_from(["committed", "failed", "not_started", "maybe"]),
        ),
        ev.RecoveryRetryDue: st.builds(ev.RecoveryRetryDue, generation=gen, attempt=attempt),
        ev.RecoveryProbed: st.builds(
            lambda g, a, answer: ev.RecoveryProbed(g, a, *answer),
            gen,
            st.sampled_from(sorted({max(0, current_attempt - 1), current_attempt})),
            st.sampled_from(PROBE_ANSWERS),
        ),
        ev.DeadlineFired: st.builds(
            ev.DeadlineFired,
            name=st.sampled_from(DEADLINE_NAMES),
            generation=st.one_of(gen, st.just(0)),
        ),
        ev.CallRejoined: st.builds(
            ev.CallRejoined,
            generation=st.integers(0, 3),
            caller=st.just("******1234"),
            via=st.sampled_from(["header", "uui"]),
        ),
        ev.ResumeReused: st.just(ev.ResumeReused()),
        ev.CalledBack: st.builds(
            ev.CalledBack,
            generation=st.integers(0, 3),
            caller=st.just("******1234"),
            with_code=st.booleans(),
        ),
        ev.ResumeCodeIssued: st.builds(ev.ResumeCodeIssued, digest=st.sampled_from(["d1", ""])),
    }


# Events that usually end the session; drawn less often so sessions get somewhere first.
ENDING_STRATEGIES: EventStrategies = {
    ev.CallerHangup: st.just(ev.CallerHangup()),
    ev.DialogFailed: st.builds(
        ev.DialogFailed, status=st.sampled_from([0, 408, 500]), reason=st.just("x")
    ),
    ev.SessionExpired: st.builds(ev.SessionExpired, reason=st.just("No session refresh")),
    ev.BridgeEnded: st.builds(ev.BridgeEnded, by=st.sampled_from(["caller", "target", "x"])),
    ev.LegUnanswered: st.builds(
        ev.LegUnanswered, status=st.sampled_from([486, 603, 480, 404, 503]), reason=st.just("x")
    ),
    ev.AgentFailed: st.builds(ev.AgentFailed, reason=st.just("on_dtmf raised ValueError")),
    ev.AgentLinkFailed: st.builds(ev.AgentLinkFailed, reason=st.just("not back within 5 s")),
    ev.ServerHangup: st.builds(
        ev.ServerHangup,
        outcome=st.sampled_from(["completed", "canceled", "bogus"]),
        reason=st.just("agent done"),
    ),
    ev.ToolReceipt: st.builds(
        ev.ToolReceipt, key=st.sampled_from(KEYS), outcome=st.just("unknown")
    ),
    ev.ToolReceiptConflicted: st.builds(
        ev.ToolReceiptConflicted,
        key=st.sampled_from(KEYS),
        stored=st.just("committed"),
        offered=st.sampled_from(["failed", "not_started"]),
    ),
    ev.OperatorResolution: st.builds(
        ev.OperatorResolution,
        terminal_state=st.sampled_from([*TERMINAL_STATES, "bogus"]),
        note=st.sampled_from(["", "checked by phone"]),
    ),
    ev.OwnerLost: st.builds(ev.OwnerLost, reason=st.just("the process serving the call died")),
    ev.SessionReaped: st.builds(ev.SessionReaped, reason=st.just("worker died")),
    ev.AwayExpired: st.builds(ev.AwayExpired, reason=st.just("the resume handle expired unused")),
    ev.CallbackEnded: st.builds(
        ev.CallbackEnded, cause=st.sampled_from(["window", "declined", "code_refused", "bogus"])
    ),
    ev.RecoveryProbed: st.builds(
        lambda g, answer: ev.RecoveryProbed(g, 0, *answer),
        st.integers(1, 2),
        st.sampled_from(GONE_ANSWERS),
    ),
}
ENDING_EVENTS: st.SearchStrategy[ev.Event] = st.one_of(list(ENDING_STRATEGIES.values()))


# Events that fit the state (current generation, open turn, active response, known keys), so runs
# reach recovery, reconciliation and receipts far more often than blind draws would.


def lifecycle_events(state: SessionState) -> list[ev.Event]:
    if state.signaling == "away":
        # Coming back (the right generation, or a stale one), a reuse, or the handle's end.
        g = state.signaling_generation
        return [
            ev.CallRejoined(g + 1, "******1234", "header"),
            ev.CallRejoined(g, "******1234", "uui"),
            ev.ResumeReused(),
            ev.AwayExpired("the resume handle expired unused"),
        ]
    if state.signaling == "dropped":
        # Calling back (with the code or without, the right generation or a stale one), a
        # reuse, the window's end or a caller choosing a new session.
        g = state.signaling_generation
        return [
            ev.CalledBack(g + 1, "******1234", with_code=True),
            ev.CalledBack(g + 1, "******1234"),
            ev.CalledBack(g, "******1234", with_code=True),
            ev.ResumeReused(),
            ev.CallbackEnded("window"),
            ev.CallbackEnded("declined"),
        ]
    recovery = state.recovery
    if recovery is None:
        # Interruptions; more of them during a recovery come from blind draws.
        events: list[ev.Event] = [ev.CallAnswered(), ev.TransferProgress(180)]
        if state.media == "flowing":
            events.append(ev.MediaLost())
        if state.agent_link == "connected":
            events.append(ev.AgentLinkLost())
        if state.signaling == "up":
            events += [ev.ReinviteStarted(), ev.TransferStarted("sip:desk@example.org")]
        return events
    g = recovery.generation
    events = [ev.RecoveryRetryDue(g, recovery.attempt)]
    if recovery.attempt > 0:
        # The answer to the last attempt: mostly "the dialog is there", sometimes "gone".
        last = recovery.attempt - 1
        events += [ev.RecoveryProbed(g, last, *answer) for answer in PROBE_ANSWERS[3:]]
    restores: dict[str, list[ev.Event]] = {
        "media": [ev.MediaRestored(g)],
        "agent_link": [ev.AgentLinkRestored(g)],
        "reinvite": [ev.ReinviteFinished(g, ok=True), ev.ReinviteFinished(g, ok=False)],
        "transfer": [
            ev.TransferProgress(180),
            ev.TransferFinished(g, ok=False),
            ev.TransferFinished(g, ok=True),
        ],
    }
    for kind in recovery.interruptions:
        events += restores[kind]
    return events


def conversation_events(state: SessionState) -> list[ev.Event]:
    events: list[ev.Event] = []
    if state.turn is not None and not state.turn.committed:
        events.append(ev.TurnCommitted(state.turn.turn_id))
    else:
        events += [ev.TurnStarted(t) for t in TURN_IDS]
    if state.response is not None:
        rid = state.response.response_id
        events += [
            ev.ResponseFinished(rid, 500),
            ev.ResponseInterrupted(rid, 200),
            ev.ApprovalGiven("a1"),
        ]
    elif state.turn is not None:
        events += [ev.ResponseStarted(r, state.turn.turn_id) for r in RESPONSE_IDS]
    return events


def tool_events(state: SessionState) -> list[ev.Event]:
    events: list[ev.Event] = []
    for key in KEYS:
        if key not in state.outstanding_keys():
            events += [ev.ToolIntent(key, "book", kind, "d", "t1") for kind in ("write", "read")]
    for o in state.outstanding:
        if o.stage == "intended":
            events.append(ev.ToolRequestSent(o.key))
        outcomes = ("committed", "failed", "not_started", "unknown")
        events += [ev.ToolReceipt(o.key, outcome) for outcome in outcomes]
    return events


def ending_probes(state: SessionState) -> list[ev.Event]:
    """Every event that may end the session in ``state``."""
    probes: list[ev.Event] = [
        ev.CallerHangup(),
        ev.DialogFailed(500, "server error"),
        ev.SessionExpired("No session refresh received."),
        ev.ServerHangup("completed", "agent done"),
        ev.ServerHangup("canceled", "agent gave up"),
        ev.SessionReaped("worker died"),
        *(ev.OperatorResolution(terminal, "checked") for terminal in TERMINAL_STATES),
        *(ev.ToolReceipt(key, "unknown") for key in state.outstanding_keys()),
        ev.AwayExpired("the resume handle expired unused"),
        ev.CallbackEnded("window"),
        ev.CallbackEnded("no_answer"),
    ]
    if state.recovery is not None:
        probes += [
            ev.TransferFinished(state.recovery.generation, ok=True),
            ev.DeadlineFired("recovery", state.recovery.generation),
        ]
        if state.recovery.attempt > 0:
            g, last = state.recovery.generation, state.recovery.attempt - 1
            probes += [ev.RecoveryProbed(g, last, *answer) for answer in GONE_ANSWERS]
    if "max_duration" in state.deadlines:
        probes.append(ev.DeadlineFired("max_duration", 0))
    return probes


def away_may_return(state: SessionState) -> bool:
    return state.policy.resume_ttl_s > 0 and not state.outstanding


def roundtrip(state: SessionState) -> SessionState:
    """The checkpoint path: to_dict, through JSON text, back."""
    return SessionState.from_dict(json.loads(json.dumps(state.to_dict())))


def is_stale(effects: list[fx.Effect]) -> bool:
    return len(effects) == 1 and isinstance(effects[0], fx.StaleEventIgnored)


# The effect kinds docs/events.md says each event's handler may carry, read from the code
# (session/event_reference.py): every step below must stay within them.
MAY_CARRY = {cls: frozenset(effects_of(rule.handler)) for cls, rule in TRANSITIONS.items()}


class SessionProperties(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = SessionState(SESSION_ID)
        self.now = 0.0
        self.logged: Logged = []  # exactly the events that moved ``version``, as the store does
        self.checkpoint: tuple[SessionState, int] = (self.state, 0)
        self.ended_as: str | None = None
        self.refused_after_end = 0
        self.last_checked: dict[str, tuple[object, ...]] = {}

    # --- driving ---------------------------------------------------------------------------------

    def feed(self, event: ev.Event) -> None:
        before = self.state
        try:
            after, effects = step(before, event, self.now)
        except IllegalTransition as exc:
            self.check_refusal(before, event, exc)
            self.refused_after_end += before.terminal
            return
        self.check_step(before, event, after, effects)
        self.state = after
        if after.version != before.version:
            self.logged.append((event, self.now))

    @initialize(prefix=st.sampled_from([2, 2, 2, 1, 0]), policy=POLICIES)
    def start(self, prefix: int, policy: dict[str, float]) -> None:
        # Most runs start with a call in progress, so they get past the first two events.
        if prefix >= 1:
            self.feed(ev.CallOffered("+15550001234", "service", policy))
            self.now += 0.5
        if prefix >= 2:
            self.feed(ev.CallAnswered())

    def running(self) -> bool:
        # A few events after the end suffice to check that they are refused.
        return self.refused_after_end < 3

    # Hypothesis runs each example with a random subset of the rules (swarm testing), so every
    # kind of event has a rule of its own.

    @precondition(running)
    @rule(data=st.data())
    def lifecycle_event(self, data: st.DataObject) -> None:
        self.feed(data.draw(st.sampled_from(lifecycle_events(self.state))))

    @precondition(running)
    @rule(data=st.data())
    def conversation_event(self, data: st.DataObject) -> None:
        self.feed(data.draw(st.sampled_from(conversation_events(self.state))))

    @precondition(running)
    @rule(data=st.data())
    def tool_event(self, data: st.DataObject) -> None:
        self.feed(data.draw(st.sampled_from(tool_events(self.state))))

    @precondition(running)
    @rule(data=st.data())
    def random_event(self, data: st.DataObject) -> None:
        self.feed(data.draw(any_event(self.state)))

    @precondition(running)
    @rule(data=st.data(), roll=st.integers(0, 3))
    def ending_event(self, data: st.DataObject, roll: int) -> None:
        # Only one call in four, so sessions get somewhere first (hypothesis favours small rolls).
        if roll == 3:
            self.feed(data.draw(ENDING_EVENTS))

    @precondition(lambda self: self.running() and self.state.recovery is not None)
    @rule(
        live=st.sampled_from(PROBE_ANSWERS[4:]),
        gone=st.sampled_from(GONE_ANSWERS),
        roll=st.integers(0, 3),
    )
    def probe_answer(self, live: tuple[int, str], gone: tuple[int, str], roll: int) -> None:
        """The answer to the recovery's last OPTIONS: after making the first attempt if none was
        made yet; the dialog is gone one time in four."""
        recovery = self.state.recovery
        assert recovery is not None
        retry = self.state.deadlines.get("recovery_retry")
        if recovery.attempt == 0 and retry is not None:
            self.now = max(self.now, retry.due)
            self.feed(ev.RecoveryRetryDue(recovery.generation, 0))
            recovery = self.state.recovery
        if recovery is None or recovery.attempt == 0 or self.state.terminal:
            return
        answer = gone if roll == 3 else live
        self.feed(ev.RecoveryProbed(recovery.generation, recovery.attempt - 1, *answer))

    @rule(dt=st.sampled_from([0.0, 0.01, 0.3, 1.5, 6.0]))
    def advance_clock(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: bool(self.state.deadlines))
    @rule(data=st.data())
    def fire_deadline(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.state.deadlines)))
        if name == "max_duration" and data.draw(st.integers(0, 3)) < 3:
            return  # it ends the call: fire it less often than the others
        deadline = self.state.deadlines[name]
        self.now = max(self.now, deadline.due)
        if name == "recovery_retry":
            recovery = self.state.recovery
            attempt = recovery.attempt if recovery is not None else 0
            self.feed(ev.RecoveryRetryDue(deadline.generation, attempt))
        else:
            self.feed(ev.DeadlineFired(name, deadline.generation))

    @precondition(running)
    @rule(data=st.data())
    def stray_timer(self, data: st.DataObject) -> None:
        """A timer of this or a neighbouring generation, due or not: late, early or duplicated."""
        state = self.state
        attempt = state.recovery.attempt if state.recovery is not None else 0
        self.feed(
            data.draw(
                st.one_of(
                    st.builds(
                        ev.DeadlineFired,
                        name=st.sampled_from(DEADLINE_NAMES),
                        generation=near(state.recovery_generation),
                    ),
                    st.builds(
                        ev.RecoveryRetryDue,
                        generation=near(state.recovery_generation),
                        attempt=near(attempt),
                    ),
                )
            )
        )

    @rule()
    def take_checkpoint(self) -> None:
        self.checkpoint = (roundtrip(self.state), len(self.logged))

    # --- per-step checks -------------------------------------------------------------------------

    def check_refusal(self, before: SessionState, event: ev.Event, exc: IllegalTransition) -> None:
        # Refusals change nothing (the machine returns no state), and say what and where.
        assert exc.event_type == event.type
        assert event.type in str(exc) and before.status() in str(exc)
        if before.terminal:
            assert isinstance(exc, SessionTerminated)
        else:
            assert not isinstance(exc, SessionTerminated)
        if isinstance(exc, GateClosed):
            assert before.gate is not Gate.OPEN

    def check_step(
        self,
        before: SessionState,
        event: ev.Event,
        after: SessionState,
        effects: list[fx.Effect],
    ) -> None:
        assert not before.terminal, "an event was accepted after the terminal state"
        for effect in effects:
            json.dumps(effect.to_dict())

        # docs/events.md: outside its states an accepted event is one its rule ignores; inside,
        # its step carries only the kinds the page lists for it (the bound read from the code).
        rule = TRANSITIONS[type(event)]
        if before.signaling not in rule.legal_in:
            assert isinstance(rule.elsewhere, Ignore) and is_stale(effects), event
        else:
            extra = {e.kind for e in effects} - {e.kind for e in MAY_CARRY[type(event)]}
            assert not extra, f"{event.type} carried {sorted(extra)}, which docs/events.md omits"

        # The side-effect gate (seed 000): new work only through an open gate.
        if isinstance(event, ev.ToolIntent) and event.kind == "write":
            assert before.gate is Gate.OPEN
        if isinstance(event, ev.TurnStarted | ev.ResponseStarted):
            assert before.gate is Gate.OPEN
        if isinstance(event, ev.ToolRequestSent):
            intent = next(o for o in before.outstanding if o.key == event.key)
            assert intent.kind == "read" or before.gate is Gate.OPEN

        # Any interruption, in one step: gate frozen, playback cut, one recovery (seed 000/001).
        # During a transfer the session is halted already: a broken dimension is only recorded.
        if isinstance(event, INTERRUPTIONS) and before.transfer is None:
            assert after.gate is Gate.FROZEN and after.response is None
            assert after.playback_generation == before.playback_generation + 1
            assert fx.ClearPlayout(after.playback_generation) in effects
        if isinstance(event, INTERRUPTIONS):
            started = [e for e in effects if isinstance(e, fx.StartRecovery)]
            if isinstance(event, ev.TransferStarted):
                # Its own phase, never a recovery (session/transfer.py), with a fresh generation.
                assert not started and after.recovery is None and after.transfer is not None
                assert after.transfer.generation == before.recovery_generation + 1
            elif before.transfer is not None:
                # Broken during a transfer: recorded, recovered only if the caller comes back.
                assert not started and after.recovery is None
            elif before.recovery is None:
                assert after.recovery is not None
                assert started == [
                    fx.StartRecovery(
                        before.recovery_generation + 1,
                        after.recovery.interruptions[0],
                        self.now + before.policy.recovery_timeout_s,
                    )
                ]
            else:
                assert not started and after.recovery is not None
                assert after.recovery.generation == before.recovery.generation

        # A recovery and a transfer never run at once; no recovery is ever a transfer's.
        assert after.recovery is None or after.transfer is None
        assert after.recovery is None or "transfer" not in after.recovery.interruptions
        for effect in effects:
            if isinstance(effect, fx.StartRecovery | fx.RecoveryFinished):
                kinds = getattr(effect, "interruptions", None) or (effect.interruption,)
                assert "transfer" not in kinds, effect
        # Every transfer phase that ends says so once, with how long it ran.
        ended = [e for e in effects if isinstance(e, fx.TransferEnded)]
        if before.transfer is not None and after.transfer is None:
            assert ended == [
                fx.TransferEnded(
                    before.transfer.generation,
                    before.transfer.mode,
                    ended[0].outcome if ended else "",
                    round(self.now - before.transfer.started_at, 6),
                )
            ]
        else:
            assert not ended

        # A probe's answer: the dialog is gone (the session fails at once, no BYE), or it is
        # there (nothing changes but the version: the answer is logged).
        # (One of a transfer's generation is from a log of when transfers ran as recoveries:
        # it folds as it did then, so a dialog gone still ends the session: machine.py,
        # _of_the_transfer.)
        of_transfer = before.transfer is not None and before.recovery is None
        if isinstance(event, ev.RecoveryProbed) and not is_stale(effects):
            if of_transfer:
                assert before.transfer is not None
                assert event.generation == before.transfer.generation
            else:
                assert before.recovery is not None
                assert event.generation == before.recovery.generation
                assert event.attempt < before.recovery.attempt
            if (event.status, event.reason) in GONE_ANSWERS:
                assert after.ended is not None
                assert (after.ended.terminal_state, after.ended.stage) == ("failed", "signaling")
                assert after.ended.reason.startswith("dialog gone: OPTIONS ")
                assert not any(isinstance(e, fx.HangUp | fx.Say) for e in effects)
                if before.recovery is not None:
                    assert (
                        fx.RecoveryFinished(
                            before.recovery.generation,
                            before.recovery.interruptions,
                            "failed",
                            round(self.now - before.recovery.started_at, 6),
                        )
                        in effects
                    )
            else:
                assert effects == []
                assert replace(after, version=before.version) == before

        # Away and back (session.away).
        self.check_away(before, event, after, effects)
        self.check_dropped(before, event, after, effects)

        # Versions: +1 per logged event; stale events change nothing at all.
        if is_stale(effects):
            assert after.version == before.version
            assert after is before or after == before
        else:
            assert after.version == before.version + 1
        assert not any(isinstance(e, fx.StaleEventIgnored) for e in effects) or is_stale(effects)

        # Generations never go back (seed 001).
        assert after.playback_generation >= before.playback_generation
        assert after.recovery_generation >= before.recovery_generation

        # Exactly one terminal state, announced once, by the step that reached it.
        if after.ended is None:
            assert not any(isinstance(e, fx.Finished) for e in effects)
        else:
            assert self.ended_as is None
            self.ended_as = after.ended.terminal_state
            self.check_ending(before, event, after, effects)
            if after.ended.terminal_state in ("completed", "canceled"):
                assert all(o.stage != "unknown" for o in after.outstanding)

    def check_away(
        self,
        before: SessionState,
        event: ev.Event,
        after: SessionState,
        effects: list[fx.Effect],
    ) -> None:
        if before.signaling == "away" and not is_stale(effects):
            # Nobody is on the line: only a rejoin, a reuse's freeze or an ending is accepted.
            assert isinstance(
                event,
                ev.CallRejoined | ev.ResumeReused | ev.AwayExpired | ev.OperatorResolution
                | ev.SessionReaped,
            ), event
            assert not any(isinstance(e, fx.Say | fx.HangUp | fx.SendToolRequest) for e in effects)
        if after.signaling == "away" and before.signaling != "away":
            # A transfer that succeeded, with a handle that may bring the caller back.
            assert isinstance(event, ev.TransferFinished) and event.ok
            assert before.policy.resume_ttl_s > 0 and not before.outstanding
            assert after.away_until == self.now + before.policy.resume_ttl_s
            assert fx.HangUp("transferred") in effects and fx.ReleaseMedia() in effects
            assert not any(isinstance(e, fx.Finished) for e in effects)
            hypothesis.event("went away")
        if isinstance(event, ev.TransferFinished) and event.ok and after.signaling != "away":
            # Without a handle's lifetime (old logs) or with a tool outcome unknown: ended.
            assert is_stale(effects) or after.ended is not None
            assert is_stale(effects) or not away_may_return(before)
        if isinstance(event, ev.CallRejoined) and not is_stale(effects):
            assert before.signaling == "away"
            assert event.generation == before.signaling_generation + 1
            assert before.away_until is not None and self.now < before.away_until
            assert after.signaling == "offered" and after.away_until is None
            assert after.signaling_generation == event.generation
            # Reconciliation first (seed 000): the gate opens only with nothing outstanding.
            # (what never left is not asked about: session/ledger.py)
            assert after.gate is (
                Gate.OPEN if not to_query(after.outstanding) else Gate.RECONCILING
            )
            assert after.turn is None and after.response is None and after.recovery is None
            hypothesis.event("rejoined")
        if isinstance(event, ev.AwayExpired) and not is_stale(effects):
            assert before.away_until is not None and self.now >= before.away_until
            assert after.ended is not None
            assert (after.ended.terminal_state, after.ended.reason) == ("completed", "transferred")
            hypothesis.event("away expired")
        if isinstance(event, ev.ResumeReused) and not is_stale(effects) and not before.terminal:
            # Possibly a stolen handle: writes freeze; only reconciliation may open the gate.
            assert after.gate is not Gate.OPEN or not to_query(before.outstanding)
            if before.gate is not Gate.CLOSED:
                assert any(
                    isinstance(e, fx.GateChanged) and e.new == "frozen" for e in effects
                ) or before.gate is Gate.FROZEN

    def check_dropped(
        self,
        before: SessionState,
        event: ev.Event,
        after: SessionState,
        effects: list[fx.Effect],
    ) -> None:
        if before.signaling == "dropped" and not is_stale(effects):
            # Nobody is on the line: only a callback, a reuse's freeze, a receipt (the intents
            # of a dropped or parked session settle meanwhile: machine.TRANSITIONS) or an
            # ending is accepted.
            assert isinstance(
                event,
                ev.CalledBack | ev.ResumeReused | ev.CallbackEnded | ev.OperatorResolution
                | ev.SessionReaped | ev.ToolReceipt | ev.ToolReceiptConflicted,
            ), event
            assert not any(isinstance(e, fx.Say | fx.HangUp) for e in effects)
            # Nothing is sent but by a callback that reopens the gate: then each write held at
            # the drop goes once, or is settled unsent if its approval lapsed (session/gate.py).
            released = [e.key for e in effects if isinstance(e, fx.SendToolRequest)]
            lapsed = [e.key for e in effects if isinstance(e, fx.SettleUnsent)]
            held = [o for o in before.outstanding if o.stage == "held"]
            if isinstance(event, ev.CalledBack) and after.gate is Gate.OPEN:
                assert released == [
                    o.key for o in held if o.valid_until is None or self.now <= o.valid_until
                ]
                assert sorted(released + lapsed) == sorted(o.key for o in held)
            else:
                assert not released
        if after.signaling == "dropped" and before.signaling != "dropped":
            # Media lost for good with the dialog up: the deadline's ending, minus the ending.
            assert isinstance(event, ev.DeadlineFired) and event.name == "recovery"
            assert before.policy.callback_window_s > 0 and before.signaling == "up"
            assert after.dropped_until == self.now + before.policy.callback_window_s
            assert any(isinstance(e, fx.HangUp) for e in effects)
            assert not any(isinstance(e, fx.Finished) for e in effects)
            hypothesis.event("dropped")
        if isinstance(event, ev.CalledBack) and not is_stale(effects):
            assert before.signaling == "dropped"
            assert before.dropped_until is not None and self.now < before.dropped_until
            assert event.with_code or not before.resume_code
            assert after.signaling == "offered" and after.dropped_until is None
            # (what never left is not asked about: session/ledger.py)
            assert after.gate is (
                Gate.OPEN if not to_query(after.outstanding) else Gate.RECONCILING
            )
            hypothesis.event("called back")
        if isinstance(event, ev.CallbackEnded) and not is_stale(effects):
            # The ending the deadline gave before callbacks: timed_out at recovery, same reason.
            assert after.ended is not None
            assert (after.ended.terminal_state, after.ended.stage) == ("timed_out", "recovery")
            assert after.ended.reason == before.dropped_reason
            hypothesis.event("callback window ended")

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def away_is_quiet(self) -> None:
        state = self.state
        if state.signaling == "away":
            assert state.ended is None and state.away_until is not None
            assert state.gate is Gate.FROZEN and state.recovery is None and not state.deadlines
            assert state.turn is None and state.response is None and not state.outstanding
            assert state.media != "flowing" and state.agent_link == "closed"
        else:
            assert state.away_until is None
        if state.signaling == "dropped":
            assert state.ended is None and state.dropped_until is not None
            assert state.gate is Gate.FROZEN and state.recovery is None and not state.deadlines
            assert state.turn is None and state.response is None
            assert state.media != "flowing" and state.agent_link == "closed"
        else:
            assert state.dropped_until is None

    @invariant()
    def terminal_state_is_final(self) -> None:
        state = self.state
        if self.ended_as is not None:
            assert state.ended is not None and state.ended.terminal_state == self.ended_as
        if state.ended is not None:
            assert state.ended.terminal_state in TERMINAL_STATES
            assert state.gate is Gate.CLOSED
            assert state.recovery is None and not state.deadlines
            assert state.acceptable_terminal_states() == (state.ended.terminal_state,)

    @invariant()
    def gate_and_recovery_agree(self) -> None:
        state = self.state
        if state.gate is Gate.OPEN:
            assert state.recovery is None
        if state.recovery is not None:
            assert state.gate in (Gate.FROZEN, Gate.RECONCILING, Gate.CLOSED)
            assert state.deadlines["recovery"].generation == state.recovery.generation
            assert state.recovery.generation == state.recovery_generation

    def seen_already(self, check: str, *objects: object) -> bool:
        """The costlier checks run once per new state (clock and checkpoint rules change none)."""
        if check in self.last_checked and all(
            a is b for a, b in zip(self.last_checked[check], objects, strict=True)
        ):
            return True
        self.last_checked[check] = objects
        return False

    @invariant()
    def checkpoint_form_round_trips(self) -> None:
        if self.seen_already("checkpoint form", self.state):
            return
        data = self.state.to_dict()
        text = json.dumps(data)
        assert SessionState.from_dict(data) == self.state
        assert SessionState.from_dict(json.loads(text)) == self.state

    @invariant()
    def live_state_is_the_fold_of_the_log(self) -> None:
        if self.seen_already("fold", self.state, self.checkpoint):
            return
        assert self.state.version == len(self.logged)
        assert replay(SessionState(SESSION_ID), self.logged) == self.state
        checkpoint, seen = self.checkpoint
        assert replay(roundtrip(checkpoint), self.logged[seen:]) == self.state

    @invariant()
    def every_way_to_end_from_here_is_sound(self) -> None:
        """Seed 000's timeout rule for every ending, probed from the current state (not kept)."""
        state = self.state
        if state.terminal or self.seen_already("endings", state):
            return
        for event in ending_probes(state):
            try:
                after, effects = step(state, event, self.now)
            except IllegalTransition:
                continue
            if after.ended is None:
                continue
            self.check_ending(state, event, after, effects)

    def check_ending(
        self,
        before: SessionState,
        event: ev.Event,
        after: SessionState,
        effects: list[fx.Effect],
    ) -> None:
        assert after.ended is not None
        kinds = [type(e) for e in effects]
        assert effects[-1] == fx.Finished(
            after.ended.terminal_state, after.ended.reason, after.ended.stage
        )
        assert kinds.count(fx.Finished) == 1 and kinds.count(fx.ReleaseMedia) == 1
        assert kinds.count(fx.RecoveryFinished) == (before.recovery is not None)
        # Every timer still armed is cancelled (the one that fired is already gone).
        fired = event.name if isinstance(event, ev.DeadlineFired) else None
        # (A transfer's guard goes first, with its phase: TransferEnded says how it ended.)
        assert sorted(e.name for e in effects if isinstance(e, fx.CancelTimer)) == sorted(
            name for name in before.deadlines if name != fired
        )
        if before.outstanding:
            # Outstanding intents are persisted and kept for reconciliation, never dropped.
            assert fx.PersistOutstanding(before.outstanding_keys()) in effects
            assert after.outstanding_keys() == before.outstanding_keys()
        else:
            assert fx.PersistOutstanding not in kinds
        assert fx.ClearPlayout(before.playback_generation + 1) in effects
        gate_changes = [(e.old, e.new) for e in effects if isinstance(e, fx.GateChanged)]
        assert gate_changes == [(before.gate.value, "closed")]
        assert after.gate is Gate.CLOSED and after.recovery is None and not after.deadlines
        # completed/canceled only with nothing outstanding (no unknown outcome).
        assert after.ended.terminal_state in before.acceptable_terminal_states()

    @invariant()
    def after_the_end_everything_is_refused(self) -> None:
        if not self.state.terminal:
            return
        for event in (ev.CallerHangup(), ev.MediaRestored(self.state.recovery_generation)):
            try:
                step(self.state, event, self.now)
            except SessionTerminated:
                continue
            raise AssertionError(f"{event.type} was accepted after the end")


SessionProperties.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSessionProperties = SessionProperties.TestCase


# --- replay is deterministic ------------------------------------------------------------------


@st.composite
def timed_events(draw: Any) -> Logged:
    """A random history: a call offered and answered, then blind events at increasing times."""
    now = 0.0
    events: Logged = [(ev.CallOffered("+15550001234", "service", draw(POLICIES)), now)]
    if draw(st.booleans()):
        events.append((ev.CallAnswered(), 0.5))
        now = 0.5
    for _ in range(draw(st.integers(0, 30))):
        now += draw(st.sampled_from([0.0, 0.2, 1.0, 5.0]))
        # Blind draws: generations near 0..2, without tracking the state they will meet.
        state = SessionState(SESSION_ID, recovery_generation=draw(st.integers(0, 2)))
        events.append((draw(st.one_of(any_event(state), ENDING_EVENTS)), now))
    return events


def accepted_only(events: Logged) -> Logged:
    """Keep the events ``step`` accepts, as the runtime would log them."""
    state = SessionState(SESSION_ID)
    kept: Logged = []
    for event, at in events:
        try:
            new, _ = step(state, event, at)
        except IllegalTransition:
            continue
        if new.version != state.version:
            kept.append((event, at))
        state = new
    return kept


def fold(log: Logged) -> tuple[SessionState, list[list[dict[str, Any]]]]:
    state = SessionState(SESSION_ID)
    effects = []
    for event, at in log:
        state, out = step(state, event, at)
        effects.append([e.to_dict() for e in out])
    return state, effects


@settings(max_examples=200, deadline=None)
@given(timed_events())
def test_replay_from_scratch_is_deterministic(events: Logged) -> None:
    log = accepted_only(events)
    first = replay(SessionState(SESSION_ID), log)
    second = replay(SessionState(SESSION_ID), list(log))
    assert first == second and first.to_dict() == second.to_dict()
    assert first.version == len(log)
    # The effects too: a replayed log asks the runtime for exactly what the live run did.
    folded = fold(log)
    assert folded == fold(log) and folded[0] == first


def test_the_strategies_cover_every_event_type() -> None:
    covered = set(blind_strategies(0, 0)) | set(ENDING_STRATEGIES)
    assert covered == set(ev.EVENT_TYPES.values())
