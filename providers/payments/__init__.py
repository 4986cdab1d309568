"""The reference payment provider: what voicegate expects of any write-tool provider.

A small aiohttp service with its own SQLite ledger. Run it with ``python -m providers.payments``
(flags in ``__main__.py``). ARCHITECTURE.md "Side effects" and seed 000 are why it looks like this:
a write is sent once with an ``Idempotency-Key``, and a caller that lost the answer asks the status
endpoint for a receipt instead of sending the write again.

Contract (all bodies are JSON objects; all answers are ``application/json``)

``POST /v1/charges``, header ``Idempotency-Key: <1..200 visible ASCII chars, 0x21-0x7E>``, body
``{"amount_cents": int 1..10_000_000, "currency": "EUR"|"GBP"|"USD", "account": str 1..64,
"reference": str 0..200 (optional, may be null)}``; unknown fields are refused.

- New key: the outcome is committed to the ledger (one row, fsynced) and only then answered:
  ``200 {"status": "committed", "charge_id": "ch_<24 hex>", "amount_cents", "currency", "key"}``.
- Refused by the provider (account ``"blocked"`` -> ``account_blocked``, ``"insufficient"`` ->
  ``insufficient_funds``): recorded as a ``failed`` row under the key, then
  ``402 {"status": "failed", "reason", "amount_cents", "currency", "key"}``.
- Same key, same request (equal canonical JSON: key order, whitespace and an absent vs null
  ``reference`` do not matter): the original answer again, byte for byte, same status code, same
  charge id, no new row, with header ``Idempotent-Replayed: true``.
- Same key, different request: ``422 {"status": "rejected", "error": "idempotency key reused
  with a different request"}``; nothing written.
- Key fenced by a ``not_started`` status answer (below): ``409 {"status": "rejected", "error":
  ...}``; nothing written. Use a new key for a new, authorised attempt.
- Malformed (missing/bad key, bad JSON, body over 16 KiB, bad field): ``400 {"error", "field"}``
  where field is ``Idempotency-Key``, ``body`` or the JSON field; nothing written.
- Fault ``fail_status``: ``5xx {"status": "error", "error": ...}``; nothing written.

``GET /v1/charges/{key}`` (the status endpoint; the key percent-encoded in the path):

- ``200`` with the stored answer of a ``committed`` or ``failed`` key, byte for byte as first sent.
- ``404 {"status": "not_started", "key"}``: the provider never received a charge with this key,
  and it records a fence so a charge with this key arriving later is refused (409). This is what
  makes the answer definitive: it never started and never will. Only a 404 whose JSON body says
  ``not_started`` means that; any other 404 (a wrong URL) is not a receipt.
- ``200 {"status": "unknown", "key", "reason": "in_progress"}``: a charge with this key is being
  processed right now (e.g. ``charge_delay_s``); ask again later.
- ``200 {"status": "unknown", "key"}``: the ``status_unknown`` fault is on.
- ``400 {"error", "field": "key"}`` for a malformed key.

``GET /v1/ledger`` -> ``200 {"rows": [...]}`` (oldest first; ``not_started`` fences included).
``GET /healthz`` -> ``200 {"status": "ok"}``. With ``--admin`` only: ``GET /admin/faults`` and
``POST /admin/faults`` (a partial object of ``charge_delay_s``, ``respond_delay_s``,
``fail_status``, ``fail_count``, ``status_unknown``; answers all faults, or 400 naming the field).

Guarantees a caller may rely on: at most one ledger row per key, even for concurrent requests
with one key (UNIQUE key, ``BEGIN IMMEDIATE``); a ``200``/``402`` answer is only sent after its row
is committed with ``synchronous=FULL``; a charge that was received is carried through even if the
caller hangs up, so a timeout on the caller's side means "unknown", never "did not happen".
"""

from providers.payments.app import STATE, ProviderState, create_app
from providers.payments.contract import ChargeRequest, Outcome, RequestError
from providers.payments.faults import Faults
from providers.payments.ledger import Ledger, LedgerRow

__all__ = [
    "STATE",
    "ChargeRequest",
    "Faults",
    "Ledger",
    "LedgerRow",
    "Outcome",
    "ProviderState",
    "RequestError",
    "create_app",
]
