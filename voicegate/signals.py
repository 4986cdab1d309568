"""How a voicegate process is asked to stop: a first SIGTERM or SIGINT drains, a second hurries."""

from __future__ import annotations

import asyncio
import signal


def stop_signals() -> tuple[asyncio.Event, asyncio.Event]:
    """SIGTERM or SIGINT sets the first event (drain, then stop); a second one sets the other
    (stop draining now)."""
    loop = asyncio.get_running_loop()
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    return stop, hurry
