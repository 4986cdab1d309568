"""Two voicegate nodes on two hosts (network namespaces, tests/netns.py) behind one Kamailio,
sharing one PostgreSQL on the gateway, with the reference payment provider: what the cluster test
and bench/cluster_chaos.py run (docs/cluster.md).

Kamailio is configured as an operator would: ``voicegate front-door-config --from-store`` reads
the node registry once both nodes are up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from tests.integration.harness import ROOT, Provider, Server, wait_for
from tests.netns import Host, Network, available, network
from tests.pg_cluster import PgCluster
from tests.secret_audit import AUDIT
from voicegate.call.callback_keys import KEY_BYTES, KEY_FILE

API_KEY = "cluster-test-key-" + "k" * 16
DEAD_AFTER_S = 5.0  # well above a heartbeat missed on a loaded CI machine
HEARTBEAT_S = 0.5
WORKERS = 2
SIP_PORT = 5060  # the front door's, on the gateway, unless something holds it there
WORKER_SIP_PORT = 5100  # each host's own: the hosts are separate network namespaces
WORKER_HTTP_PORT = 8100


def node_env(
    name: str,
    host: Host,
    store_url: str,
    provider: Provider,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A node's settings; ``extra`` last, over them (a bench's own, e.g. a short callback
    window)."""
    digest = hashlib.sha256(API_KEY.encode()).hexdigest()
    return {
        **provider.tool_env(timeout_s=100.0),
        "VOICEGATE_NODE_NAME": name,
        "VOICEGATE_NODE_HEARTBEAT_S": str(HEARTBEAT_S),
        "VOICEGATE_NODE_DEAD_AFTER_S": str(DEAD_AFTER_S),
        "VOICEGATE_STORAGE_URL": store_url,
        "VOICEGATE_POOL_WORKERS": str(WORKERS),
        "VOICEGATE_POOL_FRONT_DOOR": "false",
        "VOICEGATE_POOL_WORKER_ADDRESS": host.address,
        "VOICEGATE_POOL_WORKER_SIP_PORT": str(WORKER_SIP_PORT),
        "VOICEGATE_POOL_WORKER_HTTP_PORT": str(WORKER_HTTP_PORT),
        "VOICEGATE_POOL_HEALTH_INTERVAL_S": "0.5",
        "VOICEGATE_POOL_HEALTH_TIMEOUT_S": "2",
        "VOICEGATE_SIP_ADDRESS": host.address,
        "VOICEGATE_MEDIA_ADDRESS": host.address,
        "VOICEGATE_HTTP_ADDRESS": host.address,
        "VOICEGATE_HTTP_API_KEYS": digest,
        "VOICEGATE_HTTP_METRICS_KEYS": digest,
        "VOICEGATE_SESSION_CALLBACK_WINDOW_S": "120",
        "VOICEGATE_MEDIA_RTP_PORT_MIN": "20000",
        "VOICEGATE_MEDIA_RTP_PORT_MAX": "20079",
        **(extra or {}),
    }


