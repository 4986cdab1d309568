"""Taking a session over, seen from its writers: start-up reconciliation takes the predecessor's
lease before it writes, and a live call whose session was taken over stops acting for it (no
further event, a local hang-up). Real SQLite stores; no SIP stack: the call's commands are kept."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agents.base import Agent, CallContext, CallControl
from audio.barge_in import BargeInConfig
from audio.vad import VadConfig
from config.settings import TransferSettings
from config.tools import ToolSettings
from session import effects as fx
from session import events as sev
from session.deadlines import Timer
from session.durable import DurableSession
from session.ledger import NEVER_SENT
from session.reaper import expire_dropped, reap_predecessors
from session.store import Lease, LeaseLost, SessionStore, ToolIntent, ToolReceipt
from session.store.sqlite import SqliteSessionStore
from session.store.writer import StoreWriter
from telephony import events as ev
from voicegate.call.call_state import CallPhase
from voicegate.call.clock import SessionClock
from voicegate.call.live_call import LiveCall
from voicegate.faults import Faults
from voicegate.observe.metrics import Metrics
from voicegate.tools.client import ToolOutcome
from voicegate.tools.startup_reconcile import settle_lapsed_drops, settle_predecessors

DEAD = "worker-0/dead"
ME = "worker-0/me"
CHARGE = ToolSettings("charge", "write", "http://pay/v1", "http://pay/v1/{key}", 2.0, "dtmf")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteSessionStore]:
    s = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    yield s
    s.close()


@pytest.fixture
def rival(tmp_path: Path) -> Iterator[SqliteSessionStore]:
    """Another process's connection to the same file."""
    s = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    yield s
    s.close()


# ---- start-up reconciliation ----------------------------------------------------------------


def _crashed_mid_tool_call(
    store: SqliteSessionStore, receipt: str | None, *, sent: bool = True
) -> DurableSession:
    """A predecessor's session that died with intent k1 sent (and maybe its receipt stored),
    or only admitted (``sent`` False: it never left)."""
    session, _ = DurableSession.create(
        store, "s1", owner=DEAD, meta={}, offered=sev.CallOffered(), now=100.0
    )
    session.apply(sev.CallAnswered(), 101.0)
    session.apply(sev.TurnStarted("t1"), 102.0)
    session.apply(sev.TurnCommitted("t1"), 102.1)
    session.apply(sev.ToolIntent("k1", "charge", "write", "d1", "t1"), 102.2)
    store.record_intent(ToolIntent("k1", "s1", "t1", "charge", "write", "d1", {}, 102.2))
    if sent:
        session.apply(sev.ToolRequestSent("k1"), 102.25)
    if receipt is not None:
        store.record_receipt(ToolReceipt("k1", receipt, {}, 102.3))
    return session


@dataclass
class _Client:
    """A provider's status endpoint; ``meanwhile`` runs while the request is in flight."""

    outcome: ToolOutcome
    meanwhile: Callable[[], object] = lambda: None
    asked: list[str] = field(default_factory=list)

    async def resolve(self, tool: ToolSettings, key: str, **_: Any) -> ToolOutcome:
        self.asked.append(key)
        self.meanwhile()
        return self.outcome


@contextlib.contextmanager
def _writer_of(store: SqliteSessionStore) -> Iterator[Callable[[Any], Any]]:
    """The runtime's writer: a thread of its own with its own connection to the test's file,
    so that no store call runs on the event loop (the suite fails a test that blocks it)."""
    path = store.path
    writer = StoreWriter(lambda: SqliteSessionStore(path), name="test-writer")

    async def write(job: Any) -> Any:
        return await asyncio.wrap_future(writer.submit(job))

    try:
        yield write
    finally:
        writer.close()


async def _settle(store: SqliteSessionStore, client: _Client) -> tuple[int, list[str]]:
    outcomes: list[str] = []
    if not isinstance(store, SqliteSessionStore):
        # A store that intercepts calls (the racing reaper below) is called as it is.
        async def inline(job: Any) -> Any:
            return job(store)

        return await _settle_with(inline, client, outcomes), outcomes
    with _writer_of(store) as write:
        settled = await _settle_with(write, client, outcomes)
    return settled, outcomes


async def _settle_with(write: Callable[[Any], Any], client: _Client, outcomes: list[str]) -> int:
    return await settle_predecessors(
        write,
        client,  # type: ignore[arg-type]
        {"charge": CHARGE},
        prefix="worker-0/",
        me=ME,
        attempts=1,
        deadline_s=1.0,
        record_effects=lambda effects: None,
        on_outcome=lambda tool, outcome: outcomes.append(outcome),
        now=lambda: 200.0,
    )


