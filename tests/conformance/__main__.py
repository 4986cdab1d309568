"""Run the conformance kit against your own remote agent.

    CONFORMANCE_AGENT_SECRET=... python -m tests.conformance --agent-url ws://127.0.0.1:9000/agent

The kit starts voicegate (a real server), SIPp callers and its chaos proxy; your agent must be
running and accept tokens signed with ``--secret`` for ``--agent-url`` (the proxy re-signs
voicegate's token for your URL). Without ``--agent-url`` it tests examples/remote_agent. What it
checks, and what your agent must do for it, is at the top of tests/conformance/test_conformance.py
and in docs/agent-protocol.md ("Conformance kit"). Exit status: pytest's (0: all passed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument("--agent-url", help="your agent's ws:// or wss:// URL (default: example)")
    parser.add_argument(
        "--secret",
        default=os.environ.get("CONFORMANCE_AGENT_SECRET"),
        help="the secret your agent checks tokens with (default: $CONFORMANCE_AGENT_SECRET, which "
        "keeps it out of the process list)",
    )
    parser.add_argument("--ca-file", help="for a wss:// agent: a PEM of the CAs to trust")
    parser.add_argument(
        "--no-tools",
        action="store_true",
        help="your agent makes no tool call on key 1: skip the mid-tool-call check",
    )
    # Anything else goes to pytest (e.g. -k budget, -x).
    args, pytest_args = parser.parse_known_args(argv)
    if args.agent_url:
        if not args.secret:
            parser.error("--agent-url needs --secret")
        os.environ["CONFORMANCE_AGENT_URL"] = args.agent_url
        os.environ["CONFORMANCE_AGENT_SECRET"] = args.secret
        os.environ["CONFORMANCE_AGENT_TOOLS"] = "0" if args.no_tools else "1"
        if args.ca_file:
            os.environ["CONFORMANCE_AGENT_CA_FILE"] = args.ca_file
    here = Path(__file__).resolve().parent
    return int(pytest.main([str(here), "-v", "-p", "no:cacheprovider", *pytest_args]))


if __name__ == "__main__":
    sys.exit(main())
