"""Tenants on a real server: each call goes to the tenant owning its number or trunk, runs that
tenant's agent, and its session records the tenant (docs/tenants.md). Real SIPp callers, from
127.0.0.1 and from 127.0.0.2 (a second "trunk"), to one process and through a pool's Kamailio."""

from __future__ import annotations

from pathlib import Path

from tests.integration.harness import LOOPBACK, ROOT, Server, ServerFactory, Sipp, wait_for
from tests.integration.test_pool import pool_env

TENANTS = """
[tenants.acme]
numbers = ["100"]
[tenants.acme.agent]
kind = "python"
factory = "tests.fixtures.agents:FailingAgent"

[tenants.carrier]
trunks = ["127.0.0.2/32"]

[tenants.beta]
numbers = []
"""


def call(server: Server, tmp_path: Path, number: str, source: str = LOOPBACK) -> None:
    """One SIPp caller (presses 9) to ``number``, sending from ``source`` (a loopback address)."""
    sipp = Sipp(
        "uac-server-hangup.xml",
        server.sip_target,
        tmp_path / f"{number}-{source}",
        extra=("-s", number, "-i", source),
    )
    assert sipp.run() == 0, sipp.errors()


def tenants_by_call(server: Server, count: int) -> list[tuple[str, str, str | None]]:
    """(tenant, terminal state, stage) of each session, oldest first, once ``count`` ended."""
    sessions = wait_for(
        lambda: (s := server.sessions()) and len(s) == count and all(x["ended"] for x in s) and s,
        20,
        f"{count} sessions to end",
    )
    return [(s["tenant"], s["ended"]["terminal_state"], s["ended"]["stage"]) for s in sessions]


def test_each_call_runs_its_own_tenants_agent_and_records_the_tenant(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = tmp_path / "tenants.toml"
    config.write_text(TENANTS)
    server = server_factory(VOICEGATE_CONFIG=str(config), PYTHONPATH=str(ROOT))
    # To acme's number: acme's agent, which raises on the caller's key (failed at stage agent).
    call(server, tmp_path, "100")
    # Any other number from the carrier's trunk (the packet's source) is the carrier's, and from
    # anywhere else beta's (numbers empty): the demo agent, which ends on 9 (completed).
    call(server, tmp_path, "555", source="127.0.0.2")
    call(server, tmp_path, "555")
    assert tenants_by_call(server, 3) == [
        ("acme", "failed", "agent"),
        ("carrier", "completed", None),
        ("beta", "completed", None),
    ]
    assert [s["meta"]["called_user"] for s in server.sessions()] == ["100", "555", "555"]


def test_behind_the_pools_front_door_the_trunk_is_the_callers_own_source(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = tmp_path / "tenants.toml"
    config.write_text(TENANTS)
    pool = server_factory("pool", **pool_env(2), VOICEGATE_CONFIG=str(config), PYTHONPATH=str(ROOT))
    # Every INVITE reaches a worker from Kamailio (127.0.0.1): the worker reads the caller's
    # own address from X-Voicegate-Source, which the front door sets.
    call(pool, tmp_path, "555", source="127.0.0.2")
    call(pool, tmp_path, "555")
    assert tenants_by_call(pool, 2) == [("carrier", "completed", None), ("beta", "completed", None)]
