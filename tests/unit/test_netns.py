"""tests/netns.py, the namespace networks the multi-host tests run on, checked on real ones.

The multi-host tests trust these to give them hosts that reach each other and the gateway (where
the root namespace's Kamailio and PostgreSQL listen), and a machine left as it was found, even
after a failed test or a killed run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.pg_cluster import PgCluster

_REPO = Path(__file__).resolve().parents[2]
_DEADLINE_S = 20
# No process can have it: above PID_MAX_LIMIT (2**22), the most any kernel hands out.
_DEAD_PID = 2**22 + 1

# Serves UDP and TCP on ADDRESS; each answer names the server and the sender's address as seen.
_ECHO = r"""
import selectors, socket, sys
address = sys.argv[1]
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((address, 0))
tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
tcp.bind((address, 0))
tcp.listen()
print(udp.getsockname()[1], tcp.getsockname()[1], flush=True)
selector = selectors.DefaultSelector()
selector.register(udp, selectors.EVENT_READ)
selector.register(tcp, selectors.EVENT_READ)
while True:
    for key, _ in selector.select():
        sock = key.fileobj
        if sock is udp:
            data, peer = udp.recvfrom(4096)
            udp.sendto(f"{address} got {data.decode()} from {peer[0]}".encode(), peer)
        elif sock is tcp:
            conn, _ = tcp.accept()
            selector.register(conn, selectors.EVENT_READ)
        else:
            data = sock.recv(4096)
            if data:
                peer = sock.getpeername()[0]
                sock.sendall(f"{address} got {data.decode()} from {peer}".encode())
            else:
                selector.unregister(sock)
                sock.close()
"""

# Sends "hello from ME" to each udp:ADDRESS:PORT or tcp:ADDRESS:PORT and prints the answers.
_CLIENT = r"""
import socket, sys, time
me = sys.argv[1]
for target in sys.argv[2:]:
    kind, address, port = target.split(":")
    message = f"hello from {me}".encode()
    if kind == "tcp":
        with socket.create_connection((address, int(port)), timeout=10) as conn:
            conn.sendall(message)
            conn.shutdown(socket.SHUT_WR)
            reply = b"".join(iter(lambda: conn.recv(4096), b""))
    else:
        deadline = time.monotonic() + 10
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.settimeout(0.2)
            while True:  # a datagram may be lost: sent again until answered
                udp.sendto(message, (address, int(port)))
                try:
                    reply = udp.recv(4096)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
    print(target, reply.decode(), flush=True)