async def test_reconciliation_takes_the_lease_then_the_reaper_takes_it_from_there(
    store: SqliteSessionStore,
) -> None:
    dead = _crashed_mid_tool_call(store, receipt="committed")
    client = _Client(ToolOutcome("unknown"))

    assert await _settle(store, client) == (1, ["committed"])
    assert client.asked == []  # the stored receipt settled it: nothing was asked, or sent
    summary = store.get("s1")
    assert summary is not None
    assert (summary.owner, summary.lease_epoch, summary.terminal_state) == (
        f"{ME}/reconcile",
        2,
        None,
    )
    assert [r.type for r in store.events("s1")][-2:] == ["owner_lost", "tool_receipt"]
    # The predecessor, were it only stalled, can write nothing more.
    with pytest.raises(LeaseLost):
        dead.apply(sev.CallerHangup(), 201.0)

    # What reconciliation leaves open is still a predecessor's: reaped at start-up, not later.
    assert reap_predecessors(store, worker="worker-0", me=ME, now=202.0) == ["s1"]
    summary = store.get("s1")
    assert summary is not None
    assert (summary.owner, summary.lease_epoch, summary.terminal_state) == (ME, 3, "failed")


async def test_a_caller_cut_off_mid_payment_is_parked_for_a_callback_once_settled(
    store: SqliteSessionStore,
) -> None:
    session, _ = DurableSession.create(
        store, "s1", owner=DEAD, meta={},
        offered=sev.CallOffered(policy={"callback_window_s": 120.0}), now=100.0,
    )  # fmt: skip
    for event in (sev.CallAnswered(), sev.TurnStarted("t1"), sev.TurnCommitted("t1")):
        session.apply(event, 101.0)
    session.apply(sev.ToolIntent("k1", "charge", "write", "d1", "t1"), 102.2)
    store.record_intent(ToolIntent("k1", "s1", "t1", "charge", "write", "d1", {}, 102.2))
    session.apply(sev.ResumeCodeIssued("code-digest"), 102.21)
    session.apply(sev.ToolRequestSent("k1"), 102.25)
    client = _Client(ToolOutcome("committed", {"charge": "ch_1"}))

    assert await _settle(store, client) == (1, ["committed"])
    assert client.asked == ["k1"]  # by status, never the request again
    state = DurableSession.load(store, "s1").state
    assert state.signaling.value == "dropped" and state.outstanding == ()
    assert state.dropped_until == 200.0 + 120.0  # from the take-over, the callback window
    # Parked, not a predecessor's loose end: the reaper leaves it to its callback or its window.
    assert reap_predecessors(store, worker="worker-0", me=ME, now=202.0) == []
    summary = store.get("s1")
    assert summary is not None and summary.terminal_state is None


async def test_a_settlement_cut_short_by_another_crash_is_carried_on_not_restarted(
    store: SqliteSessionStore,
) -> None:
    dead = _crashed_mid_tool_call(store, receipt=None)
    dead.apply(sev.OwnerLost("the process serving the call died"), 103.0)  # then it died too
    client = _Client(ToolOutcome("committed", {"charge": "ch_1"}))

    assert await _settle(store, client) == (1, ["committed"])
    assert client.asked == ["k1"]
    types = [r.type for r in store.events("s1")]
    assert types.count("owner_lost") == 1 and types[-1] == "tool_receipt"


async def test_an_intent_that_never_left_is_settled_unsent_without_asking_anyone(
    store: SqliteSessionStore,
) -> None:
    _crashed_mid_tool_call(store, receipt=None, sent=False)
    client = _Client(ToolOutcome("committed"))

    assert await _settle(store, client) == (1, ["not_started"])
    # Known unsent: a status query would fence the key for nothing (session/ledger.py).
    assert client.asked == []
    receipt = store.receipt("k1")
    assert receipt is not None and receipt.outcome == "not_started"
    assert receipt.detail["reason"] == NEVER_SENT and receipt.detail["via"] == "ledger"
    owner_lost = next(r for r in store.events("s1") if r.type == "owner_lost")
    assert {"kind": "settle_unsent", "key": "k1", "reason": NEVER_SENT} in owner_lost.effects
    assert [r.type for r in store.events("s1")][-1] == "tool_receipt"


