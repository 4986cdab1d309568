"""``python -m providers.payments``: run the reference payment provider until SIGTERM/SIGINT.

Prints exactly one line to stdout, ``payments: listening on http://HOST:PORT``, once the socket is
bound (``--port 0`` picks a free port and prints it); logs go to stderr as one JSON object per
line. Every flag also reads a ``PAYMENTS_*`` environment variable; a flag given wins.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from aiohttp import web

from providers.payments.app import create_app
from providers.payments.contract import RequestError
from providers.payments.faults import Faults

SHUTDOWN_TIMEOUT_S: Final = 5.0
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message"}


class JsonLines(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, then the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(
            (k, v) for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")
        )
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"PAYMENTS_{name}", default)


def _env_flag(name: str) -> bool:
    return (_env(name) or "").strip().lower() in _TRUE


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m providers.payments",
        description="Reference payment provider for voicegate (idempotent charges, receipts).",
    )
    parser.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="[PAYMENTS_HOST]")
    parser.add_argument(
        "--port", type=int, default=_env("PORT", "8090"), help="0 picks a free port [PAYMENTS_PORT]"
    )
    parser.add_argument(
        "--db",
        type=Path,
        default=_env("DB"),
        required=_env("DB") is None,
        help="SQLite ledger file, created if missing [PAYMENTS_DB]",
    )
    parser.add_argument(
        "--admin",
        action="store_true",
        default=_env_flag("ADMIN"),
        help="serve GET/POST /admin/faults [PAYMENTS_ADMIN]",
    )
    parser.add_argument(
        "--charge-delay",
        type=float,
        default=_env("CHARGE_DELAY_S", "0"),
        metavar="S",
        help="sleep S seconds before committing [PAYMENTS_CHARGE_DELAY_S]",
    )
    parser.add_argument(
        "--respond-delay",
        type=float,
        default=_env("RESPOND_DELAY_S", "0"),
        metavar="S",
        help="commit, then sleep S seconds before answering [PAYMENTS_RESPOND_DELAY_S]",
    )
    parser.add_argument(
        "--status-unknown",
        action="store_true",
        default=_env_flag("STATUS_UNKNOWN"),
        help="the status endpoint answers unknown [PAYMENTS_STATUS_UNKNOWN]",
    )
    parser.add_argument(
        "--fail-status",
        type=int,
        default=_env("FAIL_STATUS"),
        metavar="N",
        help="answer charges with HTTP N (500..599), writing nothing [PAYMENTS_FAIL_STATUS]",
    )
    parser.add_argument(
        "--fail-count",
        type=int,
        default=_env("FAIL_COUNT", "1"),
        metavar="N",
        help="how many charges --fail-status applies to (default 1) [PAYMENTS_FAIL_COUNT]",
    )
    parser.add_argument(
        "--log-level", default=_env("LOG_LEVEL", "INFO"), help="[PAYMENTS_LOG_LEVEL]"
    )
    return parser.parse_args(argv)


def _faults(args: argparse.Namespace) -> Faults:
    return Faults(
        charge_delay_s=args.charge_delay,
        respond_delay_s=args.respond_delay,
        fail_status=args.fail_status,
        fail_count=args.fail_count if args.fail_status is not None else 0,
        status_unknown=args.status_unknown,
    )


async def serve(args: argparse.Namespace, faults: Faults) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting and let requests finish (bounded)."""
    app = create_app(args.db, faults=faults, admin=args.admin)
    runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_TIMEOUT_S, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        log = logging.getLogger("providers.payments")
        log.info("payments.listening", extra={"host": host, "port": port, "db": str(args.db)})
        print(f"payments: listening on http://{shown}:{port}", flush=True)
        await stop.wait()
        log.info("payments.stopping")
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        faults = _faults(args)
    except RequestError as error:
        print(f"payments: bad fault setting: {error}", file=sys.stderr)
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    asyncio.run(serve(args, faults))
    return 0


if __name__ == "__main__":
    sys.exit(main())
