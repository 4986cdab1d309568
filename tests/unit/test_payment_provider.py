"""The reference payment provider against its contract (providers/payments/__init__.py).

Real app, real SQLite file, real HTTP (aiohttp TestServer); the CLI test runs the real process.
Waits poll a condition with a bound (STYLE.md habit 3); the delays are the injected faults.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.payments import STATE, Faults, Ledger
from providers.payments.__main__ import main as cli_main
from tests.integration.harness import free_port
from tests.payment_app import payment_app

REPO = Path(__file__).resolve().parents[2]
BODY: dict[str, object] = {"amount_cents": 1250, "currency": "EUR", "account": "acct-42"}

Client = TestClient[web.Request, web.Application]


@dataclass
class Provider:
    client: Client
    db: Path

    @property
    def faults(self) -> Faults:
        return self.client.app[STATE].faults

    async def charge(
        self, key: str | None, body: object = BODY, raw: bytes | None = None
    ) -> aiohttp.ClientResponse:
        headers = {"Idempotency-Key": key} if key is not None else {}
        data = raw if raw is not None else json.dumps(body).encode()
        return await self.client.post("/v1/charges", data=data, headers=headers)

    async def status(self, key: str) -> aiohttp.ClientResponse:
        return await self.client.get(f"/v1/charges/{quote(key, safe='')}")


def _read_ledger(db: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM charges ORDER BY seq")]
    conn.close()
    return rows


async def ledger_rows(db: Path) -> list[dict[str, Any]]:
    """The ledger as a second, independent connection sees it (committed rows only).

    Read off the loop: the provider under test serves on this loop, and a read that meets its
    writer's lock waits in SQLite's busy handler (seen in CI: 31 sleeps, 54 ms).
    """
    return await asyncio.to_thread(_read_ledger, db)


async def _has_rows(db: Path, count: int) -> bool:
    return len(await ledger_rows(db)) == count


async def eventually(condition: Callable[[], Awaitable[bool]], within_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[Provider]:
    db = tmp_path / "ledger.sqlite3"
    async with TestClient(TestServer(await payment_app(db, admin=True))) as client:
        yield Provider(client, db)


# --- POST /v1/charges ---------------------------------------------------------------------------


async def test_new_key_commits_one_row_then_answers(provider: Provider) -> None:
    resp = await provider.charge("order-1")
    assert resp.status == 200
    assert "Idempotent-Replayed" not in resp.headers
    body = await resp.json()
    assert body["status"] == "committed"
    assert body["charge_id"].startswith("ch_") and len(body["charge_id"]) == 27
    assert body | {"charge_id": None} == {
        "status": "committed",
        "charge_id": None,
        "amount_cents": 1250,
        "currency": "EUR",
        "key": "order-1",
    }
    [row] = await ledger_rows(provider.db)
    assert (row["key"], row["status"], row["charge_id"]) == (
        "order-1",
        "committed",
        body["charge_id"],
    )
    assert (row["amount_cents"], row["currency"], row["account"]) == (1250, "EUR", "acct-42")


async def test_same_key_same_body_replays_the_original_byte_for_byte(provider: Provider) -> None:
    first = await provider.charge("order-1", {**BODY, "reference": "inv 7"})
    first_bytes = await first.read()
    # Another key order, other whitespace: the same request in canonical JSON.
    reordered = (
        b'{ "reference": "inv 7", "account": "acct-42", "currency": "EUR", "amount_cents": 1250 }'
    )
    for _ in range(3):
        again = await provider.charge("order-1", raw=reordered)
        assert again.status == 200
        assert again.headers["Idempotent-Replayed"] == "true"
        assert await again.read() == first_bytes
    assert len(await ledger_rows(provider.db)) == 1


async def test_absent_and_null_reference_are_the_same_request(provider: Provider) -> None:
    first = await provider.charge("k", BODY)
    again = await provider.charge("k", {**BODY, "reference": None})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert await again.read() == await first.read()


@pytest.mark.parametrize(
    "change",
    [{"amount_cents": 1251}, {"currency": "USD"}, {"account": "acct-43"}, {"reference": "x"}],
)
async def test_same_key_other_body_is_rejected_and_writes_nothing(
    provider: Provider, change: dict[str, object]
) -> None:
    await provider.charge("order-1")
    before = await ledger_rows(provider.db)
    resp = await provider.charge("order-1", {**BODY, **change})
    assert resp.status == 422
    assert await resp.json() == {
        "status": "rejected",
        "error": "idempotency key reused with a different request",
    }
    assert await ledger_rows(provider.db) == before


@pytest.mark.parametrize(
    ("account", "reason"), [("blocked", "account_blocked"), ("insufficient", "insufficient_funds")]
)
async def test_refusal_is_recorded_and_replayed_and_reported(
    provider: Provider, account: str, reason: str
) -> None:
    body = {**BODY, "account": account}
    resp = await provider.charge("pay-1", body)
    assert resp.status == 402
    first_bytes = await resp.read()
    assert json.loads(first_bytes) == {
        "status": "failed",
        "reason": reason,
        "amount_cents": 1250,
        "currency": "EUR",
        "key": "pay-1",
    }
    [row] = await ledger_rows(provider.db)
    assert (row["status"], row["reason"], row["charge_id"]) == ("failed", reason, None)
    again = await provider.charge("pay-1", body)
    assert (again.status, again.headers["Idempotent-Replayed"]) == (402, "true")
    assert await again.read() == first_bytes
    status = await provider.status("pay-1")
    assert status.status == 200
    assert await status.read() == first_bytes
    assert len(await ledger_rows(provider.db)) == 1


BAD_REQUESTS: list[tuple[str | None, object, str]] = [
    (None, BODY, "Idempotency-Key"),
    ("", BODY, "Idempotency-Key"),
    ("x" * 201, BODY, "Idempotency-Key"),
    ("has space", BODY, "Idempotency-Key"),
    ("k", b"{not json", "body"),
    ("k", b"\xff\xfe", "body"),
    ("k", b"{" + b" " * 20_000 + b"}", "body"),
    ("k", [1, 2], "body"),
    ("k", {k: v for k, v in BODY.items() if k != "amount_cents"}, "amount_cents"),
    ("k", {**BODY, "amount_cents": 0}, "amount_cents"),
    ("k", {**BODY, "amount_cents": -1}, "amount_cents"),
    ("k", {**BODY, "amount_cents": 10_000_001}, "amount_cents"),
    ("k", {**BODY, "amount_cents": 12.5}, "amount_cents"),
    ("k", {**BODY, "amount_cents": "1250"}, "amount_cents"),
    ("k", {**BODY, "amount_cents": True}, "amount_cents"),
    ("k", {**BODY, "currency": "JPY"}, "currency"),
    ("k", {**BODY, "currency": "eur"}, "currency"),
    ("k", {**BODY, "currency": None}, "currency"),
    ("k", {**BODY, "account": ""}, "account"),
    ("k", {**BODY, "account": "a" * 65}, "account"),
    ("k", {**BODY, "account": 42}, "account"),
    ("k", {**BODY, "account": "a\nb"}, "account"),
    ("k", {**BODY, "reference": "r" * 201}, "reference"),
    ("k", {**BODY, "reference": 7}, "reference"),
    ("k", {**BODY, "reference": "two\nlines"}, "reference"),
    ("k", {**BODY, "card_number": "4111"}, "card_number"),
]


@pytest.mark.parametrize(("key", "body", "field"), BAD_REQUESTS)
async def test_bad_request_names_the_field_and_writes_nothing(
    provider: Provider, key: str | None, body: object, field: str
) -> None:
    raw = body if isinstance(body, bytes) else None
    resp = await provider.charge(key, body, raw=raw)
    assert resp.status == 400
    answer = await resp.json()
    assert answer["field"] == field
    assert isinstance(answer["error"], str) and answer["error"]
    assert await ledger_rows(provider.db) == []


async def test_bounds_are_inclusive(provider: Provider) -> None:
    edge = {"amount_cents": 10_000_000, "currency": "GBP", "account": "a" * 64, "reference": ""}
    assert (await provider.charge("x" * 200, edge)).status == 200
    assert (
        await provider.charge("~!", {**BODY, "amount_cents": 1, "reference": "r" * 200})
    ).status == 200


# --- concurrency ----------------------------------------------------------------------------------


@pytest.mark.parametrize("charge_delay_s", [0.0, 0.05])
async def test_concurrent_same_key_creates_exactly_one_row(
    provider: Provider, charge_delay_s: float
) -> None:
    # With a delay, all 20 are in flight together before any of them reaches the ledger.
    provider.faults.charge_delay_s = charge_delay_s
    responses = await asyncio.gather(*(provider.charge("same") for _ in range(20)))
    bodies = [await r.read() for r in responses]
    assert [r.status for r in responses] == [200] * 20
    assert len(set(bodies)) == 1  # one charge id, one answer
    replayed = [r.headers.get("Idempotent-Replayed") for r in responses]
    assert replayed.count(None) == 1 and replayed.count("true") == 19
    [row] = await ledger_rows(provider.db)
    assert row["charge_id"] == json.loads(bodies[0])["charge_id"]


async def test_concurrent_same_key_different_bodies_one_wins(provider: Provider) -> None:
    bodies = [{**BODY, "amount_cents": 100 + i} for i in range(10)]
    responses = await asyncio.gather(*(provider.charge("same", b) for b in bodies))
    assert sorted(r.status for r in responses) == [200] + [422] * 9
    [row] = await ledger_rows(provider.db)
    [winner] = [await r.json() for r in responses if r.status == 200]
    assert row["amount_cents"] == winner["amount_cents"]


# --- GET /v1/charges/{key} ------------------------------------------------------------------------


async def test_status_of_committed_key_is_the_stored_answer(provider: Provider) -> None:
    first = await provider.charge("order/1 ?#")  # any visible ASCII, percent-encoded in the path
    assert first.status == 400  # spaces are not visible ASCII
    for key in ("order/1?#%", "{x}", "a%2Fb"):
        first = await provider.charge(key)
        status = await provider.status(key)
        assert (status.status, await status.read()) == (200, await first.read())


async def test_status_of_never_seen_key_is_not_started_and_fences_it(provider: Provider) -> None:
    resp = await provider.status("never")
    assert resp.status == 404
    assert await resp.json() == {"status": "not_started", "key": "never"}
    # Definitive: a late request with that key can no longer start.
    late = await provider.charge("never")
    assert late.status == 409
    assert (await late.json())["status"] == "rejected"
    assert [(r["key"], r["status"]) for r in await ledger_rows(provider.db)] == [
        ("never", "not_started")
    ]
    assert (await provider.status("never")).status == 404


async def test_an_unknown_route_404_is_not_a_not_started_receipt(provider: Provider) -> None:
    resp = await provider.client.get("/v1/charge/whatever")
    assert resp.status == 404
    assert resp.content_type != "application/json"


async def test_status_unknown_fault(provider: Provider) -> None:
    await provider.charge("done")
    provider.faults.status_unknown = True
    for key in ("done", "never"):
        resp = await provider.status(key)
        assert (resp.status, await resp.json()) == (200, {"status": "unknown", "key": key})
    assert [r["key"] for r in await ledger_rows(provider.db)] == ["done"]  # no fence written


async def test_status_rejects_a_malformed_key(provider: Provider) -> None:
    resp = await provider.status("x" * 201)
    assert resp.status == 400
    assert (await resp.json())["field"] == "key"


# --- faults ---------------------------------------------------------------------------------------


async def test_respond_delay_commits_before_the_answer_leaves(provider: Provider) -> None:
    provider.faults.respond_delay_s = 1.0
    pending = asyncio.create_task(provider.charge("slow-answer"))
    await eventually(lambda: _has_rows(provider.db, 1))
    assert not pending.done()  # committed, and the caller has heard nothing yet
    [row] = await ledger_rows(provider.db)
    assert row["status"] == "committed"
    provider.faults.respond_delay_s = 0.0
    status = await provider.status("slow-answer")
    assert (await status.json())["charge_id"] == row["charge_id"]
    resp = await pending
    assert (resp.status, (await resp.json())["charge_id"]) == (200, row["charge_id"])


async def test_charge_delay_past_the_callers_timeout_is_unknown_then_committed(
    provider: Provider,
) -> None:
    provider.faults.charge_delay_s = 0.5
    with pytest.raises(TimeoutError):
        await provider.client.post(
            "/v1/charges",
            json=BODY,
            headers={"Idempotency-Key": "slow"},
            timeout=aiohttp.ClientTimeout(total=0.1),
        )
    # The provider still has it: not "not started" (that would invite a second charge).
    status = await provider.status("slow")
    assert await status.json() == {"status": "unknown", "key": "slow", "reason": "in_progress"}
    assert await ledger_rows(provider.db) == []
    # The caller hung up; the charge goes through anyway, and the receipt says so.
    await eventually(lambda: _has_rows(provider.db, 1))
    status = await provider.status("slow")
    assert (await status.json())["status"] == "committed"
    replay = await provider.charge("slow")
    assert replay.headers["Idempotent-Replayed"] == "true"


async def test_fail_status_answers_5xx_and_writes_nothing(provider: Provider) -> None:
    resp = await provider.client.post("/admin/faults", json={"fail_status": 503, "fail_count": 2})
    assert resp.status == 200
    for _ in range(2):
        failed = await provider.charge("flaky")
        assert failed.status == 503
        assert (await failed.json())["status"] == "error"
        assert await ledger_rows(provider.db) == []
    assert (await (await provider.client.get("/admin/faults")).json())["fail_count"] == 0
    ok = await provider.charge("flaky")
    assert ok.status == 200 and "Idempotent-Replayed" not in ok.headers
    assert len(await ledger_rows(provider.db)) == 1


async def test_admin_faults_partial_update_and_validation(provider: Provider) -> None:
    resp = await provider.client.post("/admin/faults", json={"charge_delay_s": 0.25})
    assert await resp.json() == {
        "charge_delay_s": 0.25,
        "respond_delay_s": 0.0,
        "fail_status": None,
        "fail_count": 0,
        "status_unknown": False,
    }
    bad: list[tuple[object, str]] = [
        ({"charge_delay_s": -1}, "charge_delay_s"),
        ({"respond_delay_s": "1"}, "respond_delay_s"),
        ({"fail_status": 404}, "fail_status"),
        ({"fail_count": -1}, "fail_count"),
        ({"status_unknown": 1}, "status_unknown"),
        ({"explode": True}, "explode"),
        ([1], "body"),
    ]
    for change, field in bad:
        resp = await provider.client.post("/admin/faults", json=change)
        assert (resp.status, (await resp.json())["field"]) == (400, field)
    # A refused update changed nothing, even the valid part of it.
    await provider.client.post("/admin/faults", json={"respond_delay_s": 9, "fail_count": -1})
    assert provider.faults.respond_delay_s == 0.0 and provider.faults.charge_delay_s == 0.25


async def test_admin_routes_exist_only_with_admin(tmp_path: Path) -> None:
    async with TestClient(TestServer(await payment_app(tmp_path / "l.sqlite3"))) as client:
        assert (await client.get("/admin/faults")).status == 404
        assert (await client.post("/admin/faults", json={})).status in (404, 405)
        assert (await client.get("/healthz")).status == 200


# --- the ledger ----------------------------------------------------------------------------------


async def test_ledger_endpoint_lists_rows_oldest_first(provider: Provider) -> None:
    await provider.charge("a")
    await provider.charge("b", {**BODY, "account": "blocked"})
    await provider.status("c")
    rows = (await (await provider.client.get("/v1/ledger")).json())["rows"]
    assert [(r["key"], r["status"]) for r in rows] == [
        ("a", "committed"),
        ("b", "failed"),
        ("c", "not_started"),
    ]
    assert "response" not in rows[0]


async def test_the_ledger_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "l.sqlite3"
    async with TestClient(TestServer(await payment_app(db))) as client:
        first = await client.post("/v1/charges", json=BODY, headers={"Idempotency-Key": "k"})
        first_bytes = await first.read()
    async with TestClient(TestServer(await payment_app(db))) as client:
        again = await client.post("/v1/charges", json=BODY, headers={"Idempotency-Key": "k"})
        assert (again.headers["Idempotent-Replayed"], await again.read()) == ("true", first_bytes)
    assert len(await ledger_rows(db)) == 1


def test_ledger_is_wal_with_full_sync(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    with sqlite3.connect(ledger.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    with ledger._connection() as conn:  # the ledger's own connections
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


# --- properties -----------------------------------------------------------------------------------

_REFUSED = {"blocked", "insufficient"}
_keys = st.sampled_from(["k1", "k2", "k3", "a/b", "x%y?"]) | st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=6
)
_bodies = st.fixed_dictionaries(
    {
        "amount_cents": st.integers(1, 3) | st.integers(-2, 10_000_002),
        "currency": st.sampled_from(["EUR", "USD", "GBP", "JPY"]),
        "account": st.sampled_from(["acct-1", "acct-2", *_REFUSED, ""]) | st.text(max_size=66),
    },
    optional={"reference": st.none() | st.text(max_size=202)},
)


def _canonical(body: dict[str, Any]) -> tuple[object, ...] | None:
    """The spec's notion of "same request", written independently of the provider; None if bad."""
    amount, currency, account = body["amount_cents"], body["currency"], body["account"]
    reference = body.get("reference")
    valid = (
        1 <= amount <= 10_000_000
        and currency in ("EUR", "USD", "GBP")
        and 1 <= len(account) <= 64
        and account.isprintable()
        and (reference is None or (len(reference) <= 200 and reference.isprintable()))
    )
    return (amount, currency, account, reference) if valid else None


