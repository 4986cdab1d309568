"""``voicegate serve`` and ``voicegate check-config``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from config import ConfigError, Settings, load_settings
from telephony.endpoint import TelephonyStartError
from voicegate.http_api import make_app
from voicegate.logs import setup_logging
from voicegate.runtime import Runtime

log = logging.getLogger("voicegate")

EXIT_CONFIG = 2
EXIT_START = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voicegate", description="SIP voice-agent server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="answer calls (embedded defaults without --config)")
    serve.add_argument("--config", metavar="FILE", help="TOML settings file")
    check = sub.add_parser("check-config", help="validate settings without starting")
    check.add_argument("file", nargs="?", metavar="FILE", help="TOML settings file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    path = args.config if args.command == "serve" else args.file
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        print(f"voicegate: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "check-config":
        print(f"voicegate: config OK ({path or 'embedded defaults'})")
        return 0
    setup_logging(settings.log.level, settings.log.format)
    try:
        return asyncio.run(serve(settings))
    except TelephonyStartError as exc:
        log.error("startup.failed", extra={"error": str(exc)})
        print(f"voicegate: cannot start SIP: {exc}", file=sys.stderr)
        return EXIT_START
    except OSError as exc:
        log.error("startup.failed", extra={"error": str(exc)})
        print(f"voicegate: cannot start: {exc}", file=sys.stderr)
        return EXIT_START


async def serve(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runtime = Runtime(settings)
    app_runner = web.AppRunner(make_app(runtime), access_log=None)
    await app_runner.setup()
    try:
        site = web.TCPSite(app_runner, settings.http.address, settings.http.port)
        await site.start()
        await runtime.start()
        log.info(
            "serve.started",
            extra={
                "sip": f"{settings.sip.address}:{settings.sip.port}",
                "http": f"{settings.http.address}:{settings.http.port}",
                "data_dir": str(settings.storage.data_dir),
                "agent": settings.agent.kind,
            },
        )
        await stop.wait()
        log.info("serve.signal")
    finally:
        await runtime.shutdown()
        await app_runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
