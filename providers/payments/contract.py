"""The charge request and its answers: validation, canonical form, the decision. Pure, no I/O.

Everything here is what a caller may rely on; the HTTP layer (``app.py``) only moves these values
on and off the wire, and the ledger (``ledger.py``) only stores them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Final

CURRENCIES: Final = ("EUR", "GBP", "USD")
MAX_AMOUNT_CENTS: Final = 10_000_000
MAX_KEY_LEN: Final = 200
MAX_ACCOUNT_LEN: Final = 64
MAX_REFERENCE_LEN: Final = 200
KEY_HEADER: Final = "Idempotency-Key"
REPLAYED_HEADER: Final = "Idempotent-Replayed"

# The whole risk engine of the reference provider: these account ids are refused (HTTP 402).
REFUSALS: Final = {"blocked": "account_blocked", "insufficient": "insufficient_funds"}

_FIELDS: Final = frozenset({"amount_cents", "currency", "account", "reference"})


class Outcome(StrEnum):
    """What the status endpoint can say about a key (the receipt outcomes of seed 000)."""

    COMMITTED = "committed"  # the charge is in the ledger: money moved
    FAILED = "failed"  # refused by the provider, recorded: money did not move, never will
    NOT_STARTED = "not_started"  # never received; the key is now fenced, it never will start
    UNKNOWN = "unknown"  # the provider cannot say (in progress, or the status fault is on)


class RequestError(Exception):
    """The caller sent something malformed: HTTP 400 ``{"error", "field"}``, nothing written."""

    status: Final = 400

    def __init__(self, field: str, error: str) -> None:
        super().__init__(f"{field}: {error}")
        self.field = field
        self.error = error

    def body(self) -> dict[str, object]:
        return {"error": self.error, "field": self.field}


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, no NaN: equal values give equal text (and equal digests)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def parse_key(value: str | None, field: str = KEY_HEADER) -> str:
    """An idempotency key: 1..200 visible ASCII characters (RFC 9110 VCHAR, 0x21-0x7E).

    Spaces are refused because header values lose surrounding whitespace in transit, so a key
    with spaces could not be sent back byte for byte; in a URL path the key is percent-encoded.
    """
    if value is None:
        raise RequestError(field, "missing idempotency key")
    if not 1 <= len(value) <= MAX_KEY_LEN:
        raise RequestError(field, f"idempotency key must be 1..{MAX_KEY_LEN} characters")
    if not all("\x21" <= ch <= "\x7e" for ch in value):
        raise RequestError(field, "idempotency key must be visible ASCII (0x21-0x7E)")
    return value


@dataclass(frozen=True, slots=True)
class ChargeRequest:
    """A validated charge. Its canonical JSON decides "same request" for an idempotency key."""

    amount_cents: int
    currency: str
    account: str
    reference: str | None = None

    def canonical(self) -> str:
        return canonical_json(asdict(self))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()


def parse_charge(raw: bytes) -> ChargeRequest:
    """Validate a request body; the first problem found is raised as a RequestError.

    ``reference`` may be absent or null (the same request); unknown fields are refused so that
    two bodies the provider treats alike always have the same canonical form.
    """
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RequestError("body", "body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError("body", "body must be a JSON object")
    if unknown := sorted(set(body) - _FIELDS):
        raise RequestError(unknown[0], "unknown field")
    amount = body.get("amount_cents")
    # bool is an int in Python but not an amount.
    if not isinstance(amount, int) or isinstance(amount, bool):
        raise RequestError("amount_cents", "amount_cents must be an integer")
    if not 0 < amount <= MAX_AMOUNT_CENTS:
        raise RequestError("amount_cents", f"amount_cents must be 1..{MAX_AMOUNT_CENTS}")
    currency = body.get("currency")
    if not isinstance(currency, str) or currency not in CURRENCIES:
        raise RequestError("currency", f"currency must be one of {', '.join(CURRENCIES)}")
    account = body.get("account")
    if not isinstance(account, str) or not 1 <= len(account) <= MAX_ACCOUNT_LEN:
        raise RequestError("account", f"account must be a string of 1..{MAX_ACCOUNT_LEN}")
    if not account.isprintable():
        raise RequestError("account", "account must be printable")
    reference = body.get("reference")
    if reference is not None and (
        not isinstance(reference, str) or len(reference) > MAX_REFERENCE_LEN
    ):
        raise RequestError("reference", f"reference must be a string of 0..{MAX_REFERENCE_LEN}")
    if reference is not None and not reference.isprintable():
        # Also refuses lone surrogates, which JSON allows but UTF-8 cannot store.
        raise RequestError("reference", "reference must be printable (one line)")
    return ChargeRequest(amount, currency, account, reference)


def refusal(request: ChargeRequest) -> str | None:
    """The reason this charge is refused (HTTP 402), or None when it is to be committed."""
    return REFUSALS.get(request.account)


def committed_body(key: str, charge_id: str, request: ChargeRequest) -> dict[str, object]:
    return {
        "status": Outcome.COMMITTED.value,
        "charge_id": charge_id,
        "amount_cents": request.amount_cents,
        "currency": request.currency,
        "key": key,
    }


def failed_body(key: str, reason: str, request: ChargeRequest) -> dict[str, object]:
    return {
        "status": Outcome.FAILED.value,
        "reason": reason,
        "amount_cents": request.amount_cents,
        "currency": request.currency,
        "key": key,
    }
