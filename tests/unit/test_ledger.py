"""The side-effect rules of session/ledger.py: admission, the stages of an intent, seed 000's
reconciliation table row by row, the classification of a provider's answer; and, driven through
the session machine with hypothesis, the held intent's promise: a write admitted with the gate
open is sent once or settled, never dropped, never sent while the gate is not open, never asked
about while it is known unsent."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from session import effects as fx
from session import events as ev
from session import ledger
from session.errors import GateClosed, IllegalTransition
from session.ledger import (
    APPROVAL_EXPIRED,
    NEVER_SENT,
    RECONCILIATION,
    Admitted,
    Answer,
    Approval,
    Ask,
    Duplicate,
    Evidence,
    Known,
    Refused,
    ToolRule,
)
from session.machine import step
from session.state import Gate, SessionState
from session.vocabulary import IntentKind, IntentStage, Outcome, Terminal

CHARGE = ToolRule("charge", IntentKind.WRITE, Approval.DTMF, approval_valid_s=60.0)
ARGS = {"amount_cents": 59, "currency": "EUR"}


def _ask(**kw: Any) -> Ask:
    return Ask(**{"tool": "charge", "arguments": ARGS, "session_id": "s1", "turn_id": "t1", **kw})


# --- admission ------------------------------------------------------------------------------------


def test_an_ask_gets_a_key_from_its_session_and_digest() -> None:
    verdict = ledger.admit(_ask(key_pressed=True), CHARGE, None)
    assert isinstance(verdict, Admitted)
    assert verdict.digest == ledger.intent_digest("charge", ARGS, "s1", "t1")
    assert verdict.key == ledger.intent_key("s1", verdict.digest)
    assert (verdict.needs_approval, verdict.approval_valid_s) == (True, 60.0)
    assert verdict.approval_id == f"t1:{verdict.digest[:16]}"
    # The agent's own key is kept.
    assert ledger.admit(_ask(key="mine", key_pressed=True), CHARGE, None).key == "mine"


@pytest.mark.parametrize(
    ("rule", "ask", "reason"),
    [
        (None, _ask(), "no tool named 'charge' is configured"),
        (CHARGE, _ask(), "the caller has not confirmed it by key press"),
        (CHARGE, _ask(spoken_yes=True), "the caller has not confirmed it by key press"),
        (
            ToolRule("charge", IntentKind.WRITE, Approval.CALLER),
            _ask(),
            "the caller has not confirmed it by key press or by voice",
        ),
    ],
)
def test_an_ask_without_its_tool_or_approval_is_refused(
    rule: ToolRule | None, ask: Ask, reason: str
) -> None:
    verdict = ledger.admit(ask, rule, None)
    assert isinstance(verdict, Refused) and verdict.reason == reason


def test_a_spoken_yes_approves_only_a_tool_that_takes_the_callers_voice() -> None:
    caller = ToolRule("charge", IntentKind.WRITE, Approval.CALLER)
    assert isinstance(ledger.admit(_ask(spoken_yes=True), caller, None), Admitted)


def test_a_read_needs_no_approval_and_never_lapses() -> None:
    lookup = ToolRule("lookup", IntentKind.READ, Approval.DTMF)
    verdict = ledger.admit(_ask(tool="lookup"), lookup, None)
    assert isinstance(verdict, Admitted)
    assert (verdict.needs_approval, verdict.approval_valid_s) == (False, None)


def test_the_same_ask_again_is_its_original_outcome_and_another_under_its_key_refused() -> None:
    first = ledger.admit(_ask(key_pressed=True), CHARGE, None)
    assert isinstance(first, Admitted)
    pending = ledger.admit(_ask(), CHARGE, Known("s1", first.digest))
    assert pending == Duplicate(first.key, "pending", {})
    done = Known("s1", first.digest, "committed", {"charge_id": "ch_1"})
    assert ledger.admit(_ask(), CHARGE, done) == Duplicate(
        first.key, "committed", {"charge_id": "ch_1"}
    )
    # Read back by a rejoin, whose digest is not known: the same key is the same ask.
    assert isinstance(ledger.admit(_ask(), CHARGE, Known("s1", None, "failed")), Duplicate)
    for other in (Known("s1", "another digest"), Known("s2", first.digest)):
        verdict = ledger.admit(_ask(key=first.key), CHARGE, other)
        assert verdict == Refused(first.key, "this key was used for a different request")


def _gen(state: SessionState) -> int:
    """The running recovery's generation: only it may end the recovery."""
    return state.recovery.generation if state.recovery is not None else 0


