"""The HTTP face of the payment provider (aiohttp). The contract is in ``__init__.py``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiohttp import web

from providers.payments.contract import (
    KEY_HEADER,
    REPLAYED_HEADER,
    Outcome,
    RequestError,
    canonical_json,
    parse_charge,
    parse_key,
)
from providers.payments.faults import Faults
from providers.payments.inflight import InFlightCharges
from providers.payments.ledger import KeyFenced, KeyReused, Ledger, LedgerRow

log = logging.getLogger("providers.payments")

MAX_BODY_BYTES: Final = 16 * 1024
# For charges whose caller is gone, after the runner gave the handlers their own shutdown time.
SHUTDOWN_GRACE_S: Final = 1.0

_KEY_REUSED: Final[dict[str, object]] = {
    "status": "rejected",
    "error": "idempotency key reused with a different request",
}
_KEY_FENCED: Final[dict[str, object]] = {
    "status": "rejected",
    "error": "idempotency key was reported not_started; use a new key",
}


@dataclass
class ProviderState:
    ledger: Ledger
    faults: Faults
    charges: InFlightCharges


STATE: Final = web.AppKey("payments", ProviderState)


def _json(status: int, body: Mapping[str, object], **headers: str) -> web.Response:
    return web.Response(
        status=status,
        text=canonical_json(body),
        content_type="application/json",
        headers=headers,
    )


def _stored(row: LedgerRow, status: int, **headers: str) -> web.Response:
    # The text first sent for this key, unchanged: replays are byte-identical.
    assert row.response is not None  # committed and failed rows always carry their answer
    return web.Response(
        status=status, text=row.response, content_type="application/json", headers=headers
    )


def _bad_request(error: RequestError) -> web.Response:
    return _json(error.status, error.body())


async def _body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        # Still the contract's 400 naming the field; no valid charge is this large.
        raise RequestError("body", f"body is larger than {MAX_BODY_BYTES} bytes") from None


async def post_charge(request: web.Request) -> web.Response:
    """``POST /v1/charges``: charge once per idempotency key; replay the outcome after."""
    state = request.app[STATE]
    if (fail := state.faults.take_failure()) is not None:
        log.warning("charge.fault", extra={"http_status": fail})
        return _json(fail, {"status": "error", "error": "injected fault: nothing was written"})
    try:
        key = parse_key(request.headers.get(KEY_HEADER))
        charge = parse_charge(await _body(request))
    except RequestError as error:
        log.info("charge.bad_request", extra={"field": error.field})
        return _bad_request(error)
    try:
        # Shielded: if the caller hangs up and the handler is cancelled, the charge goes on.
        recorded = await asyncio.shield(state.charges.start(key, charge))
    except KeyReused:
        log.info("charge.key_reused", extra={"key": key})
        return _json(422, _KEY_REUSED)
    except KeyFenced:
        log.info("charge.key_fenced", extra={"key": key})
        return _json(409, _KEY_FENCED)
    row = recorded.row
    log.info(
        "charge.replayed" if recorded.replayed else f"charge.{row.status}",
        extra={
            "key": key,
            "charge_id": row.charge_id,
            "amount_cents": row.amount_cents,
            "currency": row.currency,
            "reason": row.reason,
        },
    )
    # The row is committed (durable) at this point; the delay only holds the answer back.
    if (delay := state.faults.respond_delay_s) > 0:
        await asyncio.sleep(delay)
    assert row.http_status is not None
    headers = {REPLAYED_HEADER: "true"} if recorded.replayed else {}
    return _stored(row, row.http_status, **headers)


async def get_charge(request: web.Request) -> web.Response:
    """``GET /v1/charges/{key}``: the receipt for a key (the four ``Outcome`` values)."""
    state = request.app[STATE]
    try:
        key = parse_key(request.match_info["key"], field="key")
    except RequestError as error:
        return _bad_request(error)
    if state.faults.status_unknown:
        return _json(200, {"status": Outcome.UNKNOWN.value, "key": key})
    # Read in-flight before the ledger: a charge that finishes in between is then found there.
    if key in state.charges:
        row = await asyncio.to_thread(state.ledger.lookup, key)
        if row is None:
            unknown = {"status": Outcome.UNKNOWN.value, "key": key, "reason": "in_progress"}
            return _json(200, unknown)
    else:
        row = await asyncio.to_thread(state.ledger.lookup_or_fence, key)
    log.info("status.answered", extra={"key": key, "status": row.status})
    if row.status == Outcome.NOT_STARTED:
        return _json(404, {"status": Outcome.NOT_STARTED.value, "key": key})
    return _stored(row, 200)


async def get_ledger(request: web.Request) -> web.Response:
    """``GET /v1/ledger``: every row, oldest first (for tests and people)."""
    rows = await asyncio.to_thread(request.app[STATE].ledger.rows)
    return _json(200, {"rows": [row.public() for row in rows]})


async def healthz(request: web.Request) -> web.Response:
    return _json(200, {"status": "ok"})


async def get_faults(request: web.Request) -> web.Response:
    return _json(200, request.app[STATE].faults.as_json())


async def post_faults(request: web.Request) -> web.Response:
    """``POST /admin/faults``: change some faults (partial JSON object); answers all of them."""
    faults = request.app[STATE].faults
    try:
        changes = await request.json()
    except ValueError:
        return _bad_request(RequestError("body", "body is not valid JSON"))
    if not isinstance(changes, dict):
        return _bad_request(RequestError("body", "body must be a JSON object"))
    try:
        faults.update(changes)
    except RequestError as error:
        return _bad_request(error)
    log.warning("faults.changed", extra=faults.as_json())
    return _json(200, faults.as_json())


def create_app(db: Path, *, faults: Faults | None = None, admin: bool = False) -> web.Application:
    """The provider on the ledger at ``db`` (created if missing). Opens the file: call at start-up.

    ``admin`` adds ``GET``/``POST /admin/faults``; without it faults are fixed at start-up.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    ledger = Ledger(db)
    faults = faults if faults is not None else Faults()
    state = ProviderState(ledger, faults, InFlightCharges(ledger, faults))
    app[STATE] = state

    async def finish_charges(app: web.Application) -> None:
        await state.charges.close(SHUTDOWN_GRACE_S)

    app.on_cleanup.append(finish_charges)
    app.router.add_post("/v1/charges", post_charge)
    # Any visible ASCII but "/" (the default pattern also refuses "{" and "}"); "%2F" still works.
    app.router.add_get("/v1/charges/{key:[^/]+}", get_charge)
    app.router.add_get("/v1/ledger", get_ledger)
    app.router.add_get("/healthz", healthz)
    if admin:
        app.router.add_get("/admin/faults", get_faults)
        app.router.add_post("/admin/faults", post_faults)
    return app
