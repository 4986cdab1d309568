"""``SessionStore.list`` and ``open_sessions`` as SQL both stores run: the same filters, the
same keyset paging, the same byte-wise prefix match (``substr``, not ``LIKE``: LIKE is
case-insensitive in SQLite and treats ``%`` and ``_`` as wildcards). Only the placeholder
differs (``?`` for sqlite3, ``%s`` for psycopg)."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from session.store import SessionSummary, check_terminal_state, decode_cursor, encode_cursor

ORDER: str = "ORDER BY created_at DESC, session_id DESC"


def list_where(
    mark: str,
    *,
    terminal_state: str | None,
    open_only: bool,
    status_prefix: str | None,
    limit: int,
    cursor: str | None,
    tenant: str | None,
) -> tuple[str, builtins.list[object]]:
    """The ``WHERE ... ORDER BY ... LIMIT`` of one page (one row more than ``limit``, to know
    whether another page follows) and its parameters. Raises ValueError as the contract says."""
    check_terminal_state(terminal_state)
    if terminal_state is not None and open_only:
        raise ValueError("terminal_state and open_only exclude each other")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, not {limit}")
    where = ["1 = 1"]
    params: builtins.list[object] = []
    if terminal_state is not None:
        where.append(f"terminal_state = {mark}")
        params.append(terminal_state)
    if open_only:
        where.append("terminal_state IS NULL")
    if tenant is not None:
        where.append(f"tenant = {mark}")
        params.append(tenant)
    if status_prefix is not None:
        where.append(f"substr(status, 1, {mark}) = {mark}")
        params += [len(status_prefix), status_prefix]
    if cursor is not None:
        created_at, session_id = decode_cursor(cursor)
        where.append(f"(created_at < {mark} OR (created_at = {mark} AND session_id < {mark}))")
        params += [created_at, created_at, session_id]
    return f"WHERE {' AND '.join(where)} {ORDER} LIMIT {mark}", [*params, limit + 1]


def page(
    rows: Sequence[SessionSummary], limit: int
) -> tuple[builtins.list[SessionSummary], str | None]:
    """The page and the cursor of the next one (None on the last)."""
    found, more = builtins.list(rows[:limit]), len(rows) > limit
    return found, encode_cursor(found[-1].created_at, found[-1].session_id) if more else None


def open_where(
    mark: str, *, updated_before: float | None, owner_prefix: str | None
) -> tuple[str, builtins.list[object]]:
    """``open_sessions``: least recently updated first."""
    where = "WHERE terminal_state IS NULL"
    params: builtins.list[object] = []
    if updated_before is not None:
        where += f" AND updated_at < {mark}"
        params.append(updated_before)
    if owner_prefix is not None:
        where += f" AND substr(owner, 1, {mark}) = {mark}"
        params += [len(owner_prefix), owner_prefix]
    return f"{where} ORDER BY updated_at, session_id", params