# --- seed 000's table, each row -------------------------------------------------------------------


def _sent(*, valid_s: float | None = 60.0) -> SessionState:
    state, _ = step(_admitted(valid_s=valid_s), ev.ToolRequestSent("k1"), 4.1)
    return state


def _reconciling() -> SessionState:
    state, _ = step(_sent(), ev.MediaLost(), 5.0)
    state, effects = step(state, ev.MediaRestored(_gen(state)), 6.0)
    assert state.gate is Gate.RECONCILING and fx.Reconcile(("k1",)) in effects
    return state


def test_the_table_has_every_row_of_seed_000() -> None:
    assert set(RECONCILIATION) == set(Evidence)
    assert all(row.may and row.must_not for row in RECONCILIATION.values())


@pytest.mark.parametrize("outcome", ["committed", "failed", "not_started"])
def test_a_definitive_receipt_settles_the_intent_and_reopens_the_gate(outcome: str) -> None:
    row = RECONCILIATION[Evidence(outcome)]
    assert (row.receipt, row.settles, row.ends) == (Outcome(outcome), True, None)
    state, effects = step(_reconciling(), ev.ToolReceipt("k1", outcome), 7.0)
    assert state.outstanding == () and state.gate is Gate.OPEN and state.ended is None
    assert fx.NotifyAgent("tool_receipt", f"k1 {outcome}") in effects


def test_an_unknown_receipt_keeps_the_intent_and_hands_over_to_a_person() -> None:
    row = RECONCILIATION[Evidence.UNKNOWN]
    assert (row.ends, row.stage) == (Terminal.NEEDS_HUMAN, "reconciliation")
    assert row.say == "outcome_unknown"
    state, effects = step(_reconciling(), ev.ToolReceipt("k1", "unknown", "timeout"), 7.0)
    assert state.ended is not None and state.ended.terminal_state == "needs_human"
    assert [o.stage for o in state.outstanding] == [IntentStage.UNKNOWN]
    assert fx.Say("outcome_unknown") in effects and state.gate is Gate.CLOSED


def test_a_conflicting_receipt_keeps_the_intent_and_hands_over_to_a_person() -> None:
    row = RECONCILIATION[Evidence.CONFLICTING_RECEIPT]
    assert (row.receipt, row.settles, row.ends) == (None, False, Terminal.NEEDS_HUMAN)
    state, effects = step(
        _reconciling(), ev.ToolReceiptConflicted("k1", "committed", "failed"), 7.0
    )
    assert state.ended is not None
    assert (state.ended.terminal_state, state.ended.stage) == ("needs_human", "reconciliation")
    assert [o.key for o in state.outstanding] == ["k1"]  # nothing assumed either way
    assert fx.NotifyAgent("tool_receipt_conflict", "k1 failed (stored committed)") in effects


