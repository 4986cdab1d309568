"""Real peers for integration tests: a ``voicegate serve`` subprocess and SIPp runs against it.

Every port is picked free on loopback; every wait polls a condition with a bound (STYLE.md habit 3).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from session.store import SessionStore
from tests.contract import check_answer
from tests.secret_audit import AUDIT

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "sipp-scenarios"
LOOPBACK = "127.0.0.1"
T = TypeVar("T")

_used_ports: set[int] = set()

# Under pytest-xdist (scripts/test runs the suite in several processes) each process draws its
# ports from its own share of each range below, so two processes never hand out the same port: a
# free port picked in one could otherwise be bound by the other between the pick and its
# server's bind.
_SHARE = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
_SHARES = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def _slice(floor: int, ceiling: int) -> tuple[int, int]:
    """This process's share of the ports from ``floor`` to ``ceiling``."""
    width = (ceiling - floor) // _SHARES
    return floor + _SHARE * width, floor + (_SHARE + 1) * width


def free_port(*, udp_and_tcp: bool = True) -> int:
    """A port free on loopback for TCP (and UDP), not handed out before in this test run.

    From outside the kernel's ephemeral ports: a port picked there and bound a moment later by
    a server was once taken in between by a listener on port 0 in the other xdist process (an
    aiohttp test server, which then answered the harness's /readyz with 404; CI, 2026-12-07),
    and any process's client sockets draw from that range too. The kernel hands out none of
    these ports by itself, so between the pick and the bind only another test could take one,
    and the shares keep the xdist processes apart.
    """
    for _ in range(_FREE_CEILING - _FREE_FLOOR):
        port = _next_free[0]
        _next_free[0] = port + 1 if port + 1 < _FREE_CEILING else _FREE_FLOOR
        if port == _FREE_FLOOR:
            # A whole turn: the ports handed out then were freed long ago (their servers have
            # stopped); the bind check below skips any still held.
            _used_ports.difference_update(range(_FREE_FLOOR, _FREE_CEILING))
        if port in _used_ports or not _bindable(port, udp_and_tcp):
            continue
        _used_ports.add(port)
        return port
    raise RuntimeError(f"no free port in {_FREE_FLOOR}-{_FREE_CEILING - 1}")


