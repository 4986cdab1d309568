"""HTTP calls to tool providers: the request with its ``Idempotency-Key``, and the status query.

What a provider is expected to do is written down by the reference provider
(``providers/payments``): a request returns 2xx with ``{"status": "committed", ...}`` or a 4xx
refusal; replays of a key return the original outcome; ``GET`` on the status endpoint returns the
recorded outcome, ``404`` if the key was never seen, or ``{"status": "unknown"}``.

What an answer means is the ledger's to say (session/ledger.py: ``classify_request``,
``classify_status``, ``classify_failure``), and it never guesses in the caller's favour: anything
after the request may have reached the provider (a timeout, a reset, a 5xx) is ``unknown`` and
goes to the status endpoint; only a connection that was never established is ``not_started``.
This module reads the bytes and decides only whether they are an answer of the contract at all.

An answer outside that contract (too large, not a JSON object, a ``status`` that is not a string,
a redirect, an error status whose body says committed) is a *bad answer*: the request's outcome is
``unknown`` (the status endpoint settles it, never a second request), a status answer is no
answer, and each is counted by reason in ``voicegate_tool_bad_answers_total``.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from config.tools import ToolSettings
from session import ledger
from session.backoff import Jitter, backoff_delay
from session.vocabulary import DEFINITIVE as VOCABULARY_DEFINITIVE
from session.vocabulary import Outcome
from voicegate.observe.metrics import Metrics

log = logging.getLogger("voicegate.tools")

DEFINITIVE = VOCABULARY_DEFINITIVE  # the outcomes a status answer settles for good


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """``outcome``: committed, failed, not_started or unknown; ``detail`` is JSON-able."""

    outcome: str
    detail: Mapping[str, Any] = field(default_factory=dict)


class StatusUnavailable(Exception):
    """The status endpoint gave no usable answer this time (retry within the deadline)."""


# A receipt is a few hundred bytes; anything past this is not an answer of the contract, and is
# never read whole into memory (a provider, or a proxy in front of it, may stream gigabytes).
# The header a provider sets on the answer to a key it had already executed (the replay of the
# original outcome; providers/payments/README.md, the contract voicegate expects of any write tool).
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_ANSWER_BYTES = 64 * 1024
_READ_CHUNK = 8 * 1024


class BadAnswer(enum.StrEnum):
    """Why a provider's answer is outside the contract (``voicegate_tool_bad_answers_total``)."""

    TOO_LARGE = "too_large"  # a body past MAX_ANSWER_BYTES (declared or streamed)
    CONTENT_TYPE = "content_type"  # not application/json (an HTML error page of a proxy, ...)
    NOT_JSON = "not_json"  # empty, truncated, not UTF-8, or not JSON at all
    NOT_OBJECT = "not_object"  # JSON, but not an object
    WRONG_TYPE = "wrong_type"  # an object whose ``status`` is not a string
    STATUS_CODE = "status_code"  # an HTTP status the contract has no meaning for (1xx, 3xx)
    CONTRADICTION = "contradiction"  # an error status (4xx, 5xx) with a body that says committed
    MALFORMED_HTTP = "malformed_http"  # aiohttp could not parse the response (payload, headers)


@dataclass(frozen=True, slots=True)
class _Answer:
    """One HTTP answer as read: the JSON object, or why it is not one."""

    http_status: int
    data: dict[str, Any]
    bad: BadAnswer | None = None


def _is_json(content_type: str) -> bool:
    # RFC 8259 section 11 registers application/json; RFC 6839 the "+json" suffix.
    return content_type == "application/json" or content_type.endswith("+json")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes | None:
    """The body, or None past MAX_ANSWER_BYTES; never buffers more than that (plus a chunk)."""
    declared = response.content_length
    if declared is not None and declared > MAX_ANSWER_BYTES:
        return None
    chunks: list[bytes] = []
    size = 0
    while chunk := await response.content.read(_READ_CHUNK):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _answer(response: aiohttp.ClientResponse) -> _Answer:
    status = response.status
    body = await _read_bounded(response)
    if body is None:
        return _Answer(status, {}, BadAnswer.TOO_LARGE)
    if not (200 <= status < 600) or 300 <= status < 400:
        # Redirects are not followed (a 307 would make aiohttp POST the write again, elsewhere).
        return _Answer(status, {}, BadAnswer.STATUS_CODE)
    if not _is_json(response.content_type):
        return _Answer(status, {}, BadAnswer.CONTENT_TYPE)
    try:
        # NaN and Infinity are not JSON (RFC 8259 section 6); a receipt holding one could not
        # be stored as JSON either.
        data = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _Answer(status, {}, BadAnswer.NOT_JSON)
    if not isinstance(data, dict):
        return _Answer(status, {}, BadAnswer.NOT_OBJECT)
    if "status" in data and not isinstance(data["status"], str):
        return _Answer(status, {}, BadAnswer.WRONG_TYPE)
    if not 200 <= status < 300 and data.get("status") == Outcome.COMMITTED:
        return _Answer(status, {}, BadAnswer.CONTRADICTION)
    return _Answer(status, data)