def test_an_expired_approval_settles_a_held_write_not_started_without_a_request() -> None:
    row = RECONCILIATION[Evidence.APPROVAL_EXPIRED]
    assert (row.receipt, row.settles, row.ends) == (Outcome.NOT_STARTED, True, None)
    assert ledger.evidence_of("not_started", APPROVAL_EXPIRED) is Evidence.APPROVAL_EXPIRED
    state = _admitted(valid_s=10.0)
    state, _ = step(state, ev.AgentLinkLost(), 4.5)
    assert [o.stage for o in state.outstanding] == [IntentStage.HELD]
    state, effects = step(state, ev.AgentLinkRestored(_gen(state)), 30.0)  # past 4.0 + 10 s
    assert state.gate is Gate.OPEN
    assert fx.SettleUnsent("k1", APPROVAL_EXPIRED) in effects
    assert not any(isinstance(e, fx.SendToolRequest | fx.Reconcile) for e in effects)
    state, effects = step(state, ev.ToolReceipt("k1", "not_started", APPROVAL_EXPIRED), 30.1)
    assert state.outstanding == () and fx.NotifyAgent("tool_receipt", "k1 not_started") in effects


# --- the stages -----------------------------------------------------------------------------------


def _admitted(*, valid_s: float | None = 60.0) -> SessionState:
    state = SessionState("s1")
    for event, at in (
        (ev.CallOffered(), 0.0),
        (ev.CallAnswered(), 1.0),
        (ev.TurnStarted("t1"), 2.0),
        (ev.TurnCommitted("t1"), 3.0),
        (ev.ToolIntent("k1", "charge", "write", "d", "t1", {}, valid_s), 4.0),
    ):
        state, _ = step(state, event, at)
    return state


def test_a_write_admitted_before_the_gate_froze_is_held_then_sent_once_it_reopens() -> None:
    state, effects = step(_admitted(), ev.AgentLinkLost(), 4.002)
    assert [o.stage for o in state.outstanding] == [IntentStage.HELD]
    assert not any(isinstance(e, fx.Reconcile | fx.CancelToolCalls) for e in effects)
    # The runtime's own send, still on its way, is refused: held, not dropped.
    with pytest.raises(GateClosed, match="held"):
        step(state, ev.ToolRequestSent("k1"), 4.003)
    # Known unsent: nothing to ask a provider; the gate reopens and the request goes.
    state, effects = step(state, ev.AgentLinkRestored(_gen(state)), 5.0)
    assert state.gate is Gate.OPEN and [o.stage for o in state.outstanding] == ["intended"]
    assert fx.SendToolRequest("k1") in effects and not any(
        isinstance(e, fx.Reconcile) for e in effects
    )
    state, _ = step(state, ev.ToolRequestSent("k1"), 5.1)
    assert [o.stage for o in state.outstanding] == [IntentStage.SENT]


def test_a_request_logged_sent_but_stopped_before_it_left_is_held_again() -> None:
    # tool_request_sent was durable, the interruption cancelled the HTTP before its first byte.
    state, effects = step(_sent(), ev.AgentLinkLost(), 4.2)
    assert fx.CancelToolCalls(("k1",)) in effects
    state, _ = step(state, ev.ToolRequestWithheld("k1"), 4.21)
    assert [o.stage for o in state.outstanding] == [IntentStage.HELD]
    state, effects = step(state, ev.AgentLinkRestored(_gen(state)), 5.0)
    assert fx.SendToolRequest("k1") in effects  # known unsent: sent again, never asked about
    assert not any(isinstance(e, fx.Reconcile) for e in effects)
    with pytest.raises(IllegalTransition):  # only a frozen gate withholds a request
        step(state, ev.ToolRequestWithheld("k1"), 5.1)


def test_a_held_write_waits_for_the_sent_ones_to_be_reconciled() -> None:
    state = _sent()
    state, _ = step(state, ev.ToolIntent("k2", "charge", "write", "d2", "t1", {}, 60.0), 4.2)
    state, _ = step(state, ev.MediaLost(), 5.0)
    assert [o.stage for o in state.outstanding] == [IntentStage.SENT, IntentStage.HELD]
    state, effects = step(state, ev.MediaRestored(_gen(state)), 6.0)
    assert fx.Reconcile(("k1",)) in effects  # only the one that may have left
    assert not any(isinstance(e, fx.SendToolRequest) for e in effects)
    state, effects = step(state, ev.ToolReceipt("k1", "committed"), 7.0)
    assert state.gate is Gate.OPEN and fx.SendToolRequest("k2") in effects


