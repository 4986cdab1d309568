"""The agent under test and the proxy in front of it.

By default the kit tests the example agent (examples/remote_agent/, started here). Point it at
your own agent with ``CONFORMANCE_AGENT_URL`` and ``CONFORMANCE_AGENT_SECRET`` (or
``python -m tests.conformance --agent-url ... --secret ...``): the kit then only dials it. A
``wss://`` agent is checked against the system's CAs, or ``CONFORMANCE_AGENT_CA_FILE``'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agents.remote.dial import tls_context
from tests.conformance.proxy import ChaosProxy
from tests.integration.conftest import server_factory  # noqa: F401 (a fixture the kit uses)
from tests.integration.harness import free_port
from tests.integration.test_remote_agents import SECRET, ExampleAgent


@dataclass(frozen=True, slots=True)
class AgentUnderTest:
    url: str
    secret: str = field(repr=False)  # never in pytest's output
    tools: bool  # it calls the charge tool when the caller presses 1 (as the example does)


@pytest.fixture
def agent_under_test(tmp_path: Path) -> Iterator[AgentUnderTest]:
    url = os.environ.get("CONFORMANCE_AGENT_URL")
    if url:
        yield AgentUnderTest(
            url,
            os.environ["CONFORMANCE_AGENT_SECRET"],
            os.environ.get("CONFORMANCE_AGENT_TOOLS", "1") == "1",
        )
        return
    example = ExampleAgent(tmp_path / "agent").start()
    try:
        yield AgentUnderTest(example.url, SECRET, tools=True)
    finally:
        example.stop()


@pytest.fixture
def proxy(agent_under_test: AgentUnderTest) -> Iterator[ChaosProxy]:
    ca_file = os.environ.get("CONFORMANCE_AGENT_CA_FILE")
    tls = tls_context(Path(ca_file)) if ca_file else None
    chaos = ChaosProxy(
        agent_under_test.url,
        agent_under_test.secret,
        free_port(udp_and_tcp=False),
        tls=tls if tls is not None else True,
    ).start()
    try:
        yield chaos
    finally:
        chaos.stop()


def voicegate_env(proxy: ChaosProxy, deadline_s: float = 3.0, **more: str) -> dict[str, str]:
    """voicegate's settings to reach the agent through the proxy."""
    return {
        "VOICEGATE_AGENT_KIND": "remote",
        "VOICEGATE_AGENT_URL": proxy.url,
        "VOICEGATE_AGENT_SECRET": proxy.secret,
        "VOICEGATE_AGENT_RECONNECT_DEADLINE_S": str(deadline_s),
        **more,
    }
