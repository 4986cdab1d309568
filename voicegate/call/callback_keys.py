"""The keyed digests a callback is matched and checked with (session/callback.py).

A caller who calls back is matched by number and tenant, but the store never keeps the number:
phone numbers are few and guessable, so a plain SHA-256 of one is reversed by trying them all.
Both digests here are HMAC-SHA256 under a per-installation secret (32 bytes from ``secrets``)
kept in the data directory (``callback.key``, mode 0600, created on first use by whichever
worker gets there first; the workers of a pool share the directory as they share the store).
Without that file a digest in the store says nothing about the number or the code behind it.

The short resume code the agent reads out when a write starts is kept the same way, scoped to
its session (the session id is part of what is hashed), and compared in constant time.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import secrets
from hashlib import sha256
from pathlib import Path

KEY_FILE = "callback.key"
KEY_BYTES = 32
# Six digits: three attempts guess one in 333,333; short enough to read out and key in.
CODE_DIGITS = 6
MAX_CODE_ATTEMPTS = 3

_USER = re.compile(r"(?:sips?|tel):([^@;>\s]*)")


def caller_number(remote_uri: str) -> str:
    """The number a caller called from (a SIP URI's user part, a ``tel:`` number): its digits,
    with a leading ``+`` kept; "" when the From carries no number (anonymous: no callback)."""
    found = _USER.search(remote_uri.rpartition("<")[2] or remote_uri)
    user = found.group(1) if found else ""
    digits = "".join(c for c in user if c.isdigit())
    if not digits:
        return ""
    return ("+" if user.lstrip().startswith("+") else "") + digits


def new_code() -> str:
    """A fresh resume code: ``CODE_DIGITS`` decimal digits from ``secrets``."""
    return "".join(secrets.choice("0123456789") for _ in range(CODE_DIGITS))


class CallbackKeys:
    """The installation's secret and the two digests made with it. Never logs or shows it."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < KEY_BYTES:
            raise ValueError(f"a callback key needs {KEY_BYTES} bytes")
        self._secret = secret

    @classmethod
    def in_directory(cls, data_dir: Path) -> CallbackKeys:
        """The key of the installation whose data directory is ``data_dir``, made on first use.

        Of several workers starting at once, each writes a whole key to a file of its own and
        links it into place; the first link wins and the others read that one. The key file is
        never seen half-written (creating it and then writing it was: a worker read it empty
        and refused to start)."""
        path = data_dir / KEY_FILE
        if not path.exists():
            draft = data_dir / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(secrets.token_bytes(KEY_BYTES))
                    out.flush()
                    os.fsync(out.fileno())
                # link(2) creates the name only if it does not exist, atomically.
                with contextlib.suppress(FileExistsError):
                    os.link(draft, path)
            finally:
                draft.unlink()
        secret = path.read_bytes()
        if len(secret) < KEY_BYTES:
            # Truncated by something else (a full disk, a hand edit): refuse clearly.
            raise ValueError(f"{path} holds {len(secret)} bytes, not {KEY_BYTES}: remove it")
        return cls(secret)

    def caller(self, tenant: str, number: str) -> str:
        """The digest a session keeps of its caller's number, for matching a callback."""
        return self._mac(b"caller", tenant, number)

    def code(self, session_id: str, code: str) -> str:
        """The digest a session keeps of its resume code."""
        return self._mac(b"code", session_id, code)

    def code_matches(self, session_id: str, code: str, digest: str) -> bool:
        return bool(digest) and hmac.compare_digest(self.code(session_id, code), digest)

    def _mac(self, kind: bytes, scope: str, value: str) -> str:
        message = b"\0".join((kind, scope.encode(), value.encode()))
        return hmac.new(self._secret, message, sha256).hexdigest()

    def __repr__(self) -> str:
        return "CallbackKeys(<secret>)"
