"""A session's state machine bound to its durable log.

:meth:`DurableSession.apply` folds an event, appends it (with the effects it produced, the derived
status and any terminal state) to the store, and only then returns the effects for the runtime to
execute: nothing happens in the world before the log says why (STYLE.md habit 6). Loading a
session is its latest checkpoint plus the events after it, so live state and rebuilt state are
the same fold.

Only a session holding the store's lease writes (``create`` or ``take_over``); ``load`` gives a
read-only view. Once another process takes the session over, every write of this one raises
:class:`~session.store.LeaseLost` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from session import effects as fx
from session import events as ev
from session.machine import step
from session.state import SessionState
from session.store import Checkpoint, EventRecord, Lease, SessionStore, UnknownSession
from session.store.writer import StoreWriter

CHECKPOINT_EVERY = 20


class ReadOnlySession(Exception):
    """``apply`` on a session loaded without a lease: a caller's bug, not a store conflict."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r} was loaded read-only: take it over"
            " (DurableSession.take_over) before applying events"
        )
        self.session_id = session_id


class DurableSession:
    def __init__(
        self, store: SessionStore | None, state: SessionState, lease: Lease | None
    ) -> None:
        # None: a live call's session, which writes only through a writer (apply_through), so
        # that no store call runs on its event loop.
        self.store = store
        self.state = state
        self.lease = lease  # None: read-only

    @property
    def session_id(self) -> str:
        return self.state.session_id

    @classmethod
    def create(
        cls,
        store: SessionStore,
        session_id: str,
        *,
        owner: str,
        meta: Mapping[str, Any],
        offered: ev.CallOffered,
        now: float,
    ) -> tuple[DurableSession, list[fx.Effect]]:
        lease = store.create(session_id, owner=owner, meta=meta, at=now)
        session = cls(store, SessionState(session_id), lease)
        return session, session.apply(offered, now)

    @classmethod
    def take_over(
        cls, store: SessionStore, session_id: str, *, owner: str, now: float
    ) -> DurableSession:
        """Become the session's writer at the next lease epoch, then rebuild it.

        The lease is taken first: the previous owner's writes are refused from then on, so the
        state loaded after it is the whole log. Raises UnknownSession, or SessionFinished for a
        session that already ended.
        """
        lease = store.take_over(session_id, owner=owner, at=now)
        return cls(store, cls.load(store, session_id).state, lease)

    @classmethod
    def load(cls, store: SessionStore, session_id: str) -> DurableSession:
        """Rebuild, read-only, from the latest checkpoint and the events logged after it."""
        if store.get(session_id) is None:
            raise UnknownSession(session_id)
        checkpoint = store.latest_checkpoint(session_id)
        state = (
            SessionState.from_dict(checkpoint.state)
            if checkpoint is not None
            else SessionState(session_id)
        )
        for record in store.events(session_id, after_seq=state.version):
            state, _ = step(state, ev.event_from_dict(record.type, record.payload), record.at)
        return cls(store, state, None)

    def apply(self, event: ev.Event, now: float) -> list[fx.Effect]:
        """Fold, persist under the lease (here, synchronously), return effects.

        Raises ReadOnlySession without a lease; IllegalTransition (nothing changes); or a store
        error from the append (LeaseLost first: see ``SessionStore.append``), when nothing is
        persisted and the in-memory state is not advanced. A checkpoint refused after the append
        (LeaseLost: taken over in between) raises too, with the event logged and the state
        advanced; the caller must stop acting for the session either way.
        """
        if self.store is None:
            raise ReadOnlySession(self.session_id)
        after, effects, step_write = self._fold(event, now)
        if step_write is not None:
            step_write.append(self.store)
            self.state = after
            step_write.checkpoint(self.store)
        return effects

    def apply_through(
        self, writer: StoreWriter, event: ev.Event, now: float
    ) -> tuple[list[fx.Effect], Future[None] | None]:
        """Fold now, persist through ``writer`` (off the event loop), return the effects and the
        write's future (None when the step writes nothing, as for a stale event).

        The state advances at once, so the next event folds onto it; the caller must carry out
        effects that reach outside this process only once the future resolves, and stop acting
        for the session if it fails (LeaseLost, or any store error). The writer runs writes in
        order, so a later step is never durable before an earlier one.
        """
        after, effects, step_write = self._fold(event, now)
        self.state = after
        if step_write is None:
            return effects, None
        return effects, writer.submit(step_write)

    def _fold(
        self, event: ev.Event, now: float
    ) -> tuple[SessionState, list[fx.Effect], _StepWrite | None]:
        lease = self.lease
        if lease is None:
            raise ReadOnlySession(self.session_id)
        before = self.state
        after, effects = step(before, event, now)
        if after.version == before.version:
            return after, effects, None
        record = EventRecord(
            session_id=after.session_id,
            seq=after.version,
            type=event.type,
            payload=event.to_dict(),
            effects=[effect.to_dict() for effect in effects],
            at=now,
        )
        checkpoint = None
        if after.version % CHECKPOINT_EVERY == 0 or after.terminal:
            checkpoint = Checkpoint(after.session_id, after.version, after.to_dict(), now)
        write = _StepWrite(
            record,
            lease,
            after.status(),
            after.ended.terminal_state if after.ended else None,
            checkpoint,
        )
        return after, effects, write


@dataclass(frozen=True, slots=True)
class _StepWrite:
    """What one step writes: its event, and a checkpoint every so often and at the end."""

    record: EventRecord
    lease: Lease
    status: str
    terminal_state: str | None
    checkpoint_: Checkpoint | None

    def append(self, store: SessionStore) -> None:
        store.append(
            self.record, lease=self.lease, status=self.status, terminal_state=self.terminal_state
        )

    def checkpoint(self, store: SessionStore) -> None:
        if self.checkpoint_ is not None:
            store.save_checkpoint(self.checkpoint_, lease=self.lease)

    def __call__(self, store: SessionStore) -> None:
        self.append(store)
        self.checkpoint(store)
