"""Two nodes behind one Kamailio on two hosts (network namespaces, tests/netns.py), sharing one
PostgreSQL: a node killed -9 whole in the middle of a payment, its session taken over by the
other, the caller calling back through the front door to the survivor and hearing the outcome,
charged once; new calls meanwhile all answered by the survivor; the dead node back in the
dispatcher set (docs/cluster.md).

The run: a payment call lands on one node (whichever Kamailio picks: that node is "A"); the
provider commits it and holds its answer back; once the session shows the request sent, every
process of A's host is killed -9. B finds A silent past ``node.dead_after_s``, claims it and
settles the charge by status query (committed, never sent again), and parks the session for a
callback. Calls placed meanwhile are answered by B. The caller calls back, presses 1 and keys
its code, and the demo tells it the payment went through. A starts again and answers a call.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import (
    API_KEY,
    DEAD_AFTER_S,
    WORKERS,
    Cluster,
    caller_args,
    cluster_up,
    running_cluster,
    sessions,
)
from tests.integration.harness import Sipp, wait_for
from tests.integration.test_callback import _code_of
from tests.operability.test_status_page import chromium, table

CALLER = "+15550100123"

if shutil.which("kamailio") is None:  # pragma: no cover - CI installs it
    raise pytest.UsageError("cluster tests need Kamailio: apt-get install kamailio")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, respond_delay_s=120.0) as made:  # committed, answer held
        yield made


@pytest.mark.timeout(300)  # about 80 s: three sets of calls, a kill, a restart
def test_a_node_killed_mid_payment_is_taken_over_and_its_caller_comes_back_on_the_other(
    cluster: Cluster, tmp_path: Path
) -> None:
    door = cluster.door
    assert door is not None
    target = door.target
    gateway = cluster.net.gateway
    first = next(iter(cluster.nodes))
    payer = Sipp(
        "uac-pay-then-drop.xml", target, tmp_path / "pay", local_ip=gateway, timeout_s=60,
        extra=caller_args(tmp_path / "pay", CALLER),
    ).start()  # fmt: skip

    def paying() -> dict[str, Any] | None:
        for summary in sessions(cluster, first):
            session = cluster.session(first, summary["session_id"])
            types = [e["type"] for e in session["events"]]
            if "tool_request_sent" in types and "resume_code_issued" in types:
                return session
        return None

    session = wait_for(paying, 40, "the payment's request to be sent")
    session_id = session["session_id"]
    dead = session["node"]
    assert dead in cluster.nodes, session
    alive = cluster.other(dead)
    wait_for(lambda: cluster.provider.charges(), 10, "the provider to commit the charge")
    killed_at = time.monotonic()
    cluster.kill_host(dead)
    payer.kill()

    # The survivor finds the node dead, claims it, parks the session and settles it by status.
    def parked() -> dict[str, Any] | None:
        s = cluster.session(alive, session_id)
        settled = any(e["type"] == "tool_receipt" for e in s["events"])
        return s if settled and s["status"].startswith("signaling dropped") else None

    taken = wait_for(parked, DEAD_AFTER_S + 15, "the survivor to take the session over")
    took_s = time.monotonic() - killed_at
    types = [e["type"] for e in taken["events"]]
    (lost,) = [e for e in taken["events"] if e["type"] == "owner_lost"]
    assert lost["payload"]["park"] is True
    (receipt,) = [e["payload"] for e in taken["events"] if e["type"] == "tool_receipt"]
    assert receipt["outcome"] == "committed", types
    assert types.index("tool_receipt") > types.index("owner_lost")
    assert taken["owner"].startswith(f"{alive}.supervisor/"), taken["owner"]
    assert taken["ended"] is None

    def claimed() -> dict[str, Any] | None:
        status, view = cluster.nodes[alive].http("/v1/cluster")
        assert status == 200, view
        node = next(n for n in view["nodes"] if n["name"] == dead)
        return node if node["taken_over_by"] else None

    claim = wait_for(claimed, 5, "the registry to show the claim")  # as of the next heartbeat
    assert claim["state"] == "dead" and claim["taken_over_by"].startswith(f"{alive}/"), claim
    assert cluster.nodes[alive].metric("voicegate_sessions_taken_over_total", node=dead) == 1
    assert cluster.nodes[alive].metric("voicegate_cluster_nodes", state="dead") == 1
    # The survivor's status page shows the cluster as its registry does.
    page = f"http://{cluster.hosts[alive].address}:{cluster.nodes[alive].http_port}/status"
    dom = chromium(f"{page}#key={API_KEY}", tmp_path / "chromium", "--dump-dom")
    assert '<section id="cluster">' in dom and 'id="updated">updated ' in dom, dom[-2000:]
    shown = {row[0]: row for row in table(dom, "nodes")}
    assert shown[dead][1] == "dead" and shown[dead][5].startswith(f"{alive}/"), shown
    assert shown[alive][1] == "up", shown
    print(f"taken over {took_s:.1f} s after the kill (dead_after_s {DEAD_AFTER_S})")

    # New calls while the node is dead: every one answered, by the survivor.
    during = Sipp(
        "uac-speech-dtmf.xml", target, tmp_path / "during", calls=3, rate=2, limit=3,
        local_ip=gateway,
    )  # fmt: skip
    assert during.run() == 0, during.errors()

    # The caller calls back through the front door, presses 1 and keys the code it was read.
    code = _code_of(cluster.nodes[dead], taken)
    back = Sipp(
        "uac-callback.xml", target, tmp_path / "back", local_ip=gateway, timeout_s=60,
        extra=caller_args(tmp_path / "back", CALLER, "1" + code),
    )  # fmt: skip
    assert back.run() == 0, back.errors()
    ended = wait_for(
        lambda: (s := cluster.session(alive, session_id))["ended"] and s, 20, "the session to end"
    )
    assert ended["ended"]["terminal_state"] == "completed", ended["ended"]
    types = [e["type"] for e in ended["events"]]
    assert types.count("tool_request_sent") == 1 and "called_back" in types, types
    told = [e for e in cluster.nodes[alive].log_events() if e.get("event") == "demo.rejoined"]
    assert [e["outcome"] for e in told if e.get("call_id") == session_id] == ["committed"]
    key = receipt["key"]
    assert [r["status"] for r in cluster.provider.ledger() if r["key"] == key] == ["committed"]
    assert len(cluster.provider.charges()) == 1

    others = [s for s in sessions(cluster, alive) if s["session_id"] != session_id]
    assert len(others) == 3 and {s["node"] for s in others} == {alive}, others

    # The dead node starts again, rejoins the registry and Kamailio's set, and answers a call.
    cluster.nodes[dead].start()
    wait_for(lambda: cluster_up(cluster, alive, 2), 30, f"{dead} up again in the registry")
    wait_for(
        lambda: len(door.active() or []) == 2 * WORKERS, 30, "every worker back in Kamailio's set"
    )
    known = {s["session_id"] for s in sessions(cluster, alive)}
    again = Sipp(
        "uac-speech-dtmf.xml", target, tmp_path / "again", calls=2 * WORKERS, rate=10,
        limit=2 * WORKERS, local_ip=gateway,
    ).start()  # fmt: skip
    try:
        live = wait_for(lambda: cluster.nodes[dead].live_calls(), 20, f"a live call on {dead}")
        # Another node's call: the API answers where to ask instead of guessing.
        status, body = cluster.nodes[alive].http(f"/v1/calls/{live[0]['call_id']}")
        assert status == 409, body
        assert body["node"] == dead
        assert (
            body["api"] == f"http://{cluster.hosts[dead].address}:{cluster.nodes[dead].http_port}"
        )
        status, calls = cluster.nodes[alive].http("/v1/calls")
        assert status == 200 and (calls["scope"], calls["node"]) == ("node", alive), calls
        assert live[0]["call_id"] not in {c["call_id"] for c in calls["calls"]}
        assert again.wait() == 0, again.errors()
    finally:
        again.kill()
    new = [s for s in sessions(cluster, alive) if s["session_id"] not in known]
    assert dead in {s["node"] for s in new}, new

    def all_ended() -> list[dict[str, Any]] | None:
        found = sessions(cluster, alive)
        return found if all(s["terminal_state"] for s in found) else None

    final = wait_for(all_ended, 30, "every session of the run to end")
    print(json.dumps({s["session_id"]: s["terminal_state"] for s in final}))
