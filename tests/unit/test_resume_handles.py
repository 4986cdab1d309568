"""Resume handles, sans-IO (session/resume.py): made from `secrets`, stored as a digest, scoped to
a session and a tenant, short-lived, used once. Time is a fake clock (a float); a hypothesis state
machine drives issue / present / rotate against a model and the real SQLite store."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from session.resume import (
    REFUSAL_PHRASES,
    VERIFIER_BYTES,
    RecordState,
    ResumeResult,
    issue,
    parse,
    verify,
)
from session.store import SessionStore
from session.store.postgres import PostgresSessionStore
from session.store.sqlite import SqliteSessionStore
from telephony.sip_message import mask_text
from telephony.transfer import context_headers, refer_to
from tests.pg_cluster import PgCluster

TTL = 600.0


def test_a_handle_carries_256_random_bits_and_its_record_only_their_digest() -> None:
    handle = issue("s1", "acme", now=100.0, ttl_s=TTL)
    parsed = parse(handle.text)
    assert parsed is not None
    selector, verifier = parsed
    assert VERIFIER_BYTES * 8 >= 128
    assert handle.record.selector == selector
    # No fragment of the handle in a repr (a log line of an event, a traceback's locals).
    for part in (selector, verifier):
        assert part not in repr(handle.record) and part not in repr(handle)
    assert handle.record.verifier_digest != verifier and len(handle.record.verifier_digest) == 64
    assert (handle.record.issued_at, handle.record.expires_at) == (100.0, 100.0 + TTL)
    # Two handles never share a selector or a verifier (from secrets.token_bytes).
    other = issue("s1", "acme", now=100.0, ttl_s=TTL)
    assert other.text != handle.text and other.record.selector != selector


def test_the_checks_and_their_order() -> None:
    handle = issue("s1", "acme", now=0.0, ttl_s=TTL)
    record = handle.record
    assert verify(handle.text, record, tenant="acme", now=1.0) is ResumeResult.OK
    assert verify(handle.text, None, tenant="acme", now=1.0) is ResumeResult.INVALID
    assert verify("vgr1.nope", record, tenant="acme", now=1.0) is ResumeResult.INVALID
    forged = handle.text[:-1] + ("A" if handle.text[-1] != "A" else "B")
    assert verify(forged, record, tenant="acme", now=1.0) is ResumeResult.INVALID
    # Another tenant learns nothing else: not whether it expired, not whether it was used.
    used = dataclasses.replace(record, state=RecordState.USED)
    assert verify(handle.text, used, tenant="beta", now=TTL + 1) is ResumeResult.CROSS_TENANT
    assert verify(handle.text, record, tenant="acme", now=TTL) is ResumeResult.EXPIRED
    superseded = dataclasses.replace(record, state=RecordState.SUPERSEDED)
    assert verify(handle.text, superseded, tenant="acme", now=1.0) is ResumeResult.EXPIRED
    assert verify(handle.text, used, tenant="acme", now=1.0) is ResumeResult.REUSED
    # The refusal phrases name the class, never the handle.
    assert set(REFUSAL_PHRASES) == set(ResumeResult) - {ResumeResult.OK}


@given(st.text(max_size=120))
def test_anything_that_is_not_the_handle_is_invalid(text: str) -> None:
    handle = issue("s1", "acme", now=0.0, ttl_s=TTL)
    expected = ResumeResult.OK if text.strip() == handle.text else ResumeResult.INVALID
    assert verify(text, handle.record, tenant="acme", now=1.0) is expected


@pytest.mark.parametrize("ttl", [0.0, -1.0])
def test_a_handle_needs_a_lifetime(ttl: float) -> None:
    with pytest.raises(ValueError):
        issue("s1", "acme", now=0.0, ttl_s=ttl)


class HandleLifecycle(RuleBasedStateMachine):
    """Issue, present and rotate handles of two sessions of two tenants on a fake clock, against
    the real store; a model says what each presentation must come to."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp())
        self.store = self.open_store()
        self.now = 0.0
        self.handles: list[tuple[str, str, str]] = []  # (text, session, tenant) ever issued
        self.used: set[str] = set()
        self.current: dict[str, str] = {}  # session -> its live handle's text
        self.expiry: dict[str, float] = {}

    @initialize()
    def sessions(self) -> None:
        for session, tenant in (("s-acme", "acme"), ("s-beta", "beta")):
            self.store.create(session, owner="w/1", meta={}, at=0.0, tenant=tenant)

    def open_store(self) -> SessionStore:
        return SqliteSessionStore(self.tmp / "s.sqlite3")

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.tmp)

    @rule(session=st.sampled_from(["s-acme", "s-beta"]))
    def issue_one(self, session: str) -> None:
        tenant = "acme" if session == "s-acme" else "beta"
        handle = issue(session, tenant, now=self.now, ttl_s=TTL)
        self.store.record_handle(handle.record)
        self.handles.append((handle.text, session, tenant))
        self.current[session] = handle.text
        self.expiry[handle.text] = self.now + TTL

    @rule(seconds=st.floats(min_value=0, max_value=TTL / 2))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    @rule(data=st.data(), tenant=st.sampled_from(["acme", "beta"]))
    def present(self, data: st.DataObject, tenant: str) -> None:
        if not self.handles:
            return
        text, session, owner = data.draw(st.sampled_from(self.handles))
        selector = parse(text)[0]  # type: ignore[index]
        result = verify(text, self.store.resume_handle(selector), tenant=tenant, now=self.now)
        if owner != tenant:
            expected = ResumeResult.CROSS_TENANT
        elif self.now >= self.expiry[text]:
            expected = ResumeResult.EXPIRED
        elif text in self.used:
            expected = ResumeResult.REUSED
        elif self.current.get(session) != text:
            expected = ResumeResult.EXPIRED  # superseded
        else:
            expected = ResumeResult.OK
        assert result is expected
        if result is ResumeResult.OK:
            successor = issue(session, owner, now=self.now, ttl_s=TTL)
            assert self.store.use_handle(selector, successor.record)
            # Rotated: the one just used can never rotate again.
            assert not self.store.use_handle(selector, issue(session, owner, now=0, ttl_s=1).record)
            self.used.add(text)
            self.handles.append((successor.text, session, owner))
            self.current[session] = successor.text
            self.expiry[successor.text] = self.now + TTL

    @invariant()
    def one_current_handle_per_session(self) -> None:
        for session, text in self.current.items():
            record = self.store.resume_handle(parse(text)[0])  # type: ignore[index]
            assert record is not None and record.state == RecordState.CURRENT
            assert record.session_id == session


