"""Persist, then act: one call's session steps, and the effects waiting for their store write.

A session event is applied at once; the step's store write runs on the writer thread
(session/store/writer.py). Effects that change only this process's memory run straight away; the
rest wait in a queue until their write (and every write before it) is durable, and run in log
order (voicegate/call/executor.py says which are which). A write that fails, or a lease that is
lost, halts the call: nothing more is written or carried out for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from session import effects as fx
from session import events as sev
from session.machine import IllegalTransition
from session.store import LeaseLost, StoreError
from voicegate.call.call_state import CallState
from voicegate.call.clock import SessionClock
from voicegate.call.cuts import SessionCut, cut_ahead
from voicegate.call.executor import EffectTarget, execute, split_in_process
from voicegate.call.services import CallServices

log = logging.getLogger("voicegate.call")


@dataclass(frozen=True, slots=True)
class Persisted:
    """A write finished on the store's writer thread; ``then`` runs in the call's task."""

    then: Callable[[Future[Any]], None]
    done: Future[Any]


class SessionSteps:
    """Applies session events for one call and carries out their effects once durable.

    ``post`` puts an item on the call's queue (from any thread); ``on_halt`` stops whatever of
    the call still acts (timers, tool requests, the dialog) once the call has halted.
    """

    def __init__(
        self,
        state: CallState,
        services: CallServices,
        clock: SessionClock,
        *,
        post: Callable[[object], None],
        on_halt: Callable[[], None],
    ) -> None:
        self._state = state
        self._services = services
        self._clock = clock
        self._post = post
        self._on_halt = on_halt
        self._loop = asyncio.get_running_loop()
        self._acting: deque[tuple[Future[None] | None, list[fx.Effect]]] = deque()
        self._target: EffectTarget | None = None
        self.last_write: Future[None] | None = None
        self.halted: StoreError | None = None  # lease lost, or the store failed
        # Cuts the playout and records what the caller heard of it, just before a step that
        # cuts playback itself (voicegate/call/responses.py ``Responses.cut_for_session``).
        self.before_cut: Callable[[SessionCut], None] = lambda cut: None

    def attach(self, target: EffectTarget) -> None:
        """The call's actions, which effects map onto; given once, before the first step (they
        apply session events themselves, so they are built on these steps)."""
        self._target = target

    def apply(self, event: sev.Event) -> list[fx.Effect]:
        """Feed the session; effects run only after the step is durable."""
        session = self._state.session
        if session is None:
            return []
        if self.halted is not None:
            raise self.halted  # another process's now, or unwritable: write nothing
        cut = self._cut_ahead(event)
        if cut is not None:
            # Every cut records what the caller heard, whoever cut it: the event ends the
            # response inside the machine, so the record (response_interrupted, prompt_cut)
            # goes first, from the playout cut here (issue 35).
            self.before_cut(cut)
        try:
            effects, write = session.apply_through(self._services.writer, event, self._clock.now())
        except IllegalTransition as exc:
            self._services.metrics.session_events_rejected.labels(event.type).inc()
            log.warning(
                "session.rejected",
                extra={"call_id": self._state.call_id, "event_type": event.type, "why": exc.why},
            )
            raise
        except LeaseLost as exc:
            self.lose_lease(exc)
            raise
        if write is not None:
            self.last_write = write
        if (
            cut is not None
            and cut.stops_generation
            and not any(isinstance(effect, fx.StopGeneration) for effect in effects)
        ):
            # The agent is still told to stop, as the step would have told it had its response
            # not been recorded cut just before (the response_interrupted step does not say it).
            effects = [fx.StopGeneration(), *effects]
        self._execute(effects, write)
        return effects

    def _cut_ahead(self, event: sev.Event) -> SessionCut | None:
        """What ``event`` will cut of what is playing, found by stepping it on the current state
        without keeping the result (voicegate/call/cuts.py); None when nothing plays."""
        session, channel = self._state.session, self._state.channel
        if session is None:
            return None
        playing = channel is not None and channel.playout.playing is not None
        if session.state.response is None and not playing:
            return None  # nothing to cut: most steps stop here, stepped once
        return cut_ahead(session.state, event, self._clock.now())

    def try_apply(self, event: sev.Event) -> bool:
        """:meth:`apply`, saying whether the session took the event."""
        try:
            self.apply(event)
        except (IllegalTransition, StoreError):  # StoreError: _halt has stopped the call
            return False
        return True

    def _actions(self) -> EffectTarget:
        assert self._target is not None, "attach() the call's actions before the first step"
        return self._target

    def _execute(self, effects: list[fx.Effect], write: Future[None] | None) -> None:
        """In-process effects now; the rest once ``write`` (and every write before it) is
        durable, in log order: nothing reaches the caller, the agent, a provider or the SIP
        peer before the log says why."""
        self._services.record_effects(effects)
        now, later = split_in_process(effects)
        execute(now, self._actions())
        if write is None and not later:
            return
        # Every write is watched, with or without effects waiting on it: a write that fails
        # (a lost lease, a broken disk) stops the call from acting on what was never recorded.
        self._acting.append((write, later))
        if write is not None and not write.done():
            write.add_done_callback(lambda f: self.from_writer(self._act, f))
        else:
            self._act()

    def after_durable(self, then: Callable[[], None]) -> None:
        """Run ``then()`` once the last step is durable (at once if it already is): an act
        outside the process that the step asks for (a REFER, an INVITE) follows its record."""
        write = self.last_write
        if write is None or write.done():
            then()
        else:
            write.add_done_callback(lambda f: self.from_writer(lambda _: then(), f))

    def when_done(self, then: Callable[[Future[Any]], None], job: Future[Any]) -> None:
        """Run ``then(job)`` in the call's task once ``job`` (a store job) has finished."""
        job.add_done_callback(lambda f: self.from_writer(then, f))

    def from_writer(self, then: Callable[[Future[Any]], None], done: Future[Any]) -> None:
        """Run ``then(done)`` in the call's task, in order with the call's other events."""
        # Called on the writer thread: hand the result to the call's task, in order.
        self._loop.call_soon_threadsafe(self._post, Persisted(then, done))

    def _act(self, _done: Future[Any] | None = None) -> None:
        """Carry out the deferred effects whose writes are durable, oldest first."""
        while self._acting:
            write, effects = self._acting[0]
            if write is not None and not write.done():
                return
            self._acting.popleft()
            failed = write.exception() if write is not None else None
            if failed is not None:
                self._write_failed(failed)
                continue
            try:
                execute(effects, self._actions())
            except StoreError:
                pass  # _halt has stopped the call
            except IllegalTransition as exc:
                log.warning(
                    "session.effect_refused",
                    extra={"call_id": self._state.call_id, "why": exc.why},
                )

    def _write_failed(self, exc: BaseException) -> None:
        """A step never became durable: its effects are dropped, and the call stops acting."""
        if isinstance(exc, LeaseLost):
            self.lose_lease(exc)
            return
        log.error("session.store_failed", extra={"call_id": self._state.call_id, "why": str(exc)})
        # Write nothing more: what the log holds is the truth the reaper finalises.
        failure = exc if isinstance(exc, StoreError) else StoreError(str(exc))
        self._halt(failure)

    async def settled(self) -> None:
        """Wait until every step so far is durable and its effects carried out."""
        while self._acting:
            # The oldest write still running holds up everything behind it (log order).
            pending = next((w for w, _ in self._acting if w is not None and not w.done()), None)
            if pending is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(pending)
            self._act()

    def lose_lease(self, lost: LeaseLost) -> None:
        """The session was taken over (reaped, or moved to another worker): stop acting for it.

        Nothing more is written (every later step raises ``lost`` before reaching the store),
        timers and tool requests stop, and the dialog is ended here without a session event: the
        session's new owner records how it ends.
        """
        if self.halted is not None:
            return
        log.warning(
            "session.lease_lost",
            extra={
                "call_id": self._state.call_id,
                "session_id": lost.session_id,
                "owner": lost.owner,
                "epoch": lost.epoch,
                "lease_epoch": lost.lease.epoch,
            },
        )
        self._halt(lost)

    @property
    def waiting_on_store(self) -> bool:
        """A step of this call is not durable yet: what it asked for waits (persist, then act)."""
        return any(w is not None and not w.done() for w, _ in self._acting)

    def give_up(self, why: StoreError) -> None:
        """The store could not persist this call's steps in time: stop acting (as on a lost
        lease); its queued steps are still written once the store answers, and the reaper
        finalises the session from what is durable."""
        log.error("session.store_gave_up", extra={"call_id": self._state.call_id, "why": str(why)})
        self._halt(why)

    def _halt(self, why: StoreError) -> None:
        """Stop acting for the session: every later step raises ``why`` before it is written."""
        if self.halted is not None:
            return
        self.halted = why
        self._on_halt()