def _outside_ephemeral() -> tuple[int, int]:
    """Ports the kernel never picks by itself: above its ephemeral range if there is room
    there, else below this harness's other ranges (2000-5999)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    if high <= 64000:
        return high + 1, 65536
    if low > 6000:
        return 2000, 6000
    raise RuntimeError(f"the kernel's ephemeral ports {low}-{high} leave the tests no ports")


def free_port_block(count: int, *, udp_and_tcp: bool = True) -> int:
    """The first of ``count`` consecutive free loopback ports (a pool's workers take one each).

    From below the kernel's ephemeral ports and the RTP ranges, so that no client socket of
    another process (SIPp, the supervisor's own HTTP client) can take one between the pick and
    the worker's bind.
    """
    for _ in range(200):
        start = _next_block[0]
        _next_block[0] = start + count if start + count < _BLOCK_CEILING else _BLOCK_FLOOR
        if start + count > _BLOCK_CEILING:
            continue
        block = range(start, start + count)
        if any(p in _used_ports or not _bindable(p, udp_and_tcp) for p in block):
            continue
        _used_ports.update(block)
        return start
    raise RuntimeError(f"no {count} consecutive free ports")


_BLOCK_FLOOR, _BLOCK_CEILING = _slice(6000, 11900)
_FREE_FLOOR, _FREE_CEILING = _slice(*_outside_ephemeral())
_next_free = [_FREE_FLOOR + (os.getpid() * 7) % (_FREE_CEILING - _FREE_FLOOR)]
_next_block = [_BLOCK_FLOOR + (os.getpid() * 100) % (_BLOCK_CEILING - _BLOCK_FLOOR - 100)]


def _bindable(port: int, udp_and_tcp: bool) -> bool:
    kinds = [socket.SOCK_STREAM, socket.SOCK_DGRAM] if udp_and_tcp else [socket.SOCK_STREAM]
    for kind in kinds:
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                return False
    return True


# RTP ranges come from below the kernel's ephemeral ports (32768 and up on Linux), so a SIP or
# HTTP port the kernel hands out can never fall inside one (config refuses that overlap).
_RTP_FLOOR, _RTP_CEILING = _slice(12000, 32000)
_RTP_SPAN = _RTP_CEILING - _RTP_FLOOR
_next_rtp_offset = [(os.getpid() * 200) % _RTP_SPAN]


def rtp_range(size: int = 40) -> tuple[int, int]:
    offset = _next_rtp_offset[0] % (_RTP_SPAN - size)
    _next_rtp_offset[0] = offset + size
    base = _RTP_FLOOR + offset
    return base, base + size - 1


def wait_for(
    condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll ``condition`` until it returns something truthy, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def datagrams_within(
    sock: socket.socket, seconds: float, size: int = 65535
) -> list[tuple[bytes, Any]]:
    """Every (datagram, source) ``sock`` receives within ``seconds``."""
    got = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            got.append(sock.recvfrom(size))
        except TimeoutError:
            break
    return got


# Every SIPp started in this process, kept to the end of the run. A test that fails before it
# waits for its SIPps leaves them running; dropped, their Popen would warn "still running" when
# collected, and pytest fails whichever later test of the process is running then (seen in CI:
# test_resume_handles, after test_bridge had failed). They are stopped when the run ends.
_started_sipps: list[Sipp] = []


def stop_every_sipp() -> None:
    """Stop and reap every SIPp this process started (pytest_sessionfinish)."""
    while _started_sipps:
        _started_sipps.pop().kill()


@dataclass(frozen=True)
class Answer:
    """One answer of a server's HTTP API, as received."""

    status: int
    headers: Message
    body: bytes

    @property
    def content_type(self) -> str:
        return str(self.headers.get("Content-Type", ""))

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Server:
    """A ``voicegate serve`` subprocess on free loopback ports with its own data directory."""

    data_dir: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    sip_port: int = 0
    http_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    # Sent as "Authorization: Bearer <api_key>" on every request when set (docs/api.md).
    api_key: str = ""
    # Another host's server (tests/netns.py): the address its API and SIP answer on, and the
    # command that runs it there (``ip netns exec NAME``).
    host: str = LOOPBACK
    argv_prefix: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._own_ports = not (self.sip_port or self.http_port)  # free to pick others
        self.sip_port = self.sip_port or free_port()
        self.http_port = self.http_port or free_port(udp_and_tcp=False)
        self.rtp_min, self.rtp_max = rtp_range()

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")}
        env.update(
            {
                # As beyond loopback (media.strict_source = "auto"): every call's RTP locked
                # to its caller's source, so every test runs the way production does.
                "VOICEGATE_MEDIA_STRICT_SOURCE": "on",
                "VOICEGATE_SIP_PORT": str(self.sip_port),
                "VOICEGATE_HTTP_PORT": str(self.http_port),
                "VOICEGATE_MEDIA_RTP_PORT_MIN": str(self.rtp_min),
                "VOICEGATE_MEDIA_RTP_PORT_MAX": str(self.rtp_max),
                "VOICEGATE_STORAGE_DATA_DIR": str(self.data_dir),
                "VOICEGATE_LOG_LEVEL": "debug",
                # SIPp callers send RTP only while they play a capture, so most scenarios are
                # silent on the wire between their steps, which a real phone never is. The
                # media-gap tests set the product's own threshold (1 s) explicitly.
                "VOICEGATE_MEDIA_GAP_THRESHOLD_S": "30",
                # SIGTERM ends live calls at once unless a test is about draining.
                "VOICEGATE_SIP_DRAIN_DEADLINE_S": "0",
            }
        )
        env.update(self.env_overrides)
        return env

    def start(self, *, wait_ready: bool = True) -> Server:
        for attempt in range(3):
            try:
                return self._start(wait_ready=wait_ready)
            except AssertionError:
                # A port picked free can be taken before the server binds it: the kernel hands
                # bind(0) ports (SIPp's own, another test process's clients) from the range
                # free_port draws from. Seen in CI: "Error creating SIP TCP listener: Address
                # already in use". Not the server's doing: new ports, and again.
                in_use = "Address already in use" in self.log()
                if attempt == 2 or not in_use or not self._own_ports:
                    raise
                self.sip_port, self.http_port = free_port(), free_port(udp_and_tcp=False)
                self.rtp_min, self.rtp_max = rtp_range()
        raise AssertionError("unreachable")

    def _start(self, *, wait_ready: bool) -> Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        n = len(list(self.data_dir.glob("server-*.log")))
        self.log_path = self.data_dir / f"server-{n}.log"
        # The secret audit reads every server's log at the end of the run (tests/conftest.py).
        AUDIT.keep_file(self.log_path, "voicegate serve log")
        AUDIT.register_env(self.env_overrides, f"the environment of {self.log_path}")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*self.argv_prefix, sys.executable, "-m", "voicegate", "serve"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
            )
        if wait_ready:
            wait_for(self._ready, 30, f"/readyz of the server (log: {self.log_path})")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log()}")
        status, _ = self.http("/readyz")
        return status == 200

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    @property
    def sip_target(self) -> str:
        return f"{self.host}:{self.sip_port}"

    def _headers(self, key: str | None) -> dict[str, str]:
        key = self.api_key if key is None else key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def request(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        key: str | None = None,
    ) -> Answer | None:
        """Send one request to this server's API; None if nothing answered.

        Every test's HTTP exchange with voicegate goes through here, so every answer is checked
        against docs/openapi.yaml (tests/contract.py): a mismatch fails the test that asked.
        """
        request = urllib.request.Request(
            f"http://{self.host}:{self.http_port}{path}",
            data=data,
            method=method,
            headers={**self._headers(key), **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                answer = Answer(int(response.status), response.headers, response.read())
        except urllib.error.HTTPError as exc:
            answer = Answer(int(exc.code), exc.headers, exc.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None
        check_answer(method, path, answer.status, answer.content_type, answer.body)
        if answer.status >= 400:
            AUDIT.record(f"{method} {path} -> {answer.status} ({self.log_path})", answer.text)
        return answer

    def http(self, path: str, *, key: str | None = None) -> tuple[int, Any]:
        """GET ``path`` with ``key`` (default: :attr:`api_key`; "" sends none)."""
        answer = self.request("GET", path, key=key)
        if answer is None:
            return 0, None
        if path.startswith("/metrics"):
            AUDIT.record_latest(f"GET {path} of {self.log_path}", answer.text)
        decoded = answer.json() if "json" in answer.content_type else answer.text
        AUDIT.learn(decoded, f"GET {path}")
        return answer.status, decoded

    def post(self, path: str, *, key: str | None = None) -> int:
        answer = self.request("POST", path, data=b"", key=key)
        assert answer is not None, f"POST {path}: nothing answered"
        return answer.status

    def post_json(self, path: str, body: object, *, key: str | None = None) -> tuple[int, Any]:
        """POST ``body`` as JSON; the status and the decoded JSON answer."""
        answer = self.request(
            "POST",
            path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            key=key,
        )
        assert answer is not None, f"POST {path}: nothing answered"
        return answer.status, answer.json()

    def live_calls(self) -> list[dict[str, Any]]:
        status, body = self.http("/v1/calls")
        assert status == 200, body
        calls: list[dict[str, Any]] = body["calls"]
        return calls

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = self.http("/metrics")
        assert status == 200
        samples = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def sessions(self) -> list[dict[str, Any]]:
        """Every session in full (``GET /v1/sessions/{id}``), oldest first."""
        status, body = self.http("/v1/sessions?limit=500")
        assert status == 200, body
        ids = [s["session_id"] for s in body["sessions"]]
        details = []
        for session_id in reversed(ids):
            status, detail = self.http(f"/v1/sessions/{session_id}")
            assert status == 200, detail
            details.append(detail)
        return details

    def ended(self) -> list[dict[str, Any]]:
        """The ``ended`` part of every session (None while open), oldest first."""
        return [s["ended"] for s in self.sessions()]

    def open_store(self) -> SessionStore:
        """The server's store, opened here (its SQLite file, or its PostgreSQL database when
        ``VOICEGATE_STORAGE_URL`` is set for it): the server may be down."""
        from session.store.location import StoreLocation

        url = self.env_overrides.get("VOICEGATE_STORAGE_URL", "")
        return StoreLocation(url, self.data_dir / "voicegate.sqlite3").open()

    def stored_sessions(self) -> list[dict[str, Any]]:
        """Read the store directly (the server may be down): session summaries."""
        store = self.open_store()
        try:
            summaries, _ = store.list(limit=500)
            return [
                {"session_id": s.session_id, "terminal_state": s.terminal_state, "status": s.status}
                for s in summaries
            ]
        finally:
            store.close()

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            before = self.log()
            # What it is stuck on, before it is killed (voicegate/observe/stacks.py): its asyncio
            # tasks, if the loop still runs, and every thread's stack in any case.
            self.process.send_signal(signal.SIGUSR2)
            time.sleep(0.5)
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(0.5)
            self.process.kill()
            self.process.wait(timeout=10)
            raise AssertionError(
                f"server did not exit on SIGTERM:\n{before[-3000:]}\n"
                f"--- what it was doing (SIGUSR2, SIGUSR1):\n{self.log()[len(before) :]}"
            ) from None


# What the ``server_factory`` fixture gives a test: start a server with env overrides.
ServerFactory = Callable[..., Server]


@dataclass
class Sipp:
    """One SIPp run of a scenario from ``sipp-scenarios/`` against a server."""

    scenario: str
    target: str
    work_dir: Path
    calls: int = 1
    rate: float | None = None
    limit: int | None = None
    transport: str = "u1"
    extra: tuple[str, ...] = ()
    timeout_s: int = 90
    port: int | None = None  # SIPp's own SIP port; a uas-* scenario is dialled there
    local_ip: str = LOOPBACK  # the address SIPp binds (signaling and media)
    process: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        stem = Path(self.scenario).stem
        args = [
            "sipp",
            "-sf",
            str(SCENARIOS / self.scenario),
            self.target,
            "-m",
            str(self.calls),
            "-i",
            self.local_ip,
            "-p",
            str(self.port or free_port()),
            # SIPp binds its media at this port and the next three (audio, video at + 2): a
            # block of this process's RTP share, not a kernel-picked port, whose + 2 lies in the
            # other xdist process's share and may be any socket's ephemeral port (seen in CI:
            # "Unable to bind video RTP socket ... Address already in use").
            "-mp",
            str(rtp_range(4)[0]),
            "-t",
            self.transport,
            "-timeout",
            f"{self.timeout_s}s",
            "-timeout_error",
            "-nostdin",
            "-trace_err",
            "-error_file",
            str(self.work_dir / f"{stem}.errors.log"),
            "-trace_stat",
            "-stf",
            str(self.work_dir / f"{stem}.stat.csv"),
        ]
        if self.rate is not None:
            args += ["-r", str(self.rate)]
        if self.limit is not None:
            args += ["-l", str(self.limit)]
        return [a for a in args if a] + list(self.extra)

    def start(self) -> Sipp:
        # SIPp resolves play_pcap_audio paths against its working directory (notes/pjsua2.md).
        self.process = subprocess.Popen(
            self.args(), cwd=SCENARIOS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        _started_sipps.append(self)
        return self

    def wait(self, timeout: float | None = None) -> int:
        assert self.process is not None
        try:
            _, err = self.process.communicate(timeout=timeout or self.timeout_s + 30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            raise AssertionError(f"SIPp {self.scenario} did not finish") from None
        self.stderr = err.decode(errors="replace")
        return self.process.returncode

    def kill(self) -> None:
        """Stop SIPp if it still runs; safe to call after :meth:`wait` (it then does nothing)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        if process.stderr is not None and not process.stderr.closed:
            process.communicate()

    def run(self) -> int:
        return self.start().wait()

    def errors(self) -> str:
        path = self.work_dir / f"{Path(self.scenario).stem}.errors.log"
        return (path.read_text(errors="replace") if path.exists() else "") + getattr(
            self, "stderr", ""
        )


@contextlib.contextmanager
def running_server(data_dir: Path, **env: str) -> Iterator[Server]:
    server = Server(data_dir, env_overrides=env).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Provider:
    """The reference payment provider (``python -m providers.payments``) as a real process."""

    data_dir: Path
    flags: tuple[str, ...] = ()
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    host: str = LOOPBACK  # where it listens (another namespace's servers reach the gateway)

    def start(self) -> Provider:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(udp_and_tcp=False)
        self.log_path = self.data_dir / "payments.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "providers.payments",
                    "--host",
                    self.host,
                    "--port",
                    str(self.port),
                    "--db",
                    str(self.data_dir / "ledger.sqlite3"),
                    "--admin",
                    *self.flags,
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=ROOT,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        assert "listening on" in line, f"provider did not start: {line!r}"
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def tool_env(self, timeout_s: float = 2.0) -> dict[str, str]:
        """Environment that points voicegate's built-in charge tool at this provider."""
        return {
            "VOICEGATE_TOOL_CHARGE_ENDPOINT": f"{self.url}/v1/charges",
            "VOICEGATE_TOOL_CHARGE_STATUS_ENDPOINT": f"{self.url}/v1/charges/{{key}}",
            "VOICEGATE_TOOL_CHARGE_TIMEOUT_S": str(timeout_s),
        }

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def ledger(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._call("GET", "/v1/ledger")["rows"]
        return rows

    def charges(self) -> list[dict[str, Any]]:
        """Rows that moved money (not the not_started fences, not refusals)."""
        return [row for row in self.ledger() if row["status"] == "committed"]

    def set_faults(self, **faults: Any) -> None:
        self._call("POST", "/admin/faults", faults)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
