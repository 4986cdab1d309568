"""What a test reads of a resume handle a call centre received on the wire."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from session.state import AWAY_STATUS
from session.store.sqlite import SqliteSessionStore
from tests.integration.harness import Server, wait_for
from tests.secret_audit import AUDIT


def check_sent_handle(server: Server, sipp_log: Path, session_id: str, what: str) -> None:
    """The one X-Voicegate-Resume in SIPp's ``-log_file`` is the session's current handle in the
    store, kept there as a digest only (docs/tenants.md: a new handle on every transfer). The
    handle is registered with the secret audit, so no output of the run may show it."""
    (handle,) = re.findall(r"X-Voicegate-Resume: (\S+)", sipp_log.read_text())
    AUDIT.register(handle, what, "tests/integration")
    _prefix, selector, verifier = handle.split(".")
    store = SqliteSessionStore(server.data_dir / "voicegate.sqlite3")
    try:
        record = store.resume_handle(selector)
    finally:
        store.close()
    assert record is not None
    assert record.verifier_digest == hashlib.sha256(verifier.encode()).hexdigest()
    assert (record.session_id, record.tenant, record.state) == (session_id, "default", "current")


def away_session(server: Server, session_id: str | None = None) -> dict[str, Any]:
    """The session (the only one, or ``session_id``) once it is away: transferred out, our leg
    hung up, not ended while its handle may bring the caller back (session/away.py)."""

    def away() -> list[dict[str, Any]]:
        return [
            s
            for s in server.sessions()
            if (session_id is None or s["session_id"] == session_id)
            and s["status"].startswith(AWAY_STATUS)
        ]

    (session,) = wait_for(away, 15, "the session to be away")
    assert session["ended"] is None
    return session