TestHandleLifecycle = HandleLifecycle.TestCase
TestHandleLifecycle.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_the_same_lifecycle_holds_on_postgres(pg_cluster: PgCluster) -> None:
    """Rotation and reuse detection as atomic on the shared store: the machine above, each
    example on a database of its own."""

    class OnPostgres(HandleLifecycle):
        def open_store(self) -> SessionStore:
            self.database = f"handles_{uuid.uuid4().hex[:12]}"
            pg_cluster.create_database(self.database)
            return PostgresSessionStore(pg_cluster.url(self.database))

        def teardown(self) -> None:
            super().teardown()
            pg_cluster.drop_database(self.database)

    run_state_machine_as_test(
        OnPostgres, settings=settings(max_examples=15, stateful_step_count=30, deadline=None)
    )


def test_a_transfer_carries_the_handle_and_pjsips_log_never_shows_it() -> None:
    handle = issue("0123abcd", "default", now=0.0, ttl_s=TTL)
    value = refer_to("sip:desk@cc.example.com", context_headers("0123abcd", handle.text))
    assert value.endswith(f"&X-Voicegate-Session=0123abcd&X-Voicegate-Resume={handle.text}>")
    line = f"TX 900 bytes Request msg REFER ... Refer-To: {value}"
    masked = mask_text(line)
    assert handle.text not in masked and "X-Voicegate-Resume=vgr1.<redacted>>" in masked
    assert context_headers("0123abcd") == context_headers("0123abcd", None)  # no handle, none
