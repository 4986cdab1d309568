"""Charges received and not yet recorded: each runs in a task of its own, owned here.

A charge does not run inside the request handler. When a caller hangs up, aiohttp may cancel the
handler (``handler_cancellation``, on in its test server); the charge task is shielded from that
and carried through to the ledger. So once the provider has received a charge, its outcome is
decided by the ledger, never by the caller's patience, and a caller that timed out must ask the
status endpoint (seed 000: a timeout means "unknown", not "did not happen").

While a key is here the status endpoint answers ``unknown`` (``in_progress``) rather than
``not_started``: the charge may still commit. Tasks are tracked and, on shutdown, given a bounded
time to finish and then cancelled (STYLE.md habit 5).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from providers.payments.contract import ChargeRequest
from providers.payments.faults import Faults
from providers.payments.ledger import Ledger, Recorded

log = logging.getLogger("providers.payments")


class InFlightCharges:
    def __init__(self, ledger: Ledger, faults: Faults) -> None:
        self._ledger = ledger
        self._faults = faults
        self._keys: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[Recorded]] = set()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._keys[key] > 0

    def start(self, key: str, request: ChargeRequest) -> asyncio.Task[Recorded]:
        """Start carrying out a charge; the caller awaits it through ``asyncio.shield``.

        The key counts as in flight from this call (synchronously, before any other request can
        be served) until the task is done, however it ends.
        """
        self._keys[key] += 1
        task = asyncio.create_task(self._carry_out(key, request), name=f"charge {key}")
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finished(key, done))
        return task

    async def _carry_out(self, key: str, request: ChargeRequest) -> Recorded:
        if (delay := self._faults.charge_delay_s) > 0:
            await asyncio.sleep(delay)  # fault: the provider is slow before it commits
        return await asyncio.to_thread(self._ledger.charge, key, request)

    def _finished(self, key: str, task: asyncio.Task[Recorded]) -> None:
        self._tasks.discard(task)
        self._keys[key] -= 1
        if self._keys[key] <= 0:
            del self._keys[key]
        # Retrieve the outcome so an abandoned task (caller gone) never logs "never retrieved";
        # KeyReused and KeyFenced are answers for a caller who is no longer listening.
        if not task.cancelled() and (error := task.exception()) is not None:
            log.debug("charge.abandoned_error", extra={"key": key, "error": type(error).__name__})

    async def close(self, grace_s: float) -> None:
        """Let running charges finish for up to ``grace_s``, then cancel the rest and wait."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace_s)
        rest = set(self._tasks)
        for task in rest:
            task.cancel()
        if rest:
            log.warning("charge.cancelled_at_shutdown", extra={"count": len(rest)})
            await asyncio.gather(*rest, return_exceptions=True)