async def test_reconciliation_leaves_a_session_taken_over_meanwhile_to_its_new_owner(
    store: SqliteSessionStore, rival: SqliteSessionStore
) -> None:
    _crashed_mid_tool_call(store, receipt=None)
    client = _Client(
        ToolOutcome("committed", {"charge": "ch_1"}),
        meanwhile=lambda: rival.take_over("s1", owner="worker-1/other", at=150.0),
    )

    assert await _settle(store, client) == (0, [])
    assert client.asked == ["k1"]
    summary = store.get("s1")
    assert summary is not None
    assert (summary.owner, summary.lease_epoch, summary.terminal_state) == (
        "worker-1/other",
        3,
        None,
    )
    assert [r.type for r in store.events("s1")][-1] == "owner_lost"  # no receipt event
    # The provider's answer is kept as evidence for the new owner to settle from.
    receipt = store.receipt("k1")
    assert receipt is not None and receipt.outcome == "committed"


class _ReapedAfterListing:
    """The store, on which another worker's reaper finalises everything right after a listing."""

    def __init__(self, store: SqliteSessionStore, rival: SqliteSessionStore) -> None:
        self._store, self._rival = store, rival

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def open_sessions(self, **filters: Any) -> list[Any]:
        found = self._store.open_sessions(**filters)
        reap_predecessors(self._rival, worker="worker-0", me="worker-0/other", now=150.0)
        return found


async def test_reconciliation_skips_a_session_finalised_before_it_got_there(
    store: SqliteSessionStore, rival: SqliteSessionStore
) -> None:
    _crashed_mid_tool_call(store, receipt="committed")
    racing = _ReapedAfterListing(store, rival)
    assert await _settle(racing, _Client(ToolOutcome("unknown"))) == (0, [])  # type: ignore[arg-type]
    summary = store.get("s1")
    assert summary is not None
    assert (summary.owner, summary.terminal_state) == ("worker-0/other", "failed")
    assert "owner_lost" not in [r.type for r in store.events("s1")]


# ---- a live call ----------------------------------------------------------------------------