@st.composite
def _scripts(draw: st.DrawFn) -> list[tuple[str, str, dict[str, Any], bool]]:
    # A small pool of keys and bodies so that replays and conflicts are common.
    keys = draw(st.lists(_keys, min_size=1, max_size=3))
    bodies = draw(st.lists(_bodies, min_size=1, max_size=3))
    ops = st.tuples(
        st.sampled_from(["charge", "charge", "charge", "status"]),
        st.sampled_from(keys),
        st.sampled_from(bodies),
        st.booleans(),  # send the body's keys reversed
    )
    return draw(st.lists(ops, min_size=1, max_size=10))


async def _run_script(db: Path, script: list[tuple[str, str, dict[str, Any], bool]]) -> None:
    # Per key: ("fenced",) or (canonical request, http status, exact answer bytes).
    model: dict[str, tuple[object, ...]] = {}
    async with TestClient(TestServer(await payment_app(db))) as client:
        provider = Provider(client, db)
        for op, key, body, reverse in script:
            seen = model.get(key)
            if op == "status":
                resp = await provider.status(key)
                raw = await resp.read()
                if seen is None or seen == ("fenced",):
                    assert resp.status == 404
                    model[key] = ("fenced",)
                else:
                    assert (resp.status, raw) == (200, seen[2])
                continue
            sent = dict(reversed(body.items())) if reverse else body
            resp = await provider.charge(key, sent)
            raw = await resp.read()
            request = _canonical(body)
            if request is None:
                assert resp.status == 400
            elif seen == ("fenced",):
                assert resp.status == 409
            elif seen is None:
                expected = 402 if body["account"] in _REFUSED else 200
                assert resp.status == expected
                assert "Idempotent-Replayed" not in resp.headers
                model[key] = (request, resp.status, raw)
            elif seen[0] == request:
                assert (resp.status, raw) == (seen[1], seen[2])  # byte-identical replay
                assert resp.headers["Idempotent-Replayed"] == "true"
            else:
                assert resp.status == 422
    rows = await ledger_rows(db)
    assert len({r["key"] for r in rows}) == len(rows)  # never two rows for one key
    assert {r["key"] for r in rows} == set(model)
    charge_ids = [r["charge_id"] for r in rows if r["charge_id"] is not None]
    assert len(set(charge_ids)) == len(charge_ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=_scripts())
