"""HTTP calls to tool providers: the request with its ``Idempotency-Key``, and the status query.

What a provider is expected to do is written down by the reference provider
(``providers/payments``): a request returns 2xx with ``{"status": "committed", ...}`` or a 4xx
refusal; replays of a key return the original outcome; ``GET`` on the status endpoint returns the
recorded outcome, ``404`` if the key was never seen, or ``{"status": "unknown"}``.

Classification never guesses in the caller's favour: anything after the request may have reached
the provider (a timeout, a reset, a 5xx) is ``unknown`` and goes to the status endpoint; only a
connection that was never established is ``not_started``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from config.tools import ToolSettings
from session.backoff import Jitter, backoff_delay
from session.vocabulary import DEFINITIVE as VOCABULARY_DEFINITIVE
from session.vocabulary import Outcome

log = logging.getLogger("voicegate.tools")

DEFINITIVE = VOCABULARY_DEFINITIVE  # the outcomes a status answer settles for good


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """``outcome``: committed, failed, not_started or unknown; ``detail`` is JSON-able."""

    outcome: str
    detail: Mapping[str, Any] = field(default_factory=dict)


class StatusUnavailable(Exception):
    """The status endpoint gave no usable answer this time (retry within the deadline)."""


async def _body(response: aiohttp.ClientResponse) -> dict[str, Any]:
    try:
        data = await response.json(content_type=None)
    except (json.JSONDecodeError, aiohttp.ContentTypeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


class ToolClient:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self._http = http

    async def request(
        self,
        tool: ToolSettings,
        key: str,
        body: Mapping[str, Any],
        context: Mapping[str, str] | None = None,
    ) -> ToolOutcome:
        """POST the request once (the body is the tool's arguments, as JSON). Never retried
        here: a retry is a status query."""
        headers = {"Idempotency-Key": key, "Content-Type": "application/json", **(context or {})}
        payload = json.dumps(body, sort_keys=True).encode()
        trace = {"key": key, "tool": tool}
        try:
            async with asyncio.timeout(tool.timeout_s):
                async with self._http.post(
                    tool.endpoint, data=payload, headers=headers, trace_request_ctx=trace
                ) as resp:
                    data = await _body(resp)
        except aiohttp.ClientConnectorError as exc:
            # The TCP connection was never established: the provider cannot have seen it.
            return ToolOutcome(
                Outcome.NOT_STARTED, {"reason": f"provider unreachable: {exc.os_error}"}
            )
        except TimeoutError:
            return ToolOutcome(
                Outcome.UNKNOWN, {"reason": f"no response within {tool.timeout_s:g} s"}
            )
        except aiohttp.ClientError as exc:
            return ToolOutcome(
                Outcome.UNKNOWN, {"reason": f"transport error: {type(exc).__name__}"}
            )
        status = data.get("status")
        if 200 <= resp.status < 300 and status == Outcome.COMMITTED:
            return ToolOutcome(Outcome.COMMITTED, data)
        if 400 <= resp.status < 500 and resp.status not in (408, 429):
            # A refusal: the provider answered and did not do it.
            reason = data.get("reason") or data.get("error") or f"HTTP {resp.status}"
            return ToolOutcome(
                Outcome.FAILED, {**data, "reason": reason, "http_status": resp.status}
            )
        return ToolOutcome(
            "unknown", {"reason": f"HTTP {resp.status} with status {status!r}", **data}
        )

    async def status(self, tool: ToolSettings, key: str) -> ToolOutcome:
        """One status query; raises StatusUnavailable when it says nothing usable."""
        try:
            async with asyncio.timeout(tool.timeout_s):
                async with self._http.get(tool.status_url(key)) as resp:
                    data = await _body(resp)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise StatusUnavailable(f"status query failed: {type(exc).__name__}") from None
        if resp.status == 404:
            return ToolOutcome(Outcome.NOT_STARTED, {"reason": "the provider never saw this key"})
        if resp.status != 200:
            raise StatusUnavailable(f"status query answered HTTP {resp.status}")
        status = data.get("status")
        if status in DEFINITIVE:
            return ToolOutcome(str(status), data)
        return ToolOutcome(Outcome.UNKNOWN, {"reason": f"provider says {status!r}", **data})

    async def resolve(
        self,
        tool: ToolSettings,
        key: str,
        *,
        attempts: int,
        deadline_s: float,
        seed: str,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> ToolOutcome:
        """Ask the status endpoint until it gives a definitive outcome, within a budget.

        Bounded retries with exponential backoff and equal jitter (session.backoff, seeded by
        ``seed``, so a replay schedules the same waits), all inside ``deadline_s``. Returns
        ``unknown`` when the budget runs out: the caller must then not assume anything.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        last = ToolOutcome(Outcome.UNKNOWN, {"reason": "no status answer"})
        for attempt in range(attempts):
            try:
                last = await asyncio.wait_for(
                    self.status(tool, key), timeout=max(0.01, deadline - loop.time())
                )
                if last.outcome in DEFINITIVE:
                    return last
            except (StatusUnavailable, TimeoutError) as exc:
                last = ToolOutcome(
                    Outcome.UNKNOWN, {"reason": str(exc) or "status query timed out"}
                )
            # Equal jitter: at least half the backoff, so retries spread over the budget.
            delay = backoff_delay(seed, attempt, base_s=0.25, cap_s=4.0, jitter=Jitter.EQUAL)
            if attempt + 1 >= attempts or loop.time() + delay >= deadline:
                break
            await sleep(delay)
        return last
