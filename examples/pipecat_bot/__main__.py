"""Run the example bot: ``python -m examples.pipecat_bot --port 8766`` (README.md)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import ssl
import sys

from loguru import logger

from examples.pipecat_bot.bot import run_bot
from integrations.pipecat import VoicegateServer


def main() -> None:
    parser = argparse.ArgumentParser(description="The voicegate Pipecat example bot")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--cert", help="PEM certificate chain (with --key): serve wss://")
    parser.add_argument("--key", help="PEM private key of --cert")
    parser.add_argument(
        "--tts-pace",
        type=float,
        default=None,
        help="stream the TTS no faster than this times real time (a slow TTS, to see a "
        "barge-in cut a turn the TTS is still making)",
    )
    parser.add_argument(
        "--pipecat-log",
        default="WARNING",
        help="pipecat's own log level (its DEBUG lines carry what the caller said: keep it "
        "off a production log)",
    )
    args = parser.parse_args()
    tls = None
    if args.cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.cert, args.key)
    logger.remove()
    logger.add(sys.stderr, level=args.pipecat_log)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    secret = os.environ["PIPECAT_BOT_SECRET"]  # the same value as voicegate's agent.secret
    scheme = "wss" if tls else "ws"
    url = os.environ.get("PIPECAT_BOT_URL", f"{scheme}://{args.host}:{args.port}/agent")
    server = VoicegateServer(
        functools.partial(run_bot, tts_pace=args.tts_pace), secret=secret, url=url
    )
    ready = functools.partial(print, f"listening on {args.host}:{args.port}", flush=True)
    asyncio.run(server.run(args.host, args.port, tls, ready=ready))


if __name__ == "__main__":
    main()