def test_a_session_whose_call_is_gone_settles_what_never_left_and_asks_about_the_rest() -> None:
    state = _sent()
    state, _ = step(state, ev.ToolIntent("k2", "charge", "write", "d2", "t1", {}, 60.0), 4.2)
    state, effects = step(state, ev.OwnerLost("the process serving the call died"), 9.0)
    assert fx.SettleUnsent("k2", NEVER_SENT) in effects and fx.Reconcile(("k1",)) in effects
    assert not any(isinstance(e, fx.SendToolRequest) for e in effects)
    assert ledger.settle_plan(state.outstanding) == (("k1",), ("k2",))
    # Reconciled: the gate reopens, and still nothing is sent for a call that is gone.
    state, effects = step(state, ev.ToolReceipt("k1", "committed"), 9.5)
    assert not any(isinstance(e, fx.SendToolRequest) for e in effects)


def test_a_receipt_on_record_settles_only_when_definitive() -> None:
    assert all(ledger.settled_on_record(o) for o in ("committed", "failed", "not_started"))
    assert not ledger.settled_on_record("unknown") and not ledger.settled_on_record(None)


# --- what a provider's answer means ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("http_status", "data", "outcome"),
    [
        (200, {"status": "committed", "charge_id": "c"}, Outcome.COMMITTED),
        (201, {"status": "committed"}, Outcome.COMMITTED),
        (200, {"status": "processing"}, Outcome.UNKNOWN),
        (400, {"error": "bad amount"}, Outcome.FAILED),
        (402, {"status": "failed", "reason": "card declined"}, Outcome.FAILED),
        (408, {}, Outcome.UNKNOWN),
        (429, {}, Outcome.UNKNOWN),
        (500, {"status": "committed"}, Outcome.UNKNOWN),
        (503, {}, Outcome.UNKNOWN),
    ],
)
def test_a_requests_answer_is_committed_only_when_it_says_so_with_a_2xx(
    http_status: int, data: dict[str, Any], outcome: Outcome
) -> None:
    got, detail = ledger.classify_request(Answer(http_status, data))
    assert got is outcome
    if outcome is Outcome.FAILED:
        assert detail["http_status"] == http_status and detail["reason"]


@pytest.mark.parametrize(
    ("http_status", "data", "outcome"),
    [
        (200, {"status": "committed"}, Outcome.COMMITTED),
        (200, {"status": "not_started"}, Outcome.NOT_STARTED),
        (200, {"status": "processing"}, Outcome.UNKNOWN),
        (404, {}, Outcome.NOT_STARTED),
        (404, {"status": "not_started"}, Outcome.NOT_STARTED),
        (404, {"status": "committed"}, None),
        (500, {}, None),
    ],
)
def test_a_status_answer_settles_or_says_nothing(
    http_status: int, data: dict[str, Any], outcome: Outcome | None
) -> None:
    got = ledger.classify_status(Answer(http_status, data))
    assert (got[0] if got else None) == outcome


def test_only_a_request_that_never_left_is_not_started() -> None:
    assert ledger.classify_failure(ledger.Failure.NEVER_CONNECTED) is Outcome.NOT_STARTED
    for failure in (ledger.Failure.TIMED_OUT, ledger.Failure.UNREADABLE, ledger.Failure.TRANSPORT):
        assert ledger.classify_failure(failure) is Outcome.UNKNOWN


# --- the held intent's promise, under any interleaving --------------------------------------------


