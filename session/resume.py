"""Resume handles (ARCHITECTURE.md "Resume handles"; seed 000 step 2): sans-IO.

A resume handle lets a caller come back to their session: a call centre that took a transferred
caller sends them back with it, or the tenant's API hands it out. Seed 000: "a resume token is not
a permanent identity credential: it needs a short lifetime, scope, rotation, and server-side
verification". So a handle

- is ``vgr1.<selector>.<verifier>``: the selector (64 random bits, hex) names the stored record;
  the verifier (256 random bits from :mod:`secrets`) is stored only as its SHA-256 digest and
  checked with ``hmac.compare_digest`` (selector/verifier split: a lookup by an index never
  compares the secret part);
- is scoped to one session and one tenant, and lives ``session.resume_ttl_s``;
- is used once: a successful use rotates it (the record becomes ``used`` and a successor is
  issued), and each new handle of a session supersedes the one before. Presenting a used handle
  again is ``reused``: it may have been stolen, so it is reported and counted, and the session's
  write tools stay frozen until reconciled (the caller of :func:`verify` acts on that);
- is never logged, put in a metric label or echoed in an error (the refusal names the class).

Everything here takes ``now`` and the random bytes' source; the store keeps the records
(session/store: ``record_handle``, ``resume_handle``, ``use_handle``).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

PREFIX = "vgr1"
SELECTOR_BYTES = 8
VERIFIER_BYTES = 32  # 256 bits; the issue asks for 128 or more
_HANDLE = re.compile(r"vgr1\.([0-9a-f]{16})\.([A-Za-z0-9_-]{43})")


class RecordState(enum.StrEnum):
    CURRENT = "current"  # the session's live handle
    USED = "used"  # presented and rotated: presenting it again is a reuse
    SUPERSEDED = "superseded"  # a newer handle of the session was issued before this one was used


class ResumeResult(enum.StrEnum):
    """What presenting a handle came to; a closed vocabulary (the metric's ``result`` label)."""

    OK = "ok"
    EXPIRED = "expired"  # past its lifetime, or superseded by a newer handle unused
    INVALID = "invalid"  # malformed, unknown or forged: no record has this selector and verifier
    CROSS_TENANT = "cross_tenant"  # a real handle of another tenant's session
    REUSED = "reused"  # already used once: possibly stolen


# The reason phrase of the SIP refusal (403) and the API's error: the class, never the handle.
REFUSAL_PHRASES = {
    ResumeResult.EXPIRED: "Resume Handle Expired",
    ResumeResult.INVALID: "Resume Handle Invalid",
    ResumeResult.CROSS_TENANT: "Resume Handle Of Another Tenant",
    ResumeResult.REUSED: "Resume Handle Already Used",
}


@dataclass(frozen=True, slots=True)
class ResumeRecord:
    """What the store keeps of a handle: never the verifier itself."""

    # Neither shows in a repr: the selector is a third of the handle's text, and no fragment of
    # a handle goes into a log line or a traceback (ARCHITECTURE.md, "Resume handles").
    selector: str = field(repr=False)
    verifier_digest: str = field(repr=False)  # SHA-256 hex of the verifier
    session_id: str
    tenant: str
    issued_at: float
    expires_at: float
    state: str = RecordState.CURRENT  # one of RecordState


@dataclass(frozen=True, slots=True)
class Handle:
    """A freshly made handle: ``text`` goes to its holder once, ``record`` to the store."""

    text: str
    record: ResumeRecord

    def __repr__(self) -> str:
        # A handle in a traceback or a debug print must not show its secret.
        return f"Handle(session={self.record.session_id!r})"


def _digest(verifier: str) -> str:
    return hashlib.sha256(verifier.encode("ascii")).hexdigest()


def issue(
    session_id: str,
    tenant: str,
    *,
    now: float,
    ttl_s: float,
    token_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> Handle:
    """A new handle for ``session_id`` of ``tenant``, valid until ``now + ttl_s``."""
    if ttl_s <= 0:
        raise ValueError("ttl_s must be positive")
    selector = token_bytes(SELECTOR_BYTES).hex()
    verifier = _urlsafe(token_bytes(VERIFIER_BYTES))
    record = ResumeRecord(selector, _digest(verifier), session_id, tenant, now, now + ttl_s)
    return Handle(f"{PREFIX}.{selector}.{verifier}", record)


def _urlsafe(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def parse(text: str) -> tuple[str, str] | None:
    """(selector, verifier) of a handle as presented, or None if it is not one's shape."""
    match = _HANDLE.fullmatch(text.strip())
    return (match.group(1), match.group(2)) if match else None


def selector_of(text: str) -> str | None:
    parsed = parse(text)
    return parsed[0] if parsed else None


def verify(text: str, record: ResumeRecord | None, *, tenant: str, now: float) -> ResumeResult:
    """What presenting ``text`` for a call of ``tenant`` at ``now`` comes to, given the stored
    record of its selector (None if there is none). Pure: the caller rotates on ``ok``
    (``store.use_handle``, which may still find it used by a racing call: ``reused``).

    The checks run in this order, so that a refusal says no more than the presenter could
    already know: a handle that does not verify is ``invalid`` whatever else; a real one of
    another tenant is ``cross_tenant`` without a word about its session's state; then its
    lifetime, then whether it was used before.
    """
    parsed = parse(text)
    if parsed is None or record is None or parsed[0] != record.selector:
        return ResumeResult.INVALID
    if not hmac.compare_digest(_digest(parsed[1]).encode(), record.verifier_digest.encode()):
        return ResumeResult.INVALID
    if record.tenant != tenant:
        return ResumeResult.CROSS_TENANT
    if now >= record.expires_at or record.state == RecordState.SUPERSEDED:
        return ResumeResult.EXPIRED
    if record.state == RecordState.USED:
        return ResumeResult.REUSED
    return ResumeResult.OK
