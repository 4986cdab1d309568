"""The [node] section: a node of a cluster is a pool on the shared store without a front door of
its own, whose workers the front door can reach; each mistake names its keys."""

from __future__ import annotations

import pytest

from config import ConfigError, load_settings
from config.workers import worker_slots

NODE = {
    "VOICEGATE_NODE_NAME": "hosta",
    "VOICEGATE_STORAGE_URL": "postgresql://voicegate@db.example:5432/voicegate",
    "VOICEGATE_POOL_WORKERS": "2",
    "VOICEGATE_POOL_FRONT_DOOR": "false",
    "VOICEGATE_POOL_WORKER_ADDRESS": "10.0.0.11",
}


def _error(**env: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_settings(environ={**NODE, **env})
    return str(err.value)


def test_a_node_names_its_workers_after_itself() -> None:
    settings = load_settings(environ=NODE)
    assert settings.node.name == "hosta" and settings.node.dead_after_s == 10.0
    assert [s.name for s in worker_slots(settings)] == ["hosta.0", "hosta.1"]
    assert [s.sip_uri for s in worker_slots(settings)] == [
        "sip:10.0.0.11:5100",
        "sip:10.0.0.11:5101",
    ]


def test_outside_a_cluster_nothing_changes() -> None:
    settings = load_settings(environ={"VOICEGATE_POOL_WORKERS": "2"})
    assert settings.node.name == ""
    assert [s.name for s in worker_slots(settings)] == ["worker-0.0", "worker-0.1"]


@pytest.mark.parametrize(
    ("env", "keys", "says"),
    [
        ({"VOICEGATE_STORAGE_URL": ""}, "node.name, storage.url", "PostgreSQL"),
        ({"VOICEGATE_POOL_WORKERS": "1"}, "node.name, pool.workers", "2 or more"),
        ({"VOICEGATE_POOL_FRONT_DOOR": "true"}, "node.name, pool.front_door", "front_door = false"),
        (
            {"VOICEGATE_POOL_WORKER_ADDRESS": "127.0.0.1"},
            "node.name, pool.worker_address",
            "reach",
        ),
        (
            {"VOICEGATE_NODE_HEARTBEAT_S": "5", "VOICEGATE_NODE_DEAD_AFTER_S": "10"},
            "node.heartbeat_s, node.dead_after_s",
            "3 x heartbeat_s",
        ),
    ],
)
def test_a_node_that_cannot_work_is_refused_naming_its_keys(
    env: dict[str, str], keys: str, says: str
) -> None:
    message = _error(**env)
    assert all(f"{k} = " in message for k in keys.split(", ")) and says in message, message


@pytest.mark.parametrize("name", ["a.b", "has space", "x" * 49, "a/b"])
def test_a_node_name_that_would_confuse_owner_ids_is_refused(name: str) -> None:
    message = _error(VOICEGATE_NODE_NAME=name)
    assert "node.name" in message and "letters, digits, '_' or '-'" in message, message


def test_an_api_url_must_be_http() -> None:
    assert "node.api_url" in _error(VOICEGATE_NODE_API_URL="ftp://x")
    settings = load_settings(environ={**NODE, "VOICEGATE_NODE_API_URL": "http://10.0.0.11:8080/"})
    assert settings.node.api_url == "http://10.0.0.11:8080"