class HeldWrites(RuleBasedStateMachine):
    """Writes asked for and interruptions at any time; the runtime's sends and the provider's
    receipts whenever the machine allows them. Whatever happens, an admitted write is never
    sent while the gate is not open, never asked about while known unsent, never sent twice,
    and is settled or still outstanding: never silently gone."""

    def __init__(self) -> None:
        super().__init__()
        self.state = SessionState("s1")
        self.now = 0.0
        self.admitted: set[str] = set()
        self.sent: list[str] = []
        self.settled: set[str] = set()
        self.asked: set[str] = set()
        self.to_send: set[str] = set()
        self.settling: set[str] = set()  # held ones whose approval lapsed: settled, not sent

    def feed(self, event: ev.Event) -> list[fx.Effect] | None:
        self.now += 0.25
        before = self.state
        try:
            self.state, effects = step(before, event, self.now)
        except IllegalTransition:
            return None
        for effect in effects:
            match effect:
                case fx.SendToolRequest(key=key):
                    self.to_send.add(key)
                case fx.Reconcile(keys=keys):
                    self.asked |= set(keys)
                    for key in keys:
                        assert key in self.sent, f"{key} asked about but never sent"
                case fx.SettleUnsent(key=key):
                    assert key not in self.sent, f"{key} settled unsent but it was sent"
                    self.settling.add(key)
        return effects

    @initialize()
    def answered(self) -> None:
        for event in (ev.CallOffered(), ev.CallAnswered(), ev.TurnStarted("t1")):
            self.feed(event)

    @rule(n=st.integers(1, 3), valid_s=st.sampled_from([None, 0.5, 60.0]))
    def ask(self, n: int, valid_s: float | None) -> None:
        key = f"k{n}"
        if key in self.admitted:
            return  # admission answers a key used before as a duplicate (tested above)
        if self.feed(ev.ToolIntent(key, "charge", "write", f"d{n}", "t1", {}, valid_s)):
            self.admitted.add(key)

    @rule(key=st.sampled_from(["k1", "k2", "k3"]))
    def runtime_sends(self, key: str) -> None:
        if key not in self.to_send:
            return
        gate = self.state.gate
        if self.feed(ev.ToolRequestSent(key)) is not None:
            assert gate is Gate.OPEN, f"{key} sent while the gate was {gate}"
            assert key not in self.sent, f"{key} sent twice"
            self.sent.append(key)
            self.to_send.discard(key)

    @rule(key=st.sampled_from(["k1", "k2", "k3"]), outcome=st.sampled_from(["committed", "failed"]))
    def receipt(self, key: str, outcome: str) -> None:
        intent = next((o for o in self.state.outstanding if o.key == key), None)
        if intent is not None and (key in self.sent or intent.stage is IntentStage.HELD):
            sent = key in self.sent
            receipt = ev.ToolReceipt(
                key, outcome if sent else "not_started", "" if sent else APPROVAL_EXPIRED
            )
            if self.feed(receipt):
                self.settled.add(key)

    @rule(kind=st.sampled_from(["media", "agent"]))
    def interrupt(self, kind: str) -> None:
        self.feed(ev.MediaLost() if kind == "media" else ev.AgentLinkLost())

    @rule(kind=st.sampled_from(["media", "agent"]))
    def restore(self, kind: str) -> None:
        generation = _gen(self.state)
        self.feed(
            ev.MediaRestored(generation) if kind == "media" else ev.AgentLinkRestored(generation)
        )

    @rule(dt=st.sampled_from([0.1, 1.0, 30.0]))
    def wait(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def nothing_is_silently_gone(self) -> None:
        outstanding = {o.key for o in self.state.outstanding}
        for key in self.admitted:
            assert key in outstanding or key in self.settled, f"{key} vanished"
        for o in self.state.outstanding:
            if o.stage is IntentStage.HELD:
                assert o.key not in self.sent
                # Open with a write still held: only one whose settlement is on its way.
                open_ = self.state.gate is Gate.OPEN
                assert not open_ or o.key in self.settling, f"{o.key} held with the gate open"


TestHeldWrites = HeldWrites.TestCase
TestHeldWrites.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
