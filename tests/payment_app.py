"""The reference payment provider's app for tests that serve it on their own event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from providers.payments import create_app


async def payment_app(db: Path, *, admin: bool = False) -> web.Application:
    """The app, built off the loop: opening the ledger creates the SQLite file and fsyncs it,
    which a busy CI disk stretched to 60 ms (34 waits) on the loop that then served the test."""
    return await asyncio.to_thread(create_app, db, admin=admin)