def test_property_one_row_per_key_and_replays_are_byte_identical(
    script: list[tuple[str, str, dict[str, Any], bool]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_run_script(Path(tmp) / "ledger.sqlite3", script))


# --- the process ----------------------------------------------------------------------------------


def _free_port() -> int:
    return free_port(udp_and_tcp=False)


async def _start(db: Path, *args: str, **env: str) -> tuple[asyncio.subprocess.Process, str]:
    environ = {**os.environ, **env}
    # The package is importable from the repository even before it is listed in pyproject.
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "providers.payments",
        "--db",
        str(db),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environ,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=15)).decode()
    assert line.startswith("payments: listening on http://127.0.0.1:"), line
    return proc, line.removeprefix("payments: listening on ").strip()


async def _stop(proc: asyncio.subprocess.Process) -> tuple[int, list[dict[str, Any]]]:
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=15)
    return proc.returncode or 0, [json.loads(line) for line in err.decode().splitlines()]


async def test_cli_process_charges_once_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    db = tmp_path / "ledger.sqlite3"
    proc, url = await _start(db, "--host", "127.0.0.1", "--port", str(port))
    try:
        assert url == f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            headers = {"Idempotency-Key": "cli-1"}
            async with http.post(f"{url}/v1/charges", json=BODY, headers=headers) as resp:
                assert resp.status == 200
                charge_id = (await resp.json())["charge_id"]
            async with http.get(f"{url}/admin/faults") as resp:
                assert resp.status == 404  # not started with --admin
    finally:
        rc, logs = await _stop(proc)
    assert rc == 0
    assert [(r["key"], r["charge_id"]) for r in await ledger_rows(db)] == [("cli-1", charge_id)]
    events = [entry["event"] for entry in logs]
    assert "charge.committed" in events and events[-1] == "payments.stopping"
    assert all("acct-42" not in json.dumps(entry) for entry in logs)  # accounts stay out of logs


async def test_cli_faults_from_flags_and_environment(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    proc, url = await _start(
        db,
        "--port",
        "0",
        "--admin",
        "--fail-count",
        "1",
        "--status-unknown",
        PAYMENTS_FAIL_STATUS="503",
    )
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/admin/faults") as resp:
                faults = await resp.json()
            assert (faults["fail_status"], faults["fail_count"], faults["status_unknown"]) == (
                503,
                1,
                True,
            )
            headers = {"Idempotency-Key": "k"}
            statuses = []
            for _ in range(2):
                async with http.post(f"{url}/v1/charges", json=BODY, headers=headers) as resp:
                    statuses.append(resp.status)
            assert statuses == [503, 200]
            async with http.get(f"{url}/v1/charges/k") as resp:
                assert (await resp.json())["status"] == "unknown"
    finally:
        rc, _ = await _stop(proc)
    assert rc == 0


def test_cli_refuses_a_bad_fault_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["--db", str(tmp_path / "l.sqlite3"), "--fail-status", "404"]) == 2
    assert "fail_status" in capsys.readouterr().err
