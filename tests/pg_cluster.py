"""Throw-away PostgreSQL clusters for the shared store's tests (docs/storage.md).

The PostgreSQL store is tested against a real server, and one the suite owns: a cluster made with
``initdb`` in a temporary directory and served by ``pg_ctl`` on a free port of 127.0.0.1. The
machine's own server (port 5432, if there is one) is never used: a fresh machine may not run one,
and tests that kill and restart their server must not take down somebody else's.

Every failure raises :class:`PgClusterError` saying what failed, with the command's output and the
tail of the server's log, so that a test which cannot get its database fails with the reason
rather than skipping.

initdb refuses to run as root; as root the commands run as the unprivileged ``postgres`` user (the
Debian package's) through ``runuser``, in a directory that user owns.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import grp
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import LiteralString

HOST = "127.0.0.1"
_USER = "postgres"  # the cluster's superuser, and the OS user the server runs as under root
_PREFIX = "voicegate-pg-"
_START_ATTEMPTS = 5  # fresh ports tried when the chosen one was taken before the server bound it
_START_TIMEOUT_S = 60
_COMMAND_TIMEOUT_S = 120
_NOT_FOUND = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found: run scripts/bootstrap"
    " (Debian package postgresql)"
)
# What the postmaster logs when its port was taken between our probe and its bind.
_PORT_TAKEN = re.compile(r"could not bind|Address already in use|could not create any TCP/IP")


class PgClusterError(RuntimeError):
    """A throw-away cluster could not be made, started, stopped or used (the message says why)."""


class _PortTakenOnListen(PgClusterError):
    """The port was free on 127.0.0.1 but taken on a ``listen`` address: another port may do."""


def _has_server_binaries(directory: str) -> bool:
    return all(os.access(os.path.join(directory, name), os.X_OK) for name in ("initdb", "pg_ctl"))


def _version_key(bindir: str) -> tuple[int, ...]:
    # /usr/lib/postgresql/15/bin -> (15,): numeric, so that 10 sorts above 9.6.
    name = Path(bindir).parent.name
    return tuple(int(part) for part in re.findall(r"\d+", name))


def find_bindir() -> str:
    """The directory holding ``initdb`` and ``pg_ctl``.

    Debian keeps them off PATH, in /usr/lib/postgresql/VERSION/bin; ``pg_config --bindir`` names
    that directory when the matching server is installed (the client-only pg_config may name one
    without them, hence the check). Then the newest /usr/lib/postgresql/*/bin, then PATH.
    """
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            result = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=False
            )
            if result.returncode == 0 and result.stdout.strip():
                candidates.append(result.stdout.strip())
    debian = glob.glob("/usr/lib/postgresql/*/bin")
    candidates.extend(sorted(debian, key=_version_key, reverse=True))
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(os.path.dirname(initdb))
    for candidate in candidates:
        if _has_server_binaries(candidate):
            return candidate
    raise PgClusterError(_NOT_FOUND)


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now (the kernel's pick; it may be taken again before the
    server binds it, which :meth:`PgCluster.start` retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _traversable_by(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` may enter every directory from / down to ``path`` (os.access answers only
    for us, root, who may enter anything)."""
    groups = {group.gr_gid for group in grp.getgrall() if user.pw_name in group.gr_mem}
    groups.add(user.pw_gid)
    for directory in [path, *path.parents]:
        info = directory.stat()
        if info.st_uid == user.pw_uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid in groups:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def _owner_stamp(pid: int) -> str:
    # The pid namespace too: a pid means nothing to a process of another container sharing /tmp.
    return f"{pid} {_pid_namespace()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class PgCluster:
    """One throw-away cluster: a data directory, its log and its socket under one temporary
    directory, served on :attr:`port` of 127.0.0.1 with trust authentication for ``postgres``.

    The data survives :meth:`stop`, :meth:`kill` and :meth:`restart` (the outage tests rely on it);
    :meth:`remove` deletes everything. A cluster its process forgot (the process was killed) is
    stopped and deleted by the next cluster started on the machine.

    ``listen``: addresses served besides 127.0.0.1 (a network namespace's gateway, see
    tests/netns.py), each trusting itself; ``trust``: networks (``10.200.0.0/24``) whose clients
    are trusted too, as 127.0.0.1's are.
    """

    def __init__(
        self,
        bindir: str | None = None,
        *,
        listen: tuple[str, ...] = (),
        trust: tuple[str, ...] = (),
    ) -> None:
        self._bindir = bindir
        self._listen = listen
        self._trust = trust
        self._base: Path | None = None
        self._port: int | None = None
        self._running = False
        self._as_user: pwd.struct_passwd | None = None
        self.start_seconds: float | None = None  # how long the last start() took, initdb included

    # --- where it is -------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise PgClusterError("the cluster has no port: it was never started")
        return self._port

    @property
    def directory(self) -> Path:
        """The temporary directory holding ``data/``, ``server.log`` and the Unix socket."""
        if self._base is None:
            raise PgClusterError("the cluster has no directory: it was never started")
        return self._base

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def running(self) -> bool:
        return self._running

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{_USER}@{HOST}:{self.port}/{dbname}"

    def url_on(self, address: str, dbname: str = "postgres") -> str:
        """The URL through ``address``, one of ``listen``."""
        host = f"[{address}]" if ":" in address else address
        return f"postgresql://{_USER}@{host}:{self.port}/{dbname}"

    # --- life cycle --------------------------------------------------------------------------

    def start(self) -> PgCluster:
        """Make the cluster (first call) and start its server, on a fresh free port the first
        time and on the same port after a stop or kill. Returns self."""
        if self._running:
            return self
        for address in self._listen:
            # Bound by nobody, only asked: an address this machine lacks fails here, not as a
            # server that started without it.
            with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
                try:
                    probe.bind((address, 0))
                except OSError as error:
                    raise PgClusterError(f"cannot listen on {address}: {error}") from error
        began = time.monotonic()
        if self._base is None:
            self._init()
        if self._port is None:
            self._start_on_free_port()
        else:
            self._start_server(self._port)
        self.start_seconds = time.monotonic() - began
        return self

    def restart(self) -> PgCluster:
        """Start again on the same port and data directory (stopping first if it runs): what a
        database coming back after an outage looks like to its clients."""
        if self._port is None:
            raise PgClusterError("restart(): the cluster was never started")
        if self._running:
            self.stop()
        return self.start()

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: sessions are disconnected, data is checkpointed). A
        stopped cluster is left as it is."""
        if not self._running:
            return
        try:
            self._run(
                "pg_ctl",
                "-D",
                str(self.data_dir),
                "-m",
                mode,
                "-w",
                "-t",
                str(_START_TIMEOUT_S),
                "stop",
                what=f"stopping the cluster ({mode})",
            )
        except PgClusterError:
            # A server that died by itself (a crash, the OOM killer) cannot be stopped, and need
            # not be: the stop's failure matters only if it is still running.
            if self._server_runs():
                raise
        self._running = False

    def _server_runs(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.data_dir), "status", what="pg_ctl status")
        except PgClusterError:
            return False  # exit status 3: no server running (4: no data directory)
        return True

    def kill(self) -> None:
        """Stop the server abruptly, the way a crash or an outage does: no checkpoint, clients
        cut off; the next start runs crash recovery from the WAL."""
        self.stop(mode="immediate")

    def remove(self) -> None:
        """Stop the server if it runs and delete the whole directory."""
        atexit.unregister(self._remove_at_exit)
        try:
            if self._running:
                try:
                    self.stop()
                except PgClusterError:
                    self.kill()  # immediate stop, still from the pid file
        finally:
            if self._base is not None:
                shutil.rmtree(self._base, ignore_errors=True)
                self._base = None
                self._port = None
                self._running = False

    # --- databases ---------------------------------------------------------------------------

    def create_database(self, name: str) -> None:
        self._admin("CREATE DATABASE {}", name, what=f"creating database {name!r}")

    def drop_database(self, name: str) -> None:
        """Drop ``name``, terminating the sessions still connected to it (PG 13+)."""
        self._admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", name, what=f"dropping {name!r}")

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server's log ("" if there is none yet)."""
        if self._base is None:
            return ""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    # --- internals ---------------------------------------------------------------------------

    def _admin(self, statement: LiteralString, name: str, *, what: str) -> None:
        try:
            import psycopg
            from psycopg import sql
        except ImportError as error:
            missing = f"{what}: psycopg is not installed: run scripts/bootstrap"
            raise PgClusterError(missing) from error
        query = sql.SQL(statement).format(sql.Identifier(name))
        try:
            with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=10) as conn:
                conn.execute(query)
        except psycopg.Error as error:
            raise PgClusterError(self._failure(what, str(error))) from error

    def _prepare(self) -> None:
        """Find the binaries and the user to run them as: what any command needs."""
        bindir = self._bindir or find_bindir()
        if not _has_server_binaries(bindir):
            raise PgClusterError(f"{_NOT_FOUND} (looked in {bindir})")
        self._bindir = bindir
        if os.geteuid() == 0:
            self._as_user = self._unprivileged_user()

    def _init(self) -> None:
        self._prepare()
        _reap_forgotten(self._parent_dir(), self._bindir)
        self._base = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=self._parent_dir()))
        # The owner: how a later cluster tells a forgotten one from a live one.
        (self._base / "owner").write_text(_owner_stamp(os.getpid()))
        if self._as_user is not None:
            os.chown(self._base, self._as_user.pw_uid, self._as_user.pw_gid)
        atexit.register(self._remove_at_exit)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            _USER,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",  # C: the same collation on every machine
            what="initdb",
        )
        clients = [f"{address}/{32 if ':' not in address else 128}" for address in self._listen]
        if clients or self._trust:
            # Appended by us, root, to the postgres user's file: its owner and mode stay.
            with open(self.data_dir / "pg_hba.conf", "a") as hba:
                for network in [*clients, *self._trust]:
                    hba.write(f"host all all {network} trust\n")

    def _unprivileged_user(self) -> pwd.struct_passwd:
        try:
            user = pwd.getpwnam(_USER)
        except KeyError:
            raise PgClusterError(
                f"running as root, and initdb refuses to: the unprivileged user {_USER!r} it"
                " would run as does not exist (Debian package postgresql: run scripts/bootstrap)"
            ) from None
        if shutil.which("runuser") is None:
            raise PgClusterError(
                f"running as root, and initdb refuses to: runuser (util-linux), to run it as"
                f" {_USER!r}, is not on PATH"
            )
        return user

    def _parent_dir(self) -> str:
        """Where the temporary directory goes: the usual temporary directory, unless the
        ``postgres`` user could not reach into it (a private TMPDIR under /root), then /tmp."""
        parent = tempfile.gettempdir()
        if self._as_user is not None and not _traversable_by(Path(parent), self._as_user):
            parent = "/tmp"
        return parent

    def _start_on_free_port(self) -> None:
        failures: list[str] = []
        for _ in range(_START_ATTEMPTS):
            port = free_port()
            try:
                self._start_server(port)
            except PgClusterError as error:
                taken = isinstance(error, _PortTakenOnListen)
                if not taken and not _PORT_TAKEN.search(self.log_tail(10)):
                    raise
                failures.append(f"port {port}: {error}")
                continue
            return
        raise PgClusterError(
            f"the cluster did not start: every one of {_START_ATTEMPTS} free ports was taken"
            " before the server bound it:\n" + "\n".join(failures)
        )

    def _start_server(self, port: int) -> None:
        socket_dir = shlex.quote(str(self.directory))  # pg_ctl hands -o to a shell
        addresses = ",".join([HOST, *self._listen])
        logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        options = (
            f"-p {port} -k {socket_dir} -c listen_addresses={shlex.quote(addresses)}"
            " -c fsync=on -c synchronous_commit=on"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-o",
            options,
            "-w",
            "-t",
            str(_START_TIMEOUT_S),
            "-l",
            str(self.log_path),
            "start",
            what=f"starting the cluster on port {port}",
        )
        self._port = port
        self._running = True
        if self._listen:
            # The server starts if any one address binds, and only logs the others.
            with open(self.log_path, errors="replace") as log:
                log.seek(logged)
                unbound = [line for line in log if "could not bind" in line]
            if unbound:
                self.stop()
                failure = f"the cluster on port {port} does not listen on every address"
                taken = any("Address already in use" in line for line in unbound)
                error_type = _PortTakenOnListen if taken else PgClusterError
                raise error_type(self._failure(failure, "".join(unbound).strip()))

    def _run(self, program: str, *args: str, what: str) -> None:
        assert self._bindir is not None
        command = [os.path.join(self._bindir, program), *args]
        if self._as_user is not None:
            command = ["runuser", "-u", self._as_user.pw_name, "--", *command]
        # PG* variables of the caller's shell (PGPORT, PGDATA, ...) would redirect the commands.
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                env=env,
                # Our own cwd may be closed to the postgres user, and initdb resolves it.
                cwd=self._base or "/",
                timeout=_COMMAND_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise PgClusterError(
                self._failure(f"{what}: no answer in {_COMMAND_TIMEOUT_S} s", _output(error))
            ) from error
        except OSError as error:
            raise PgClusterError(self._failure(f"{what}: {error}", "")) from error
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise PgClusterError(
                self._failure(f"{what} failed (exit status {result.returncode})", output)
            )

    def _failure(self, what: str, output: str) -> str:
        message = what
        if output:
            message += f"\n--- output ---\n{output}"
        tail = self.log_tail()
        if tail:
            message += f"\n--- {self.log_path} (last lines) ---\n{tail}"
        return message

    def _remove_at_exit(self) -> None:
        # A session that ended without teardown (an interrupted run) must not leave a server.
        with contextlib.suppress(Exception):
            self.remove()


def _output(error: subprocess.TimeoutExpired) -> str:
    parts = [error.stdout, error.stderr]
    return "".join(
        part.decode(errors="replace") if isinstance(part, bytes) else part or "" for part in parts
    ).strip()


def _reap_forgotten(parent: str, bindir: str | None) -> None:
    """Stop and delete the clusters whose owning process is gone (killed before its teardown or
    atexit ran), so that interrupted runs do not pile up servers on the machine."""
    for base in glob.glob(os.path.join(parent, _PREFIX + "*")):
        try:
            pid, namespace = Path(base, "owner").read_text().split(" ", 1)
            owner = int(pid)
        except (OSError, ValueError):
            continue  # not ours, or still being made
        if namespace != _pid_namespace() or namespace == "?" or _alive(owner):
            continue
        if Path(base, "data", "postmaster.pid").exists():
            forgotten = PgCluster(bindir)
            forgotten._base = Path(base)
            forgotten._running = True
            with contextlib.suppress(PgClusterError):
                forgotten._prepare()
                forgotten.kill()  # a stale pid file (the server died too) fails here: fine
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def running_cluster(bindir: str | None = None) -> Iterator[PgCluster]:
    """A started cluster, removed at exit (also when the start fails half-way)."""
    cluster = PgCluster(bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()
