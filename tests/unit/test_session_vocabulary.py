"""The session's shared words (session.vocabulary) and its one backoff (session.backoff)."""

from __future__ import annotations

import json

import pytest

from session import events as ev
from session import store
from session.backoff import Jitter, backoff_delay
from session.machine import retry_delay, step
from session.state import Outstanding, Policy, SessionState
from session.vocabulary import (
    DEFINITIVE,
    INTENT_KINDS,
    RECEIPT_OUTCOMES,
    TERMINAL_STATES,
    BadOwnerId,
    EndingStage,
    IntentKind,
    IntentStage,
    Outcome,
    OwnerId,
    Terminal,
)

# --- the backoff ----------------------------------------------------------------------------------

# retry_delay's outputs before it moved onto backoff_delay, as repr() printed them. Recovery retries
# of logged sessions were scheduled with these values: a change here changes what replays schedule.
PINNED: dict[tuple[str, int, float, float], list[float]] = {
    ("sess-1", 1, 0.25, 4.0): [
        0.20273808255865522, 0.2835134508635753, 0.975514011662913,
        0.7571648559501842, 3.109195630429588, 2.177375050249714,
    ],
    ("prop-session", 2, 0.25, 4.0): [
        0.23560948622940048, 0.440944572947304, 0.8648559678433825,
        0.5817851083413188, 0.8522752646841815, 2.6428917843861566,
    ],
    ("call-7f3a", 3, 0.5, 2.0): [
        0.34277094514450906, 0.8790192354902887, 1.1946607563180596,
        1.3708456595382126, 1.7345263809442744, 1.8300819965232265,
    ],
    ("sess-1", 1, 1.0, 0.25): [0.25] * 6,
}  # fmt: skip


@pytest.mark.parametrize("key", list(PINNED), ids=lambda k: f"{k[0]}-g{k[1]}-{k[2]}-{k[3]}")
def test_retry_delay_keeps_its_exact_outputs(key: tuple[str, int, float, float]) -> None:
    session_id, generation, base, cap = key
    policy = Policy(retry_base_s=base, retry_cap_s=cap)
    got = [retry_delay(session_id, generation, attempt, policy) for attempt in range(6)]
    assert got == PINNED[key]


def test_retry_delay_is_the_shared_backoff_seeded_by_session_and_generation() -> None:
    policy = Policy(retry_base_s=0.5, retry_cap_s=2.0)
    for attempt in range(6):
        assert retry_delay("s", 3, attempt, policy) == backoff_delay(
            "s/3", attempt, base_s=0.5, cap_s=2.0, jitter=Jitter.FROM_HALF_BASE
        )


@pytest.mark.parametrize("jitter", list(Jitter))
def test_backoff_stays_within_its_floor_and_the_cap(jitter: Jitter) -> None:
    base, cap = 0.25, 4.0
    for attempt in range(10):
        ceiling = min(cap, base * 2**attempt)
        floor = ceiling / 2 if jitter is Jitter.EQUAL else min(base / 2, ceiling)
        delays = {
            backoff_delay(f"key-{i}", attempt, base_s=base, cap_s=cap, jitter=jitter)
            for i in range(50)
        }
        assert all(floor <= d <= ceiling for d in delays)
        assert len(delays) > 40  # jittered: different seeds spread out


def test_equal_jitter_is_the_upper_half_and_grows_with_the_attempt() -> None:
    # The tool client's status queries: at least half the backoff, so retries spread over the
    # budget instead of bunching at its start.
    delays = [
        backoff_delay("idem-key-1", a, base_s=0.25, cap_s=4.0, jitter=Jitter.EQUAL)
        for a in range(5)
    ]
    assert [d >= 0.25 * 2**a / 2 for a, d in enumerate(delays)] == [True] * 5
    assert delays == sorted(delays)  # floors double while under the cap: 0.125, 0.25, ... 2