"""

# A run killed (-9) inside its network, with a process of its own left in one of its hosts.
_KILLED_RUN = r"""
import json, os, signal, subprocess, sys, time
from tests import netns
with netns.network(2, tag="killed") as net:
    orphan = subprocess.Popen(
        net.hosts[0].argv(sys.executable, "-c", "import signal; signal.pause()"),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while str(orphan.pid) not in subprocess.run(
        ["ip", "netns", "pids", net.hosts[0].name], capture_output=True, text=True
    ).stdout.split():
        if time.monotonic() > deadline:
            sys.exit("the orphan never entered its namespace")
        time.sleep(0.01)
    names = {"bridge": net.bridge, "hosts": [h.name for h in net.hosts], "orphan": orphan.pid}
    print(json.dumps(names), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _need_namespaces() -> None:
    reason = netns.available()
    if reason is not None:
        pytest.fail(f"network namespaces cannot be used here: {reason}", pytrace=False)


@contextlib.contextmanager
def _process(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=_DEADLINE_S)


def _first_line(process: subprocess.Popen[str], what: str) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout=_DEADLINE_S)
    line = process.stdout.readline() if ready else ""
    if not line:
        process.kill()
        _, stderr = process.communicate(timeout=_DEADLINE_S)
        pytest.fail(f"{what} printed nothing in {_DEADLINE_S} s (exit {process.poll()}): {stderr}")
    return line


def _echo_ports(process: subprocess.Popen[str], what: str) -> tuple[int, int]:
    udp, tcp = _first_line(process, what).split()
    return int(udp), int(tcp)


def _namespaces() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


def _links() -> set[str]:
    output = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout
    return {link["ifname"] for link in json.loads(output)}


def _ours() -> tuple[set[str], set[str]]:
    """This process's namespaces and links, by their names' prefix (pid 12 is not pid 123)."""
    ours = re.compile(rf"vgt{os.getpid()}[a-z]")
    return (
        {name for name in _namespaces() if ours.match(name)},
        {name for name in _links() if ours.match(name)},
    )


def _dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (this machine's pid 1 may not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _wait_until_dead(pid: int) -> bool:
    deadline = time.monotonic() + _DEADLINE_S
    while not _dead(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --- traffic -----------------------------------------------------------------------------------


def test_hosts_reach_each_other_and_the_gateway_over_udp_and_tcp() -> None:
    _need_namespaces()
    with netns.network(2, tag="echo") as net, contextlib.ExitStack() as stack:
        first, second = net.hosts
        assert first.argv("true") == ["ip", "netns", "exec", first.name, "true"]
        # The root namespace's service binds the gateway, as Kamailio and PostgreSQL will.
        servers = {
            net.gateway: [sys.executable, "-c", _ECHO, net.gateway],
            first.address: first.argv(sys.executable, "-c", _ECHO, first.address),
            second.address: second.argv(sys.executable, "-c", _ECHO, second.address),
        }
        ports = {
            address: _echo_ports(stack.enter_context(_process(argv)), f"the echo on {address}")
            for address, argv in servers.items()
        }

        def targets(*addresses: str) -> list[str]:
            return [
                f"{kind}:{address}:{ports[address][index]}"
                for address in addresses
                for index, kind in enumerate(("udp", "tcp"))
            ]

        clients = {
            first.address: first.argv(
                sys.executable, "-c", _CLIENT, first.address, *targets(second.address, net.gateway)
            ),
            second.address: second.argv(
                sys.executable, "-c", _CLIENT, second.address, *targets(first.address, net.gateway)
            ),
            # The root namespace reaches the hosts too: a test's own client, a probe.
            net.gateway: [
                sys.executable, "-c", _CLIENT, net.gateway, *targets(first.address, second.address)
            ],
        }  # fmt: skip
        for source, argv in clients.items():
            result = subprocess.run(argv, capture_output=True, text=True, timeout=_DEADLINE_S)
            assert result.returncode == 0, f"the client on {source} failed: {result.stderr}"
            answers = dict(line.split(" ", 1) for line in result.stdout.splitlines())
            expected = {
                target: f"{target.split(':')[1]} got hello from {source} from {source}"
                for target in argv[argv.index(source) + 1 :]
            }
            # The sender as the server saw it: the host's own address, not rewritten on the way.
            assert answers == expected, f"{source}'s exchanges went wrong: {result.stdout!r}"


# --- teardown ----------------------------------------------------------------------------------


class _BodyFailed(Exception):
    pass


@pytest.mark.parametrize("body_raises", [False, True])
def test_teardown_leaves_nothing_behind(body_raises: bool) -> None:
    _need_namespaces()
    namespaces_before, links_before = _ours()
    sleeper: subprocess.Popen[bytes] | None = None
    raised = None
    try:
        with netns.network(2) as net:
            made = ({host.name for host in net.hosts}, net.bridge)
            assert made[0] <= _namespaces(), f"the hosts' namespaces are missing: {made[0]}"
            assert net.bridge in _links(), f"the bridge {net.bridge} is missing"
            # A process the test forgot in a host: teardown must end it to delete the namespace.
            sleeper = subprocess.Popen(
                net.hosts[1].argv(sys.executable, "-c", "import signal; signal.pause()")
            )
            if body_raises:
                raise _BodyFailed("the test's own failure")
    except _BodyFailed as error:
        raised = error
    assert sleeper is not None
    try:
        status = sleeper.wait(timeout=_DEADLINE_S)
    except subprocess.TimeoutExpired:
        sleeper.kill()
        sleeper.wait()
        pytest.fail("the process left in a host was not killed by the teardown")
    assert status == -signal.SIGKILL, f"the process in a host ended with {status}, not SIGKILL"
    if body_raises:
        assert raised is not None, "the body's exception did not come out of network()"
        assert not getattr(raised, "__notes__", None), f"teardown failed: {raised.__notes__}"
    assert _ours() == (namespaces_before, links_before), (
        f"namespaces or links were left behind (before: {namespaces_before}, {links_before})"
    )
    assert not made[0] & _namespaces(), f"namespaces left: {made[0] & _namespaces()}"
    assert made[1] not in _links(), f"the bridge {made[1]} was left"


@pytest.mark.parametrize("body_raises", [False, True])
def test_a_failing_teardown_step_is_reported_after_the_others_ran(body_raises: bool) -> None:
    _need_namespaces()
    namespaces_before, links_before = _ours()
    raised: BaseException | None = None
    try:
        with netns.network(2) as net:
            # Gone before teardown gets to it: deleting it there fails.
            removed = subprocess.run(["ip", "link", "del", net.bridge], capture_output=True)
            assert removed.returncode == 0, f"the bridge could not be deleted: {removed.stderr!r}"
            if body_raises:
                raise _BodyFailed("the test's own failure")
    except (_BodyFailed, netns.NetnsError) as error:
        raised = error
    if body_raises:
        assert isinstance(raised, _BodyFailed), f"the body's exception was replaced by {raised!r}"
        notes = "\n".join(getattr(raised, "__notes__", []))
        assert net.bridge in notes, f"the teardown's failure is not told in a note: {notes!r}"
    else:
        assert isinstance(raised, netns.NetnsError), f"the teardown's failure was {raised!r}"
        assert net.bridge in str(raised), f"the failure does not name the bridge: {raised}"
    assert _ours() == (namespaces_before, links_before), (
        "the steps after the failing one did not run: namespaces or veths were left"
    )


def test_a_killed_runs_leftovers_are_removed_on_the_next_entry() -> None:
    _need_namespaces()
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN],
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL, (
        f"the run to be killed did not get as far as its kill: {killed.stdout} {killed.stderr}"
    )
    left = json.loads(killed.stdout)
    assert set(left["hosts"]) <= _namespaces(), "the killed run left no namespaces to remove"
    assert left["bridge"] in _links(), "the killed run left no bridge to remove"
    assert not _dead(left["orphan"]), "the killed run's process in its host died by itself"
    # Made by hand, with a pid no process can have: unstamped, as if killed before stamping.
    unstamped_bridge = f"vgt{_DEAD_PID}b0"
    unstamped_host = f"vgt{_DEAD_PID}n0-0"
    # Stamped by a container with another pid namespace: its pids are not ours to judge.
    foreign = f"vgt{_DEAD_PID}b1"
    try:
        for command in (
            ["ip", "link", "add", unstamped_bridge, "type", "bridge"],
            ["ip", "netns", "add", unstamped_host],
            ["ip", "link", "add", foreign, "type", "bridge"],
            ["ip", "link", "set", "dev", foreign, "alias", "voicegate-netns pid:[1]"],
        ):
            made = subprocess.run(command, capture_output=True, text=True)
            assert made.returncode == 0, f"{command} failed: {made.stderr}"

        with netns.network(1) as net:
            links, namespaces = _links(), _namespaces()
            assert left["bridge"] not in links, "the killed run's bridge is still there"
            assert not set(left["hosts"]) & namespaces, (
                "the killed run's namespaces are still there"
            )
            assert unstamped_bridge not in links, "the hand-made leftover bridge is still there"
            assert unstamped_host not in namespaces, (
                "the hand-made leftover namespace is still there"
            )
            assert foreign in links, "a bridge stamped by another pid namespace was removed"
            assert net.hosts[0].name in namespaces
        assert _wait_until_dead(left["orphan"]), "the killed run's process in its host still runs"
    finally:
        for command in (
            ["ip", "link", "del", foreign],
            ["ip", "link", "del", unstamped_bridge],
            ["ip", "netns", "del", unstamped_host],
        ):
            subprocess.run(command, capture_output=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(left["orphan"], signal.SIGKILL)


def test_a_killed_runs_bridge_filter_change_is_undone_on_the_next_entry() -> None:
    _need_namespaces()
    # What a run that had to turn bridge netfilter off leaves when it is killed: the sysctls off
    # and the state naming it. Written under the module's lock, as it would have.
    sysctls = {
        name: path
        for name in netns._BRIDGE_FILTERS
        if (path := netns._BRIDGE_SYSCTLS / name).exists()
    }
    before = {name: path.read_text().strip() for name, path in sysctls.items()}
    dead_holder = f"vgt{_DEAD_PID}b0 {os.readlink('/proc/self/ns/pid')}"
    try:
        with netns._locked():
            assert not netns._FILTER_STATE.exists(), (
                f"{netns._FILTER_STATE} exists: a network of another process relies on it"
            )
            netns._FILTER_STATE.write_text(
                json.dumps({"original": before, "holders": [dead_holder]})
            )
            for path in sysctls.values():
                path.write_text("0")
        with netns.network(1):
            if netns._FILTER_STATE.exists():  # this machine needed the change itself
                state = json.loads(netns._FILTER_STATE.read_text())
                assert dead_holder not in state["holders"], f"the dead run still holds: {state}"
            else:
                now = {name: path.read_text().strip() for name, path in sysctls.items()}
                assert now == before, f"the sysctls were not restored on entry: {now} != {before}"
        now = {name: path.read_text().strip() for name, path in sysctls.items()}
        assert now == before, f"the sysctls were not restored: {now} != {before}"
        assert not netns._FILTER_STATE.exists(), f"{netns._FILTER_STATE} was left behind"
    finally:
        with netns._locked():
            state = netns._FILTER_STATE.read_text() if netns._FILTER_STATE.exists() else ""
            if dead_holder in state:
                for name, path in sysctls.items():
                    path.write_text(before[name])
                netns._FILTER_STATE.unlink()


# --- PostgreSQL on the gateway -----------------------------------------------------------------


_CONNECT = r"""
import sys, psycopg
with psycopg.connect(sys.argv[1], connect_timeout=10) as conn:
    print(conn.execute("SELECT host(inet_client_addr())").fetchone()[0])
"""


def test_a_pg_cluster_on_the_gateway_is_reachable_from_a_host() -> None:
    _need_namespaces()
    with netns.network(1, tag="pg") as net:
        (host,) = net.hosts
        cluster = PgCluster(listen=(net.gateway,), trust=(net.subnet,))
        try:
            cluster.start()
            url = cluster.url_on(net.gateway)
            assert url == f"postgresql://postgres@{net.gateway}:{cluster.port}/postgres"
            for where, argv in (
                (host.address, host.argv(sys.executable, "-c", _CONNECT, url)),
                # The root namespace through the gateway: trusted as its own address.
                (net.gateway, [sys.executable, "-c", _CONNECT, url]),
                ("127.0.0.1", [sys.executable, "-c", _CONNECT, cluster.url()]),
            ):
                result = subprocess.run(argv, capture_output=True, text=True, timeout=_DEADLINE_S)
                assert result.returncode == 0, f"connecting from {where} failed: {result.stderr}"
                assert result.stdout.strip() == where, (
                    f"the server saw the client from {where} as {result.stdout.strip()!r}"
                )
        finally:
            cluster.remove()
