"""A live call's resume handles (session/resume.py): issued when its session starts and on every
transfer, stored (as a digest) before anyone is given one, and kept in memory only while the call
lives, so that the transfer can put it in ``X-Voicegate-Resume`` (docs/tenants.md).

The handle's text is never logged; only that one was issued, and why, is counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

from session.resume import Handle, issue
from session.store import StoreError
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallState
from voicegate.call.clock import SessionClock
from voicegate.call.services import CallServices

log = logging.getLogger("voicegate.call")

class CallResume:
    def __init__(
        self, state: CallState, services: CallServices, steps: SessionSteps, clock: SessionClock
    ) -> None:
        self._state = state
        self._services = services
        self._steps = steps
        self._clock = clock
        self.current: Handle | None = None

    def issue(self, reason: str, then: Callable[[Handle | None], None]) -> None:
        """Issue a new handle (superseding the call's last one) and call ``then`` with it on the
        call's task once it is durable, or with None if the store refused it (the call goes on
        without one: a caller who cannot come back is no worse off than before handles)."""
        # Wall time: the handle's expiry is compared by whichever worker the caller comes back
        # to, as the heartbeat is (voicegate/call/clock.py).
        handle = issue(
            self._state.call_id,
            self._state.tenant,
            now=self._clock.wall(),
            ttl_s=self._services.resume_ttl_s,
        )
        record = handle.record
        done = self._services.writer.submit(lambda store: store.record_handle(record))

        def stored(result: Future[None]) -> None:
            failed = result.exception()
            if failed is not None:
                if not isinstance(failed, StoreError):
                    raise failed
                log.warning(
                    "resume.not_issued",
                    extra={"call_id": self._state.call_id, "reason": reason, "error": str(failed)},
                )
                then(None)
                return
            self.current = handle
            self._services.metrics.resume_issued.labels(reason).inc()
            then(handle)

        done.add_done_callback(lambda f: self._steps.from_writer(stored, f))
