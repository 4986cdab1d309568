"""Tenants on a real server: each call goes to the tenant owning its number, runs that tenant's
agent, and its session records the tenant (docs/tenants.md). Real SIPp callers."""

from __future__ import annotations

from pathlib import Path

from tests.integration.harness import ROOT, ServerFactory, Sipp, wait_for

TENANTS = """
[tenants.acme]
numbers = ["100"]
[tenants.acme.agent]
kind = "python"
factory = "tests.fixtures.agents:FailingAgent"

[tenants.beta]
numbers = []
"""


def test_each_call_runs_its_own_tenants_agent_and_records_the_tenant(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = tmp_path / "tenants.toml"
    config.write_text(TENANTS)
    server = server_factory(VOICEGATE_CONFIG=str(config), PYTHONPATH=str(ROOT))
    # To acme's number: acme's agent, which raises on the caller's key (failed at stage agent).
    acme = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "acme", extra=("-s", "100"))
    assert acme.run() == 0, acme.errors()
    # Any other number is beta's (numbers empty): the demo agent, which ends on 9 (completed).
    beta = Sipp("uac-server-hangup.xml", server.sip_target, tmp_path / "beta", extra=("-s", "555"))
    assert beta.run() == 0, beta.errors()
    sessions = wait_for(
        lambda: (s := server.sessions()) and all(x["ended"] for x in s) and len(s) == 2 and s,
        15,
        "both sessions to end",
    )
    outcome = {s["tenant"]: (s["ended"]["terminal_state"], s["ended"]["stage"]) for s in sessions}
    assert outcome == {"acme": ("failed", "agent"), "beta": ("completed", None)}
    assert {s["meta"]["called_user"]: s["tenant"] for s in sessions} == {
        "100": "acme",
        "555": "beta",
    }
