"""Throw-away multi-host networks made of Linux network namespaces, for tests that need hosts.

:func:`network` makes a bridge in the root namespace with the gateway address ``10.N.0.1/24`` and
one namespace per host, joined to the bridge by a veth pair, at ``10.N.0.2``, ``10.N.0.3``, ...;
services that every host must reach (Kamailio, PostgreSQL) bind the gateway address in the root
namespace. Everything is removed on exit, also when the test fails, and what a killed run left is
removed by the next one: the names carry the creating process's pid (``vgt<pid>...``).

Before handing the network over it checks that TCP passes on every path the tests use; a machine
whose bridge netfilter drops bridged traffic gets ``net.bridge.bridge-nf-call-*tables`` turned off
for as long as a network needs it, then restored. Every failure raises :class:`NetnsError` with the
failing command's stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import ipaddress
import itertools
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")

_PREFIX = "vgt"
# Every name we make parses as prefix, owner pid, then a letter: how leftovers are found.
_OURS = re.compile(rf"^{_PREFIX}(\d+)[a-z]")
_IFNAMSIZ = 15  # the kernel's limit on an interface name, without its NUL
_SUBNETS = range(200, 251)  # 10.N.0.0/24: high in 10/8, where a machine's own networks rarely are
_PREFIXLEN = 24
_COMMAND_TIMEOUT_S = 30
_KILL_TIMEOUT_S = 10
_LINK_TIMEOUT_S = 10
# Connections over a local bridge take milliseconds: the first look is short, as a machine that
# needs bridge netfilter off pays it on every network; the verdict waits longer.
_FIRST_PROBE_S = 1
_PROBE_TIMEOUT_S = 5
_NETNS_DIR = Path("/run/netns")  # where `ip netns` keeps its names
_RUN_DIR = Path("/run/voicegate-netns")
_LOCK = _RUN_DIR / "lock"
# The bridge-netfilter sysctls we turned off, their values before, and the networks relying on it.
_FILTER_STATE = _RUN_DIR / "bridge-nf.json"
_BRIDGE_SYSCTLS = Path("/proc/sys/net/bridge")
# Bridged frames go through the root namespace's iptables/arptables while these are 1.
_BRIDGE_FILTERS = ("bridge-nf-call-iptables", "bridge-nf-call-arptables")
_CLONE_NEWNET = 0x40000000

_networks = itertools.count()  # this process's networks: bridge and namespace names
_veths = itertools.count()  # a counter of its own: veth names are the tightest under IFNAMSIZ


class NetnsError(RuntimeError):
    """A namespace network could not be made, checked or removed (the message says why)."""


@dataclass(frozen=True)
class Host:
    name: str  # the namespace
    address: str

    def argv(self, *cmd: str) -> list[str]:
        """``cmd`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *cmd]


@dataclass(frozen=True)
class Network:
    gateway: str  # the bridge's address: what the root namespace binds for the hosts to reach
    subnet: str  # e.g. 10.200.0.0/24: what a server trusts its hosts by
    bridge: str
    hosts: list[Host]


def available() -> str | None:
    """None if :func:`network` can work here, else the reason it cannot."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN, and mounts in /run/netns)"
    for tool in ("ip", "bridge"):
        if shutil.which(tool) is None:
            return f"`{tool}` (Debian package iproute2) is not on PATH"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces (/proc/self/ns/net is missing)"
    if _setns() is None:
        return "the C library has no setns(), needed to check the network's paths"
    return None


@contextlib.contextmanager
def network(hosts: int, tag: str = "") -> Iterator[Network]:
    """A bridge at 10.N.0.1/24 and ``hosts`` namespaces on it, removed on exit."""
    if not 1 <= hosts <= 253:
        raise ValueError(f"hosts must be 1 to 253 (one /24), not {hosts}")
    if not re.fullmatch(r"[A-Za-z0-9_-]{0,32}", tag):
        raise ValueError(f"tag {tag!r}: up to 32 letters, digits, '_' or '-' (it names files)")
    reason = available()
    if reason is not None:
        raise NetnsError(reason)
    made = _Made()
    try:
        # One at a time across processes: two would pick the same free subnet, and a probe must
        # not run while another network flips the bridge-netfilter sysctls.
        with _locked():
            _remove_leftovers()
            net = _build(made, hosts, tag)
            _ensure_paths(net, made)
        yield net
    except BaseException as error:
        problems = _teardown(made)
        if problems:
            error.add_note("and the network's teardown failed too:\n" + "\n".join(problems))
        raise
    problems = _teardown(made)
    if problems:
        raise NetnsError("tearing down the network failed:\n" + "\n".join(problems))


# --- making ------------------------------------------------------------------------------------


class _Made:
    """What was made so far, in order: what teardown must remove, even of a half-made network."""

    def __init__(self) -> None:
        self.bridge: str | None = None
        self.namespaces: list[str] = []
        self.veths: list[str] = []
        self.filter_holder: str | None = None


def _build(made: _Made, hosts: int, tag: str) -> Network:
    pid = os.getpid()
    number = next(_networks)
    bridge = _ifname(f"{_PREFIX}{pid}b{number}")
    subnet = _free_subnet()
    gateway = str(subnet.network_address + 1)
    stamp = _stamp()
    # STP off and no forward delay: a port forwards as soon as it is up, not 30 s later.
    _ip("link", "add", bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
    made.bridge = bridge
    _ip("addr", "add", f"{gateway}/{_PREFIXLEN}", "dev", bridge)
    _ip("link", "set", "dev", bridge, "alias", stamp, "up")
    members: list[Host] = []
    suffix = f"-{tag}" if tag else ""
    for index in range(hosts):
        name = f"{_PREFIX}{pid}n{number}-{index}{suffix}"
        address = str(subnet.network_address + 2 + index)
        _ip("netns", "add", name)
        made.namespaces.append(name)
        veth = _ifname(f"{_PREFIX}{pid}v{next(_veths)}")
        # The namespace's end is made in place: its name (eth0) then never meets the root's.
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        made.veths.append(veth)
        _ip("link", "set", "dev", veth, "master", bridge, "alias", stamp, "up")
        _ip("-n", name, "link", "set", "dev", "lo", "up")
        _ip("-n", name, "addr", "add", f"{address}/{_PREFIXLEN}", "dev", "eth0")
        _ip("-n", name, "link", "set", "dev", "eth0", "alias", stamp, "up")
        _ip("-n", name, "route", "add", "default", "via", gateway)
        members.append(Host(name=name, address=address))
    _wait_forwarding(bridge, made.veths)
    return Network(gateway=gateway, subnet=str(subnet), bridge=bridge, hosts=members)


def _ifname(name: str) -> str:
    if len(name) > _IFNAMSIZ:
        raise NetnsError(f"interface name {name!r} is longer than IFNAMSIZ ({_IFNAMSIZ})")
    return name


def _free_subnet() -> ipaddress.IPv4Network:
    taken: list[ipaddress.IPv4Network] = []
    for link in _ip_json("-4", "addr", "show"):
        for info in link.get("addr_info", []):
            taken.append(ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network)
    for route in _ip_json("-4", "route", "show", "table", "all"):
        destination = route.get("dst", "default")
        if destination != "default":  # the default route overlaps everything and clashes with none
            taken.append(ipaddress.IPv4Network(destination, strict=False))
    for n in _SUBNETS:
        candidate = ipaddress.IPv4Network(f"10.{n}.0.0/{_PREFIXLEN}")
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    raise NetnsError(
        f"no free subnet: every 10.N.0.0/24 for N in {_SUBNETS.start}-{_SUBNETS.stop - 1}"
        " overlaps an address or a route of this machine"
    )


def _wait_forwarding(bridge: str, ports: list[str]) -> None:
    """Until the bridge is up and every port forwards: before that, frames are dropped."""
    deadline = time.monotonic() + _LINK_TIMEOUT_S
    while True:
        states = {link["ifname"]: link.get("state") for link in _bridge_links(bridge)}
        waiting = [port for port in ports if states.get(port) != "forwarding"]
        (link,) = _ip_json("link", "show", "dev", bridge)
        if not waiting and link.get("operstate") == "UP":
            return
        if time.monotonic() > deadline:
            raise NetnsError(
                f"bridge {bridge} not ready after {_LINK_TIMEOUT_S} s: operstate"
                f" {link.get('operstate')}, ports not forwarding: {waiting} (states {states})"
            )
        time.sleep(0.01)


def _bridge_links(bridge: str) -> list[dict[str, Any]]:
    links = json.loads(_run("bridge", "-j", "link", "show", what="listing bridge ports"))
    return [link for link in links if link.get("master") == bridge]


# --- checking the paths ------------------------------------------------------------------------


def _ensure_paths(net: Network, made: _Made) -> None:
    """Every path the tests use carries TCP, or NetnsError says which does not and why."""
    assert made.bridge is not None
    if _FILTER_STATE.exists():
        # Another network's change is what lets ours pass: it must last while ours does.
        _hold_filters_off(made)
    blocked = _probe(net, _FIRST_PROBE_S)
    if not blocked:
        return
    between_hosts = any(bridged for _, bridged in blocked)
    if between_hosts and made.filter_holder is None and _filtering_bridged():
        # Frames between two hosts are bridged, so the root namespace's iptables FORWARD chain
        # (a DROP policy, Docker's) sees them; frames to the gateway are not forwarded, and an
        # INPUT rule that drops them is the firewall's business, not something a sysctl undoes.
        _hold_filters_off(made)
    blocked = _probe(net, _PROBE_TIMEOUT_S)
    if blocked:
        raise NetnsError(
            f"traffic does not pass over bridge {net.bridge} ({net.subnet}):\n  "
            + "\n  ".join(path for path, _ in blocked)
            + "\n"
            + _diagnosis(net.bridge, made.filter_holder is not None)
        )


def _probe(net: Network, timeout_s: float) -> list[tuple[str, bool]]:
    """The paths on which a TCP connection to a listener fails, each as 'FROM -> TO: why' and
    whether it is between two hosts (bridged, not delivered to the root namespace).

    A real listener at each end, not a closed port's reset: a REJECT rule's ICMP error reads as
    "connection refused" too.
    """
    with contextlib.ExitStack() as stack:

        def listener(namespace: str | None, address: str) -> tuple[str, int]:
            sock = stack.enter_context(_tcp_socket(namespace))
            sock.bind((address, 0))
            sock.listen()
            port: int = sock.getsockname()[1]
            return address, port

        gateway = listener(None, net.gateway)
        ends = [listener(host.name, host.address) for host in net.hosts]
        # (label, from which namespace (None: the root), to where, between two hosts)
        paths: list[tuple[str, str | None, tuple[str, int], bool]] = []
        for index, host in enumerate(net.hosts):
            paths.append((f"{host.name} -> gateway", host.name, gateway, False))
            paths.append((f"gateway -> {host.name}", None, ends[index], False))
            if len(net.hosts) > 1:
                # A ring has every host send and receive, in as many paths as there are hosts.
                peer = (index + 1) % len(net.hosts)
                label = f"{host.name} -> {net.hosts[peer].name}"
                paths.append((label, host.name, ends[peer], True))
        selector = stack.enter_context(selectors.DefaultSelector())
        blocked: list[tuple[str, bool]] = []
        for label, namespace, target, bridged in paths:
            sock = stack.enter_context(_tcp_socket(namespace))
            sock.setblocking(False)
            what = f"{label} ({target[0]})"
            code = sock.connect_ex(target)
            if code in (0, errno.EINPROGRESS):
                selector.register(sock, selectors.EVENT_WRITE, (sock, what, bridged))
            else:
                blocked.append((f"{what}: {os.strerror(code)}", bridged))
        deadline = time.monotonic() + timeout_s
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                sock, what, bridged = key.data
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    blocked.append((f"{what}: {os.strerror(code)}", bridged))
                selector.unregister(sock)
        for key in selector.get_map().values():
            _, what, bridged = key.data
            blocked.append((f"{what}: no answer in {timeout_s:g} s (dropped)", bridged))
        return blocked


def _tcp_socket(namespace: str | None) -> socket.socket:
    if namespace is None:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    return _in_namespace(namespace, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))


def _in_namespace(namespace: str, make: Callable[[], _T]) -> _T:
    """``make()`` called on a thread that joined ``namespace``: a socket keeps the namespace it
    was made in, and the thread, not this one, ends up in the namespace (it then just ends)."""
    setns = _setns()
    if setns is None:
        raise NetnsError("the C library has no setns()")
    result: list[_T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(_NETNS_DIR / namespace, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if setns(fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns into {namespace}: {os.strerror(code)}")
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=run, name=f"netns {namespace}")
    thread.start()
    thread.join()
    if failure:
        raise NetnsError(f"in namespace {namespace}: {failure[0]}") from failure[0]
    return result[0]


@functools.cache
def _setns() -> Callable[[int, int], int] | None:
    try:
        function: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).setns
    except (OSError, AttributeError):
        return None
    return function


def _diagnosis(bridge: str, filters_off: bool) -> str:
    facts = [f"{name}={_sysctl(name)}" for name in _BRIDGE_FILTERS]
    if filters_off:
        facts.append("bridge netfilter turned off for this network")
    for conf in ("all", bridge):
        rp_filter = Path(f"/proc/sys/net/ipv4/conf/{conf}/rp_filter")
        with contextlib.suppress(OSError):
            facts.append(f"rp_filter[{conf}]={rp_filter.read_text().strip()}")
    with contextlib.suppress(NetnsError, ValueError):
        states = {link["ifname"]: link.get("state") for link in _bridge_links(bridge)}
        facts.append(f"ports {states}")
    return (
        "(" + ", ".join(facts) + "; with a single route per host rp_filter cannot be the cause:"
        " look at the root namespace's iptables/nft INPUT and FORWARD rules)"
    )


# --- the bridge-netfilter sysctls --------------------------------------------------------------


def _sysctl(name: str) -> str | None:
    try:
        return (_BRIDGE_SYSCTLS / name).read_text().strip()
    except OSError:
        return None  # br_netfilter not loaded: bridged frames meet no iptables


def _filtering_bridged() -> bool:
    return any(_sysctl(name) == "1" for name in _BRIDGE_FILTERS)


def _hold_filters_off(made: _Made) -> None:
    """Turn bridge netfilter off (remembering what it was) and count ``made`` among the networks
    relying on that; the last one to release it restores it. Call with the lock held."""
    assert made.bridge is not None
    original, holders = _filter_state()
    if not holders:
        original = {name: value for name in _BRIDGE_FILTERS if (value := _sysctl(name)) is not None}
    holder = f"{made.bridge} {_pid_namespace()}"
    _write_filter_state(original, [*holders, holder])
    # Held before changed: a failure half-way is still restored by the teardown.
    made.filter_holder = holder
    for name in original:
        try:
            (_BRIDGE_SYSCTLS / name).write_text("0")
        except OSError as error:
            raise NetnsError(f"turning off net.bridge.{name}: {error}") from error


def _release_filters(holder: str) -> None:
    with _locked():
        original, holders = _filter_state()
        _settle_filters(original, [h for h in holders if h != holder])


def _settle_filters(original: dict[str, str], holders: list[str]) -> None:
    """Keep the live holders; with none left, put the sysctls back as they were."""
    holders = [holder for holder in holders if _holder_alive(holder)]
    if holders:
        _write_filter_state(original, holders)
        return
    for name, value in original.items():
        try:
            (_BRIDGE_SYSCTLS / name).write_text(value)
        except OSError as error:
            raise NetnsError(f"restoring net.bridge.{name}={value}: {error}") from error
    _FILTER_STATE.unlink(missing_ok=True)


def _holder_alive(holder: str) -> bool:
    bridge, _, pid_namespace = holder.partition(" ")
    match = _OURS.match(bridge)
    if match is None or pid_namespace != _pid_namespace():
        return True  # another container's pids mean nothing here: never pull its sysctls
    return _alive(int(match.group(1)))


def _filter_state() -> tuple[dict[str, str], list[str]]:
    try:
        state = json.loads(_FILTER_STATE.read_text())
    except FileNotFoundError:
        return {}, []
    except (OSError, ValueError) as error:
        raise NetnsError(f"reading {_FILTER_STATE}: {error}") from error
    try:
        return dict(state["original"]), list(state["holders"])
    except (KeyError, TypeError, ValueError) as error:
        raise NetnsError(f"{_FILTER_STATE} is not what this module writes: {state!r}") from error


def _write_filter_state(original: dict[str, str], holders: list[str]) -> None:
    _FILTER_STATE.write_text(json.dumps({"original": original, "holders": holders}))


# --- removing ----------------------------------------------------------------------------------


def _teardown(made: _Made) -> list[str]:
    """Remove everything ``made`` lists; every step is tried, the failures are returned."""
    problems: list[str] = []

    def attempt(step: Callable[[], object]) -> None:
        try:
            step()
        except NetnsError as error:
            problems.append(str(error))
        except Exception as error:  # still a step to report, not a reason to skip the others
            problems.append(f"{step}: {error!r}")

    for namespace in made.namespaces:
        attempt(functools.partial(_kill_all_in, namespace))
    # The root end first: deleting it destroys the pair at once, whereas a deleted namespace
    # takes its links down later, on a kernel work queue.
    for veth in made.veths:
        attempt(functools.partial(_ip, "link", "del", veth))
    for namespace in made.namespaces:
        attempt(functools.partial(_ip, "netns", "del", namespace))
    if made.bridge is not None:
        attempt(functools.partial(_ip, "link", "del", made.bridge))
    if made.filter_holder is not None:
        attempt(functools.partial(_release_filters, made.filter_holder))
    return problems


def _kill_all_in(namespace: str) -> None:
    """SIGKILL every process in ``namespace`` and wait until none is left: a namespace a
    process still runs in outlives its name, links and all."""
    deadline = time.monotonic() + _KILL_TIMEOUT_S
    while pids := _pids_in(namespace):
        if time.monotonic() > deadline:
            raise NetnsError(
                f"processes {pids} still run in namespace {namespace}"
                f" {_KILL_TIMEOUT_S} s after SIGKILL"
            )
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _pids_in(namespace: str) -> list[int]:
    output = _run("ip", "netns", "pids", namespace, what=f"listing processes in {namespace}")
    return [int(pid) for pid in output.split()]


def _remove_leftovers() -> None:
    """Remove what runs killed before their teardown left: the namespaces, links and sysctl
    changes of our prefix whose owner pid is gone. Call with the lock held."""
    if _FILTER_STATE.exists():
        _settle_filters(*_filter_state())
    namespaces = sorted(os.listdir(_NETNS_DIR)) if _NETNS_DIR.is_dir() else []
    for namespace in namespaces:
        if _forgotten(namespace, functools.partial(_ns_stamp, namespace)):
            _kill_all_in(namespace)
            _ip("netns", "del", namespace)
    for link in _ip_json("link", "show"):
        name = link["ifname"].partition("@")[0]
        if _forgotten(name, functools.partial(link.get, "ifalias")):
            with contextlib.suppress(NetnsError):  # a veth gone with its namespace just now
                _ip("link", "del", name)


def _forgotten(name: str, stamp: Callable[[], str | None]) -> bool:
    match = _OURS.match(name)
    if match is None or _alive(int(match.group(1))):
        return False
    # Unstamped: killed between making it and stamping it, a moment no other container's is in.
    found = stamp()
    return found is None or found == _stamp()


def _ns_stamp(namespace: str) -> str | None:
    with contextlib.suppress(NetnsError, ValueError):
        for link in _ip_json("-n", namespace, "link", "show"):
            if link.get("ifalias", "").startswith("voicegate-netns "):
                alias: str = link["ifalias"]
                return alias
    return None


def _stamp() -> str:
    # Our links are seen by every container sharing this network namespace, whose pids are not
    # ours: a dead pid decides only for links stamped with our pid namespace.
    return f"voicegate-netns {_pid_namespace()}"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- commands ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    _RUN_DIR.mkdir(mode=0o700, exist_ok=True)
    with open(_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _ip(*args: str) -> str:
    return _run("ip", *args, what="ip " + " ".join(args))


def _ip_json(*args: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(
        _run("ip", "-j", *args, what="ip -j " + " ".join(args))
    )
    return found


def _run(*argv: str, what: str) -> str:
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NetnsError(f"{what}: {error}") from error
    if result.returncode != 0:
        raise NetnsError(
            f"{what} failed (exit status {result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout
