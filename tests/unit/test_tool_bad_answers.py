"""Issue 17, "tool answers": a tool provider that answers garbage changes nothing it must not.

A real aiohttp server on a loopback socket (aiohttp.test_utils.TestServer) answers every charge
and status query with a hypothesis-generated bad answer: truncated JSON, JSON of the wrong shape
or types, bodies far past what a receipt needs, wrong content types, and status codes whose body
contradicts them (3xx redirects back to the endpoint, errors that say "committed"). Against it:

- the tool client never raises, never reports ``committed`` (nor, from a status query,
  ``not_started``), POSTs once and only once, and counts the answer by reason;
- a huge body is not read whole: the server streams it and sees the client hang up early;
- the call's executor (CallTools, on a real SQLite store) records the write as ``unknown``, and
  the session's log holds exactly that receipt.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config.tools import ToolSettings
from session import effects as fx
from session import events as sev
from session.durable import DurableSession
from session.store.reader import StoreReader
from session.store.sqlite import SqliteSessionStore
from session.store.writer import StoreWriter
from session.vocabulary import Outcome
from tests.unit.test_call_tools import Services, in_task
from voicegate.observe.metrics import Metrics
from voicegate.tools.call_tools import CallTools, ToolDone
from voicegate.tools.client import MAX_ANSWER_BYTES, BadAnswer, StatusUnavailable, ToolClient

COMMITTED = json.dumps(
    {"status": "committed", "charge_id": "ch_0123456789abcdef01234567", "amount_cents": 59}
).encode()


@dataclass(frozen=True)
class Answer:
    """One HTTP answer of the garbage provider. ``stream`` bytes are sent after ``body``, in
    chunks, without a Content-Length unless ``declare`` (then the real total is declared)."""

    kind: str
    status: int
    body: bytes
    content_type: str | None = "application/json"
    stream: int = 0
    declare: bool = False
    location: bool = False

    def __repr__(self) -> str:  # hypothesis prints failing examples: keep huge ones short
        return (
            f"Answer({self.kind}, {self.status}, {self.body[:80]!r}, {self.content_type!r},"
            f" stream={self.stream}, declare={self.declare})"
        )


def _not_a_json_object(data: bytes) -> bool:
    try:
        return not isinstance(json.loads(data), dict)
    except ValueError:
        return True


_json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_ok = st.sampled_from([200, 201, 202])

truncated = st.builds(
    lambda n, status: Answer("truncated", status, COMMITTED[:n]),
    st.integers(0, len(COMMITTED) - 1),
    _ok,
)
# JSON that is not an object, or an object whose status is not a string.
wrong_types = st.builds(
    lambda value, status: Answer("wrong_type", status, json.dumps(value).encode()),
    _json.filter(lambda v: not isinstance(v, dict)),
    _ok,
) | st.builds(
    lambda status_value, rest, status: Answer(
        "wrong_type", status, json.dumps({**rest, "status": status_value}).encode()
    ),
    _json.filter(lambda v: not isinstance(v, str)),
    st.dictionaries(st.text(max_size=8), _json, max_size=3),
    _ok,
)
# A committed receipt padded past the limit: it would parse, if it were read whole.
huge = st.builds(
    lambda extra, declare, status: Answer(
        "huge", status, b'{"status":"committed","pad":"', stream=extra, declare=declare
    ),
    st.integers(MAX_ANSWER_BYTES, 16 * MAX_ANSWER_BYTES),
    st.booleans(),
    _ok,
)
wrong_content_types = st.builds(
    lambda ctype, status: Answer("content_type", status, COMMITTED, content_type=ctype),
    st.sampled_from(
        ["text/html", "text/plain", "application/xml", "application/octet-stream", "json", None]
    ),
    _ok,
)
# A committed body under a status that contradicts it, or a redirect back to the same endpoint
# (followed, a 307/308 would POST the write again).
wrong_status_codes = st.builds(
    lambda status: Answer("status_code", status, COMMITTED, location=300 <= status < 400),
    st.sampled_from([300, 301, 302, 303, 307, 308]) | st.integers(400, 599),
)
random_bytes = st.builds(
    lambda body, ctype, status: Answer("bytes", status, body, content_type=ctype),
    st.binary(max_size=200).filter(_not_a_json_object),
    st.sampled_from(["application/json", "text/html", None]),
    st.sampled_from([200, 201, 400, 404, 409, 500, 502, 503]),
)
bad_answers = (
    truncated | wrong_types | huge | wrong_content_types | wrong_status_codes | random_bytes
)


@dataclass
class GarbageProvider:
    """Answers POST /v1/charges with ``charge`` and GET /v1/charges/{key} with ``status``."""

    charge: Answer
    status: Answer
    requests: list[tuple[str, str]] = field(default_factory=list)
    streamed: list[tuple[int, int]] = field(default_factory=list)  # (sent, meant to send)
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # a stream ended

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = self.charge if request.method == "POST" else self.status
        self.requests.append((request.method, request.headers.get("Idempotency-Key", "")))
        headers = {"Location": str(request.url)} if answer.location else {}
        if not answer.stream:
            response = web.Response(status=answer.status, body=answer.body, headers=headers)
            if answer.content_type is None:
                response.headers.pop("Content-Type", None)
            else:
                response.headers["Content-Type"] = answer.content_type
            return response
        stream = web.StreamResponse(status=answer.status, headers=headers)
        if answer.content_type is not None:
            stream.headers["Content-Type"] = answer.content_type
        if answer.declare:
            stream.content_length = len(answer.body) + answer.stream
        await stream.prepare(request)
        await stream.write(answer.body)
        sent, chunk = 0, b"x" * 65536
        try:
            while sent < answer.stream:
                piece = chunk[: answer.stream - sent]
                await stream.write(piece)
                sent += len(piece)
        except ConnectionError:
            pass  # the client hung up: what this test hopes for
        finally:
            self.streamed.append((sent, answer.stream))
            self.finished.set()
        return stream


async def with_provider(
    provider: GarbageProvider, run: Callable[[ToolSettings], Awaitable[None]]
) -> None:
    app = web.Application()
    app.router.add_route("*", "/v1/charges", provider.handle)
    app.router.add_route("*", "/v1/charges/{key}", provider.handle)
    server = TestServer(app)
    await server.start_server()
    try:
        base = str(server.make_url(""))
        tool = ToolSettings(
            "charge", "write", f"{base}/v1/charges", f"{base}/v1/charges/{{key}}", 5.0, "dtmf"
        )
        await run(tool)
    finally:
        await server.close()


def bad_answers_counted(metrics: Metrics) -> float:
    return sum(
        metrics.tool_bad_answers.labels("charge", reason.value)._value.get() for reason in BadAnswer
    )


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(charge=bad_answers, status=bad_answers)
def test_a_bad_answer_is_never_a_commit_never_resent_and_counted(
    charge: Answer, status: Answer
) -> None:
    provider = GarbageProvider(charge, status)
    metrics = Metrics()

    async def run(tool: ToolSettings) -> None:
        async with aiohttp.ClientSession() as http:
            client = ToolClient(http, metrics)
            outcome = await client.request(tool, "k-1", {"amount_cents": 59})
            # Nothing the contract cannot read is taken as a refusal either: it may have
            # committed, so only the status endpoint can settle it.
            assert outcome.outcome == Outcome.UNKNOWN, outcome
            assert outcome.detail["reason"].startswith("bad answer ("), outcome
            try:
                said = await client.status(tool, "k-1")
            except StatusUnavailable:
                pass
            else:
                assert said.outcome == Outcome.UNKNOWN, said

    asyncio.run(with_provider(provider, run))
    # One POST: a bad answer (a redirect included) is never a reason to send the write again.
    assert [m for m, _ in provider.requests] == ["POST", "GET"]
    assert [k for _, k in provider.requests] == ["k-1", ""]
    # Both answers were outside the contract, and both were counted.
    assert bad_answers_counted(metrics) == 2


@settings(max_examples=5, deadline=None)
@given(extra=st.integers(1 << 26, 1 << 28), declare=st.booleans())
def test_a_huge_body_is_not_read_whole(extra: int, declare: bool) -> None:
    # The server means to stream 64 to 256 MiB (more than loopback's socket buffers can hold);
    # the client must stop at the bound and hang up, so the server's writes fail long before
    # the end.
    answer = Answer("huge", 200, b'{"status":"committed","pad":"', stream=extra, declare=declare)
    provider = GarbageProvider(answer, answer)
    metrics = Metrics()

    async def run(tool: ToolSettings) -> None:
        async with aiohttp.ClientSession() as http:
            outcome = await ToolClient(http, metrics).request(tool, "k-1", {})
            assert outcome.outcome == Outcome.UNKNOWN
            assert outcome.detail["reason"] == "bad answer (too_large)"
            # The server's handler ends once its writes fail on the closed connection.
            await asyncio.wait_for(provider.finished.wait(), 30)

    asyncio.run(with_provider(provider, run))
    assert metrics.tool_bad_answers.labels("charge", "too_large")._value.get() == 1
    ((sent, meant),) = provider.streamed
    assert sent < meant


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(charge=bad_answers, status=bad_answers)
def test_the_executor_records_a_bad_answer_as_unknown_or_failed(
    charge: Answer, status: Answer
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_executor_run(Path(tmp), GarbageProvider(charge, status)))


async def _executor_run(tmp: Path, provider: GarbageProvider) -> None:
    db = tmp / "s.sqlite3"
    store = SqliteSessionStore(db)
    writer = StoreWriter(lambda: SqliteSessionStore(db))
    reader = StoreReader(lambda: SqliteSessionStore(db))
    metrics = Metrics()

    async def run(tool: ToolSettings) -> None:
        async with aiohttp.ClientSession() as http:
            # One status attempt: the resolve loop's backoff would only slow the examples.
            services = Services(
                reader, writer, ToolClient(http, metrics), {"charge": tool}, metrics=metrics,
                status_attempts=1,
            )  # fmt: skip
            session, _ = DurableSession.create(
                store, "s1", owner="w/1", meta={}, offered=sev.CallOffered(), now=time.time()
            )
            queue: asyncio.Queue[object] = asyncio.Queue()

            def apply(event: sev.Event) -> list[fx.Effect]:
                effects = session.apply(event, time.time())
                for effect in effects:  # what LiveCall does with SendToolRequest
                    if isinstance(effect, fx.SendToolRequest):
                        intent = next(o for o in session.state.outstanding if o.key == effect.key)
                        tools.send(intent, tools.persist_intent(intent))
                return effects

            tools = CallTools(
                "s1",
                services,
                apply=apply,
                post=queue.put_nowait,
                current_turn=lambda: "t1",
                find_outstanding=lambda key: next(
                    (o for o in session.state.outstanding if o.key == key), None
                ),
                durable=lambda: None,
                wall=time.time,
                in_task=in_task,
            )
            apply(sev.CallAnswered())
            apply(sev.TurnStarted("t1"))
            apply(sev.TurnCommitted("t1"))
            key = tools.request("charge", {"amount_cents": 59}, None, approved=True)
            done = await asyncio.wait_for(queue.get(), 30)
            assert isinstance(done, ToolDone) and done.key == key
            result = tools.record(done, "charge")
            await asyncio.to_thread(writer.flush)

            assert result.outcome == Outcome.UNKNOWN
            receipt = store.receipt(key)
            assert receipt is not None and receipt.outcome == result.outcome
            receipts = [e.payload for e in store.events("s1") if e.type == "tool_receipt"]
            assert [r["outcome"] for r in receipts] == [result.outcome]
            # Sent once; the unknown outcome was asked about, never sent again.
            assert [m for m, _ in provider.requests].count("POST") == 1
            assert bad_answers_counted(metrics) >= 1

    try:
        await with_provider(provider, run)
    finally:
        await asyncio.to_thread(writer.close)
        await asyncio.to_thread(reader.close)
        store.close()
