"""agents.loading: a factory named by agent.factory is found, checked, and refused with a message
naming the key and the fix; the server refuses to start on one (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.base import Agent
from agents.loading import AgentLoadError, load_factory
from tests.fixtures.agents import StreamingAgent, make_streaming_agent

ROOT = Path(__file__).resolve().parents[2]


def test_a_class_or_a_function_is_a_factory() -> None:
    assert load_factory("tests.fixtures.agents:StreamingAgent") is StreamingAgent
    assert load_factory("tests.fixtures.agents:make_streaming_agent") is make_streaming_agent
    assert issubclass(load_factory("agents.demo:DemoAgent"), Agent)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("no_such_package.agent:Agent", "no module named 'no_such_package'"),
        ("tests.fixtures.no_such_module:Agent", "no module named 'tests.fixtures.no_such_module'"),
        ("tests.fixtures.agents:Missing", "has no attribute 'Missing'"),
        ("tests.fixtures.agents:NOT_CALLABLE", "int is not callable"),
        ("tests.fixtures.agents:NotAnAgent", "not an agents.base.Agent subclass"),
        ("tests.fixtures.agents:wrong_signature", "must accept (context, call)"),
        ("tests.fixtures.agents", 'expected "package.module:name"'),
    ],
)
def test_an_unusable_factory_is_refused_naming_the_key(path: str, says: str) -> None:
    with pytest.raises(AgentLoadError) as refused:
        load_factory(path)
    message = str(refused.value)
    assert message.startswith(f'agent.factory = "{path}"')
    assert says in message


def test_a_module_whose_own_import_fails_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_agent.py").write_text("import not_installed_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AgentLoadError, match="needs the module 'not_installed_dependency'"):
        load_factory("broken_agent:Agent")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"VOICEGATE_AGENT_KIND": "python"}, 'kind = "python" needs a factory'),
        (
            {
                "VOICEGATE_AGENT_KIND": "python",
                "VOICEGATE_AGENT_FACTORY": "tests.fixtures.agents:NotAnAgent",
            },
            "agent.factory",
        ),
        ({"VOICEGATE_AGENT_FACTORY": "tests.fixtures.agents:StreamingAgent"}, "used only with"),
        (
            {
                "VOICEGATE_AGENT_KIND": "remote",
                "VOICEGATE_AGENT_SECRET": "s" * 20,
                "VOICEGATE_AGENT_URL": "ws://127.0.0.1:9/agent",
                "VOICEGATE_AGENT_CA_FILE": str(ROOT / "pyproject.toml"),
            },
            "ca_file is used only with a wss:// url",
        ),
        (
            {
                "VOICEGATE_AGENT_KIND": "remote",
                "VOICEGATE_AGENT_SECRET": "s" * 20,
                "VOICEGATE_AGENT_URL": "wss://127.0.0.1:9/agent",
                "VOICEGATE_AGENT_CA_FILE": str(ROOT / "pyproject.toml"),
            },
            "not a readable PEM file of CA certificates",
        ),
    ],
)
def test_the_server_refuses_to_start_on_an_unusable_agent(env: dict[str, str], says: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "voicegate", "check-config"],
        env={**clean, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert done.stderr.count("\n") == 1  # one line an operator can read


def test_a_usable_agent_passes_the_check() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "voicegate", "check-config"],
        env={
            **clean,
            "VOICEGATE_AGENT_KIND": "python",
            "VOICEGATE_AGENT_FACTORY": "tests.fixtures.agents:StreamingAgent",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
