"""A session's state machine bound to its durable log.

:meth:`DurableSession.apply` folds an event, appends it (with the effects it produced, the derived
status and any terminal state) to the store, and only then returns the effects for the runtime to
execute: nothing happens in the world before the log says why (STYLE.md habit 6). Loading a
session is its latest checkpoint plus the events after it, so live state and rebuilt state are
the same fold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from session import effects as fx
from session import events as ev
from session.machine import step
from session.state import SessionState
from session.store import Checkpoint, EventRecord, SessionStore, UnknownSession

CHECKPOINT_EVERY = 20


class DurableSession:
    def __init__(self, store: SessionStore, state: SessionState) -> None:
        self.store = store
        self.state = state

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
        store.create(session_id, owner=owner, meta=meta, at=now)
        session = cls(store, SessionState(session_id))
        return session, session.apply(offered, now)

    @classmethod
    def load(cls, store: SessionStore, session_id: str) -> DurableSession:
        """Rebuild from the latest checkpoint and the events logged after it."""
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
        return cls(store, state)

    def apply(self, event: ev.Event, now: float) -> list[fx.Effect]:
        """Fold, persist, return effects. Raises IllegalTransition (nothing changes) or a store
        error (nothing is persisted and the in-memory state is not advanced)."""
        before = self.state
        after, effects = step(before, event, now)
        if after.version != before.version:
            record = EventRecord(
                session_id=after.session_id,
                seq=after.version,
                type=event.type,
                payload=event.to_dict(),
                effects=[effect.to_dict() for effect in effects],
                at=now,
            )
            self.store.append(
                record,
                status=after.status(),
                terminal_state=after.ended.terminal_state if after.ended else None,
            )
            self.state = after
            if after.version % CHECKPOINT_EVERY == 0 or after.terminal:
                self.store.save_checkpoint(
                    Checkpoint(after.session_id, after.version, after.to_dict(), now)
                )
        return effects