@dataclass
class _Services:
    """What a LiveCall needs from the runtime; SIP commands are only kept."""

    store: SessionStore
    writer: StoreWriter
    owner: str = "worker-0/live"
    answer_after_s: float = 0.0
    resume_ttl_s: float = 600.0
    callback_keys: None = None  # callbacks off (voicegate/call/callbacks.py)
    metrics: Metrics = field(default_factory=Metrics)
    faults: Faults = field(default_factory=lambda: Faults(""))
    tool_client: Any = None
    tools: Mapping[str, ToolSettings] = field(default_factory=dict)
    reconcile_timeout_s: float = 5.0
    status_attempts: int = 1
    commands: list[ev.SipCommand] = field(default_factory=list)

    def submit(self, command: ev.SipCommand) -> None:
        self.commands.append(command)

    def prompt(self, name: str, rate: int) -> NDArray[np.int16]:
        return np.zeros(rate // 50, dtype=np.int16)

    def policy(self, tenant: str) -> dict[str, float]:
        return {}

    def caller_key(self, offer: ev.CallOffered) -> str:
        return ""

    def transfer_for(self, tenant: str) -> TransferSettings:
        return TransferSettings()

    def audio_settings(self) -> tuple[int, VadConfig, BargeInConfig]:
        return 16000, VadConfig(), BargeInConfig()

    def record_effects(self, effects: list[fx.Effect]) -> None:
        pass


async def _until(condition: Callable[[], object], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def writer(store: SqliteSessionStore) -> Iterator[StoreWriter]:
    """The live call's writer thread, on a connection of its own (as in the runtime)."""
    w = StoreWriter(lambda: SqliteSessionStore(store.path))
    yield w
    w.close()


def _offered_call(store: SqliteSessionStore, writer: StoreWriter) -> tuple[LiveCall, _Services]:
    services = _Services(store, writer)
    offer = ev.CallOffered(
        "c1", "sip-c1", "sip:+15551234567@example.org", "sip:service@vg", "service", "udp"
    )
    clock = SessionClock(monotonic=lambda: 300.0, wall=lambda: 300.0)
    return LiveCall(offer, services, _no_agent, clock), services


def _no_agent(context: CallContext, control: CallControl) -> Agent:
    raise AssertionError("these calls never get media, so never an agent")


def _lease_lost_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "session.lease_lost"]


@pytest.mark.parametrize("noticed_by", ["append", "touch"])
async def test_a_call_whose_session_was_taken_over_hangs_up_without_writing(
    store: SqliteSessionStore,
    writer: StoreWriter,
    rival: SqliteSessionStore,
    caplog: pytest.LogCaptureFixture,
    noticed_by: str,
) -> None:
    call, services = _offered_call(store, writer)
    task = asyncio.create_task(call.run())
    await _until(lambda: services.commands, "the answer")
    assert call.session is not None and call.session.lease == Lease("worker-0/live", 1)
    assert services.commands == [ev.Answer("c1")]
    events = store.events("c1")

    # Another worker (a reaper, or the one the caller rejoined through) takes the session over.
    rival.take_over("c1", owner="worker-1/other", at=301.0)
    with caplog.at_level(logging.WARNING, logger="voicegate.call"):
        if noticed_by == "append":
            call.deliver(ev.CallAnswered("c1"))  # its step is refused
        else:
            call.touch()  # its heartbeat is refused
        await _until(lambda: len(services.commands) == 2, "the hang-up")

    assert services.commands[1] == ev.Hangup("c1")
    assert call.phase is CallPhase.ENDING
    (record,) = _lease_lost_records(caplog)
    assert (record.session_id, record.owner, record.epoch) == ("c1", "worker-1/other", 2)  # type: ignore[attr-defined]
    # The dialog's end is recorded by nobody here: the new owner decides how the session ends.
    call.deliver(ev.CallEnded("c1", by="server", status=200, reason="", answered=True))
    await asyncio.wait_for(task, 5)
    assert call.snapshot()["state"] == "ended"
    assert store.events("c1") == events
    summary = store.get("c1")
    assert summary is not None
    assert (summary.owner, summary.lease_epoch, summary.terminal_state) == (
        "worker-1/other",
        2,
        None,
    )
    assert len(_lease_lost_records(caplog)) == 1


async def test_a_drop_nobody_called_back_is_asked_about_before_it_ends(
    store: SqliteSessionStore,
) -> None:
    # Media lost for good while its payment's request was in flight, and the window passed.
    session, _ = DurableSession.create(
        store, "s1", owner="worker-1/live", meta={},
        offered=sev.CallOffered(policy={"callback_window_s": 120.0, "recovery_timeout_s": 20.0}),
        now=100.0,
    )  # fmt: skip
    for event in (sev.CallAnswered(), sev.TurnStarted("t1"), sev.TurnCommitted("t1")):
        session.apply(event, 101.0)
    session.apply(sev.ToolIntent("k1", "charge", "write", "d1", "t1"), 102.0)
    store.record_intent(ToolIntent("k1", "s1", "t1", "charge", "write", "d1", {}, 102.0))
    session.apply(sev.ToolRequestSent("k1"), 102.1)
    session.apply(sev.MediaLost(), 104.0)
    deadline = session.state.deadlines[Timer.RECOVERY]
    session.apply(sev.DeadlineFired(Timer.RECOVERY, deadline.generation), 124.0)
    assert session.state.signaling.value == "dropped"
    # The sweep ends nothing whose write is unsettled...
    assert expire_dropped(store, me=ME, now=300.0) == []
    client = _Client(ToolOutcome("committed", {"charge": "ch_1"}))
    with _writer_of(store) as write:
        settled_early = await _lapsed(write, client, 200.0)
        asked_early = list(client.asked)
        settled_late = await _lapsed(write, client, 300.0)
    assert settled_early == 0 and asked_early == []  # the caller may still call back
    assert settled_late == 1 and client.asked == ["k1"]  # by status, never resent
    # ... then ends it with what the provider did on record.
    assert expire_dropped(store, me=ME, now=300.0) == ["s1"]
    summary = store.get("s1")
    assert summary is not None and summary.terminal_state == "timed_out"
    receipt = store.receipt("k1")
    assert receipt is not None and receipt.outcome == "committed"
    assert [r.type for r in store.events("s1")][-2:] == ["tool_receipt", "callback_ended"]


async def _lapsed(write: Callable[[Any], Any], client: _Client, at: float) -> int:
    return await settle_lapsed_drops(
        write, client, {"charge": CHARGE}, me=ME, attempts=1, deadline_s=1.0,  # type: ignore[arg-type]
        record_effects=lambda effects: None, on_outcome=lambda tool, outcome: None,
        now=lambda: at,
    )  # fmt: skip