def test_backoff_is_deterministic_and_each_attempt_has_its_own_draw() -> None:
    a = backoff_delay("x", 2, base_s=1.0, cap_s=8.0, jitter=Jitter.EQUAL)
    assert a == backoff_delay("x", 2, base_s=1.0, cap_s=8.0, jitter=Jitter.EQUAL)
    assert a != backoff_delay("y", 2, base_s=1.0, cap_s=8.0, jitter=Jitter.EQUAL)


# --- enums ----------------------------------------------------------------------------------------


def test_the_vocabulary_serializes_as_its_values() -> None:
    for member in (Terminal.NEEDS_HUMAN, Outcome.NOT_STARTED, IntentStage.SENT, EndingStage.HANGUP):
        assert member == member.value and json.dumps(member) == f'"{member.value}"'
    assert TERMINAL_STATES == ("completed", "canceled", "timed_out", "failed", "needs_human")
    assert RECEIPT_OUTCOMES == ("committed", "failed", "not_started", "unknown")
    assert DEFINITIVE == ("committed", "failed", "not_started")
    assert INTENT_KINDS == ("read", "write")


def test_the_stores_copies_say_the_same() -> None:
    # session/store keeps its own tuples (it does not import the machine); until it imports
    # session.vocabulary, they must not drift apart.
    assert store.TERMINAL_STATES == TERMINAL_STATES
    assert store.RECEIPT_OUTCOMES == RECEIPT_OUTCOMES
    assert store.INTENT_KINDS == INTENT_KINDS


def test_a_checkpoint_keeps_plain_strings_and_reads_back_typed() -> None:
    state = SessionState("v")
    for event, at in [
        (ev.CallOffered("+15550001234", "service", {}), 0.0),
        (ev.CallAnswered(), 1.0),
        (ev.ToolIntent("k1", "book", "write", "d", "t1"), 2.0),
        (ev.ToolRequestSent("k1"), 2.1),
        (ev.ToolReceipt("k1", "unknown"), 3.0),
    ]:
        state, _ = step(state, event, at)
    text = json.dumps(state.to_dict())
    data = json.loads(text)
    assert (
        data["outstanding"][0]["stage"] == "unknown" and data["outstanding"][0]["kind"] == "write"
    )
    assert data["ended"]["terminal_state"] == "needs_human"
    assert data["ended"]["stage"] == "reconciliation"
    back = SessionState.from_dict(data)
    assert back == state
    assert type(back.outstanding[0].stage) is IntentStage
    assert type(back.outstanding[0].kind) is IntentKind
    assert back.ended is not None and type(back.ended.terminal_state) is Terminal
    assert type(back.ended.stage) is EndingStage


def test_an_outstanding_intent_with_an_unknown_stage_is_refused_on_load() -> None:
    with pytest.raises(ValueError, match="'maybe' is not a valid IntentStage"):
        Outstanding.from_dict(
            {
                "key": "k",
                "tool": "t",
                "kind": "write",
                "digest": "",
                "turn_id": "",
                "stage": "maybe",
            }
        )


# --- owner ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "worker", "incarnation"),
    [
        ("worker-0/3f2a9c1b7e44", "worker-0", "3f2a9c1b7e44"),
        ("pool.2/abc", "pool.2", "abc"),
        ("worker-0.supervisor/0123456789ab", "worker-0.supervisor", "0123456789ab"),
    ],
)
def test_an_owner_id_parses_and_formats_back(text: str, worker: str, incarnation: str) -> None:
    owner = OwnerId.parse(text)
    assert (owner.worker, owner.incarnation) == (worker, incarnation)
    assert owner.format() == str(owner) == text
    assert OwnerId.worker_of(text) == worker
    assert text.startswith(OwnerId.prefix(worker))


@pytest.mark.parametrize("text", ["worker-0", "/abc", "worker-0/", "a/b/c", ""])
def test_anything_else_is_no_owner_id(text: str) -> None:
    with pytest.raises(BadOwnerId):
        OwnerId.parse(text)
    assert issubclass(BadOwnerId, ValueError)


def test_a_prefix_of_one_worker_never_matches_another() -> None:
    # "worker-1/" must not select "worker-10/..." sessions (reap_predecessors relies on it).
    assert not "worker-10/abc".startswith(OwnerId.prefix("worker-1"))