def _failed(failure: ledger.Failure, reason: str) -> ToolOutcome:
    return ToolOutcome(ledger.classify_failure(failure), {"reason": reason})


class ToolClient:
    """What a caller may rely on: :meth:`request` and :meth:`status` never raise for anything a
    provider answers; an answer outside the contract is never taken as ``committed`` (nor as
    ``not_started``), and is counted by reason when ``metrics`` is given."""

    def __init__(self, http: aiohttp.ClientSession, metrics: Metrics | None = None) -> None:
        self._http = http
        self._metrics = metrics

    def _count_bad(self, tool: ToolSettings, reason: BadAnswer, key: str) -> None:
        if self._metrics is not None:
            self._metrics.tool_bad_answers.labels(tool.name, reason.value).inc()
        log.warning("tool.bad_answer", extra={"tool": tool.name, "key": key, "why": reason.value})

    def _count_repeated(self, tool: ToolSettings, key: str) -> None:
        if self._metrics is not None:
            self._metrics.tool_sends_repeated.labels(tool.name).inc()
        log.error("tool.sent_twice", extra={"tool": tool.name, "key": key})

    async def request(
        self,
        tool: ToolSettings,
        key: str,
        body: Mapping[str, Any],
        context: Mapping[str, str] | None = None,
    ) -> ToolOutcome:
        """POST the request once (the body is the tool's arguments, as JSON). Never retried
        here: a retry is a status query. Redirects are not followed: following a 307 or 308
        would send the write a second time."""
        headers = {"Idempotency-Key": key, "Content-Type": "application/json", **(context or {})}
        payload = json.dumps(body, sort_keys=True).encode()
        trace = {"key": key, "tool": tool}
        try:
            async with asyncio.timeout(tool.timeout_s):
                async with self._http.post(
                    tool.endpoint,
                    data=payload,
                    headers=headers,
                    trace_request_ctx=trace,
                    allow_redirects=False,
                ) as resp:
                    answer = await _answer(resp)
                    replayed = resp.headers.get(REPLAYED_HEADER, "").lower() == "true"
        except aiohttp.ClientConnectorError as exc:
            # The TCP connection was never established: the provider cannot have seen it.
            return _failed(ledger.Failure.NEVER_CONNECTED, f"provider unreachable: {exc.os_error}")
        except TimeoutError:
            return _failed(ledger.Failure.TIMED_OUT, f"no response within {tool.timeout_s:g} s")
        except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as exc:
            # It reached the provider, whose answer cannot be read: unknown, settled by status.
            self._count_bad(tool, BadAnswer.MALFORMED_HTTP, key)
            return _failed(ledger.Failure.UNREADABLE, f"unreadable answer: {type(exc).__name__}")
        except aiohttp.ClientError as exc:
            return _failed(ledger.Failure.TRANSPORT, f"transport error: {type(exc).__name__}")
        if answer.bad is not None:
            # Whatever it says, nobody can rely on it: the status endpoint settles the key. Its
            # text is not kept (it may be huge, or carry what a receipt must not).
            self._count_bad(tool, answer.bad, key)
            return ToolOutcome(
                Outcome.UNKNOWN,
                {"reason": f"bad answer ({answer.bad.value})", "http_status": answer.http_status},
            )
        if replayed:
            # We send each key once; a provider that answers our send as a replay has seen this
            # key before, so something sent the write twice. Its idempotency stopped a second
            # execution; the answer is still the original outcome.
            self._count_repeated(tool, key)
        outcome, detail = ledger.classify_request(ledger.Answer(answer.http_status, answer.data))
        return ToolOutcome(outcome, detail)

    async def status(self, tool: ToolSettings, key: str) -> ToolOutcome:
        """One status query; raises StatusUnavailable when it says nothing usable (a bad
        answer included: a 404 page of a proxy is not "never saw this key")."""
        try:
            async with asyncio.timeout(tool.timeout_s):
                async with self._http.get(tool.status_url(key), allow_redirects=False) as resp:
                    answer = await _answer(resp)
        except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as exc:
            self._count_bad(tool, BadAnswer.MALFORMED_HTTP, key)
            raise StatusUnavailable(f"unreadable status answer: {type(exc).__name__}") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise StatusUnavailable(f"status query failed: {type(exc).__name__}") from None
        if answer.bad is not None:
            self._count_bad(tool, answer.bad, key)
            raise StatusUnavailable(f"bad status answer ({answer.bad.value})")
        settled = ledger.classify_status(ledger.Answer(answer.http_status, answer.data))
        if settled is None:
            raise StatusUnavailable(f"status query answered HTTP {answer.http_status}")
        return ToolOutcome(settled[0], settled[1])

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