class FrontDoor:
    """The cluster's Kamailio on the gateway, configured by ``voicegate front-door-config
    --from-store`` from the node registry; ``env``: settings over its own (e.g.
    VOICEGATE_POOL_SOURCE_MAX_RATE for a load from one source)."""

    def __init__(
        self, work: Path, gateway: str, store_url: str, env: Mapping[str, str] | None = None
    ) -> None:
        self.run_dir = work
        self.gateway = gateway
        self.store_url = store_url
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.port = SIP_PORT

    @property
    def target(self) -> str:
        """Where callers dial the cluster: Kamailio's SIP address."""
        return f"{self.gateway}:{self.port}"

    def start(self) -> FrontDoor:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # A Kamailio another run left behind may still hold the port on an address this
        # network reuses (a bound socket outlives its address): take another then.
        self.port = _free_sip_port(self.gateway, SIP_PORT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")}
        env |= {
            "VOICEGATE_SIP_ADDRESS": self.gateway,
            "VOICEGATE_SIP_PORT": str(self.port),
            "VOICEGATE_POOL_PROBE_INTERVAL_S": "1",
            "VOICEGATE_STORAGE_URL": self.store_url,
            "VOICEGATE_STORAGE_DATA_DIR": str(self.run_dir / "data"),
            **self.env,
        }
        made = subprocess.run(
            [
                sys.executable, "-m", "voicegate", "front-door-config", "--from-store",
                "--run-dir", str(self.run_dir), "--out", str(self.run_dir),
            ],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        self.log_path = self.run_dir / "kamailio.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    "kamailio", "-f", str(self.run_dir / "kamailio.cfg"), "-Y", str(self.run_dir),
                    "-DD", "-E", "-m", "64", "-M", "8",
                ],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_for(lambda: self.active() is not None, 20, f"Kamailio's ctl socket ({self.log()})")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def active(self) -> list[str] | None:
        """The destinations in the dispatcher set now (Kamailio's probes decide), or None
        before its ctl socket answers."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"Kamailio exited {self.process.returncode}:\n{self.log()}")
        listed = subprocess.run(
            ["kamcmd", "-s", f"unix:{self.run_dir / 'kamailio-ctl.sock'}", "dispatcher.list"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if listed.returncode != 0:
            return None
        found, uri = [], ""
        for line in listed.stdout.splitlines():
            text = line.strip()
            if text.startswith("URI:"):
                uri = text.split(":", 1)[1].strip()
            elif text.startswith("FLAGS:") and text.split(":", 1)[1].strip().startswith("A"):
                found.append(uri)
        return found

    def stop(self) -> None:
        """Kamailio and every child it forked: the children hold the gateway's SIP port, and a
        child outliving its main process would keep it from the next network with this
        subnet ("Address already in use")."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _free_sip_port(address: str, preferred: int) -> int:
    """``preferred`` if both UDP and TCP may bind it on ``address``, else a port that may."""
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            try:
                tcp.bind((address, port))
            except OSError:
                continue
            chosen = int(tcp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((address, chosen))
                except OSError:
                    continue
            return chosen
    raise AssertionError(f"no SIP port free on {address} for the front door")


class Cluster:
    def __init__(
        self,
        net: Network,
        work: Path,
        store_url: str,
        provider: Provider,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.net = net
        self.provider = provider
        self.store_url = store_url
        self.pg: PgCluster | None = None  # the shared PostgreSQL (running_cluster sets it)
        key = secrets.token_bytes(KEY_BYTES)  # one installation: one callback key on every node
        self.nodes: dict[str, Server] = {}
        for name, host in zip(("n1", "n2"), net.hosts, strict=True):
            data_dir = work / name
            data_dir.mkdir(parents=True)
            (data_dir / KEY_FILE).write_bytes(key)
            (data_dir / KEY_FILE).chmod(0o600)
            self.nodes[name] = Server(
                data_dir,
                env_overrides=node_env(name, host, store_url, provider, env),
                api_key=API_KEY,
                host=host.address,
                argv_prefix=tuple(host.argv()),
            )
        self.hosts = dict(zip(self.nodes, net.hosts, strict=True))
        self.door: FrontDoor | None = None

    def other(self, name: str) -> str:
        return next(n for n in self.nodes if n != name)

    def kill_host(self, name: str) -> None:
        """Every process of the node's host, -9: its supervisor and every worker at once."""
        host = self.hosts[name]
        pids = subprocess.run(
            ["ip", "netns", "pids", host.name], capture_output=True, text=True, check=True
        ).stdout.split()
        assert pids, f"nothing runs on {host.name}"
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        server = self.nodes[name]
        assert server.process is not None
        assert server.process.wait(timeout=10) == -signal.SIGKILL

    def session(self, via: str, session_id: str) -> dict[str, Any]:
        status, body = self.nodes[via].http(f"/v1/sessions/{session_id}")
        assert status == 200, body
        return dict(body)


def cluster_up(cluster: Cluster, via: str, count: int) -> bool:
    status, body = cluster.nodes[via].http("/v1/cluster")
    return status == 200 and sum(1 for n in body["nodes"] if n["state"] == "up") == count


def caller_args(work: Path, number: str, keys: str = "") -> tuple[str, ...]:
    """SIPp's ``-inf`` for a caller from ``number`` who presses ``keys``."""
    work.mkdir(parents=True, exist_ok=True)
    csv = work / "caller.csv"
    csv.write_text(f"SEQUENTIAL\n{number};{''.join(k + ';' for k in keys)}\n")
    AUDIT.register(number, "caller number", "tests/integration/cluster.py")
    return ("-inf", str(csv))


def sessions(cluster: Cluster, via: str) -> list[dict[str, Any]]:
    status, body = cluster.nodes[via].http("/v1/sessions?limit=500")
    assert status == 200, body
    return list(body["sessions"])


@contextlib.contextmanager
def running_cluster(
    work: Path,
    *,
    env: Mapping[str, str] | None = None,
    door_env: Mapping[str, str] | None = None,
    **provider_faults: float,
) -> Iterator[Cluster]:
    """Two nodes on two hosts, their PostgreSQL and Kamailio on the gateway, the reference
    payment provider with ``provider_faults``; all stopped and removed on exit. ``env``: more
    settings of both nodes (over node_env's), ``door_env``: of Kamailio's configuration."""
    reason = available()
    if reason is not None:
        raise AssertionError(f"a cluster needs network namespaces: {reason}")
    with network(2, "cluster") as net:
        pg = PgCluster(listen=(net.gateway,), trust=(net.subnet,)).start()
        provider = Provider(work / "provider", host=net.gateway).start()
        if provider_faults:
            provider.set_faults(**provider_faults)
        made = Cluster(net, work, pg.url_on(net.gateway), provider, env)
        made.pg = pg
        try:
            for server in made.nodes.values():
                server.start()
            for name in made.nodes:
                wait_for(partial(cluster_up, made, name, 2), 30, f"{name} to see both nodes")
            made.door = FrontDoor(
                work / "front", net.gateway, pg.url_on(net.gateway), door_env
            ).start()
            yield made
        finally:
            for server in made.nodes.values():
                if server.process is not None and server.process.poll() is None:
                    server.stop()
            if made.door is not None:
                made.door.stop()
            provider.stop()
            pg.stop()
            pg.remove()
