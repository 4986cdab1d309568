"""The pool: a supervisor that runs N workers behind Kamailio and keeps them running.

Each worker is ``voicegate worker --index i``: one pjsua2 endpoint on its own SIP port and RTP
slice (``config.workers``), sharing the session store. The supervisor

- starts Kamailio as the front door (``voicegate.pool.front_door``), then the workers;
- restarts a worker that exits, with exponential backoff (reset after a minute up); the new
  incarnation settles and reaps what its predecessor left open (``Runtime.start``), so nothing the
  dead one owned runs twice;
- checks each worker's ``/healthz``, and kills and replaces one that stops answering;
- takes a worker out of the dispatcher set the moment it dies, and back once it is ready;
- on SIGTERM drains: the front door stops sending calls, each worker refuses new calls and lets
  its live calls run up to ``sip.drain_deadline_s``, then the supervisor stops Kamailio and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import resource
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import aiohttp
from prometheus_client import multiprocess

from config import Settings
from config.workers import WorkerSlot, pool_name, worker_slots
from session.reaper import expire_away, parked, reap_stale
from session.resume import ResumeRecord
from session.store import SessionStore, SessionSummary, StoreError
from session.store.location import StoreLocation
from session.store.nodes import NodeWorker
from session.store.postgres import Availability
from session.store.reader import StoreReader
from session.store.writer import StoreWriter
from session.vocabulary import OwnerId
from voicegate.observe.pool_metrics import PoolMetrics
from voicegate.pool.cluster import NodeKeeper
from voicegate.pool.forkserver import (
    ForkedProcess,
    ForkServer,
    ForkServerError,
    become_subreaper,
    reap_orphans,
)
from voicegate.pool.front_door import FrontDoorError, Kamailio, front_door_for, unix_socket_path_ok
from voicegate.pool.process_tree import die_with_parent

T = TypeVar("T")
log = logging.getLogger("voicegate.pool.supervisor")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A worker up this long is healthy again: its next death restarts after the base backoff.
STABLE_AFTER_S = 60.0
_READY_POLL_S = 0.1
# Beyond the drain deadline and the shutdown grace, how long a worker may take to exit.
_EXIT_SLACK_S = 15.0
_FRONT_DOOR_RESTART_S = 1.0


# A worker dying again soon waits at least this long, even with a zero base backoff.
MIN_REPEAT_BACKOFF_S = 0.1


def next_backoff(previous_s: float | None, *, up_s: float, base_s: float, cap_s: float) -> float:
    """Delay before restarting a worker that was up ``up_s`` and had waited ``previous_s``.

    The first restart, and one after a stable run, waits ``base_s``; each quick death after that
    doubles the wait, up to ``cap_s``. A crash loop never restarts back to back.
    """
    if previous_s is None or up_s >= STABLE_AFTER_S:
        return base_s
    floor = max(base_s, MIN_REPEAT_BACKOFF_S)
    return min(max(previous_s * 2, floor), max(cap_s, MIN_REPEAT_BACKOFF_S))


class SupervisorStartError(Exception):
    pass


class _Once:
    """A callable that calls ``action`` the first time only."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action: Callable[[], None] | None = action

    def __call__(self) -> None:
        action, self._action = self._action, None
        if action is not None:
            action()


def raise_open_files_limit() -> None:
    """Lift this process's soft limit of open files to its hard limit, for it and its children.

    Each worker holds a few dozen descriptors (SIP and RTP sockets, the store, the control API,
    its agent links) and Kamailio one per TCP or TLS connection; a soft limit of 1024, the
    common default, is reached by a large pool's front door long before the hard limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class WorkerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    RESTARTING = "restarting"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(eq=False)
class Worker:
    slot: WorkerSlot
    state: WorkerState = WorkerState.STARTING
    proc: asyncio.subprocess.Process | ForkedProcess | None = None
    owner: str | None = None  # "<name>/<incarnation>" of the live process, from its /healthz
    restarts: int = 0
    started_at: float = 0.0
    backoff_s: float | None = None  # the last restart's wait; None before the first
    last_exit: int | None = None
    failed_checks: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    def snapshot(self) -> dict[str, object]:
        return {
            "index": self.slot.index,
            "name": self.slot.name,
            "state": self.state.value,
            "pid": self.pid,
            "owner": self.owner,
            "sip": self.slot.sip_uri,
            "control": self.slot.control_url,
            "rtp_ports": [self.slot.rtp_port_min, self.slot.rtp_port_max],
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }


# Why a worker's last life ended (what _watch returns).
RESTART_REASONS = ("exited", "unresponsive", "start_timeout")


class Supervisor:
    def __init__(self, settings: Settings, config_path: str | None) -> None:
        self.settings = settings
        self.config_path = config_path
        self.pool = settings.pool
        data_dir = Path(settings.storage.data_dir)
        self.run_dir = data_dir / "run"
        self.metrics_dir = self.run_dir / "metrics"
        self.metrics = PoolMetrics()
        self.workers = [Worker(slot) for slot in worker_slots(settings)]
        # Each worker's series exist at 0 from the start, so that the restart alert's increase()
        # sees a worker's first restarts (a series born at 1 has no increase to Prometheus).
        for worker in self.workers:
            self.metrics.health_failures.labels(worker.slot.name)
            for reason in RESTART_REASONS:
                self.metrics.restarts.labels(worker.slot.name, reason)
        self.owner = OwnerId(f"{pool_name(settings)}.supervisor", uuid.uuid4().hex[:12]).format()
        self.stopping = False
        self.front: Kamailio | None = None
        self.location = StoreLocation.of(settings.storage)
        self.availability = Availability()
        self._reader: StoreReader | None = None
        self._writer: StoreWriter | None = None
        self._http: aiohttp.ClientSession | None = None
        self.keeper: NodeKeeper | None = None  # a node of a cluster (docs/cluster.md)
        self._wake = asyncio.Event()  # set when stopping: ends backoff sleeps at once
        self._front_task: asyncio.Task[None] | None = None
        self.fork_server: ForkServer | None = None
        # Workers between their start and their readiness: a bounded wave (pool.start_concurrency).
        self._starting = asyncio.Semaphore(self.pool.start_concurrency)

    # --- start ----------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.pool.front_door:
            door = front_door_for(
                self.settings.sip.address,
                self.settings.sip.port,
                self.run_dir,
                self.pool.probe_interval_s,
                self.pool.source_max_rate,
                media_ipv6=":" in self.settings.media.address,
                # Kamailio terminates SIP over TLS; the workers listen on loopback UDP only.
                tls_port=self.settings.sip.tls_port,
                tls_cert_file=self.settings.sip.tls_cert_file,
                tls_key_file=self.settings.sip.tls_key_file,
            )
            if not unix_socket_path_ok(door.ctl_socket):
                raise SupervisorStartError(
                    f"storage.data_dir is too deep for a unix socket ({door.ctl_socket})"
                )
            try:
                self.front = Kamailio(
                    self.pool.kamailio,
                    door,
                    [(w.slot.name, w.slot.sip_uri) for w in self.workers],
                )
            except FrontDoorError as exc:
                raise SupervisorStartError(str(exc)) from exc
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Counters of an earlier run's processes would be summed in again: start empty.
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        self.metrics_dir.mkdir(parents=True)
        raise_open_files_limit()
        if self.pool.fork_server:
            await self._start_fork_server()
        # Opening the store creates an empty one once, before the workers race to (and checks
        # its schema: voicegate migrate steps an older one up).
        location, availability = self.location, self.availability
        self._writer = StoreWriter(
            lambda: location.open(retry=True, availability=availability), name="pool-store-writer"
        )
        self._reader = StoreReader(
            lambda: location.open(availability=availability), name="pool-store-reader"
        )
        self._http = aiohttp.ClientSession()
        if self.settings.node.name:
            self.keeper = NodeKeeper(
                self.settings,
                incarnation=OwnerId.parse(self.owner).incarnation,
                session_owner=self.owner,
                workers=[NodeWorker(w.slot.name, w.slot.sip_uri) for w in self.workers],
                write=self.write,
                read=self.read,
                http=self.http,
                metrics=self.metrics,
            )
            try:
                await self.keeper.start()
            except StoreError as exc:
                raise SupervisorStartError(f"cannot register node: {exc}") from exc
        if self.front is not None:
            try:
                await self.front.start()
            except FrontDoorError as exc:
                await self.front.stop()
                raise SupervisorStartError(str(exc)) from exc
            self.metrics.front_door_up.set(1)
            self._front_task = asyncio.create_task(self._watch_front_door(), name="front-door")
        for worker in self.workers:
            worker.task = asyncio.create_task(self._keep_running(worker), name=worker.slot.name)
        self._count_states()
        log.info(
            "pool.started",
            extra={
                "workers": len(self.workers),
                "calls_per_worker": self.pool.calls_per_worker,
                "front_door": (
                    f"{self.settings.sip.address}:{self.settings.sip.port}"
                    if self.front is not None
                    else "elsewhere"
                ),
            },
        )

    def _worker_env(self) -> dict[str, str]:
        # numpy's OpenBLAS would start a thread pool in every worker, for nothing a worker does.
        return {"OPENBLAS_NUM_THREADS": "1", **os.environ, MULTIPROC_ENV: str(self.metrics_dir)}

    async def _start_fork_server(self) -> None:
        """Start the fork server (voicegate/pool/forkserver.py); without it, workers start as
        their own interpreters, as with pool.fork_server = false."""
        try:
            become_subreaper()
            server = ForkServer(self.config_path, self._worker_env())
            await server.start()
        except (OSError, ForkServerError) as exc:
            log.warning("pool.fork_server_unavailable", extra={"error": str(exc)})
            return
        self.fork_server = server
        log.info("pool.fork_server_started", extra={"pid": server.pid})

    async def write(self, job: Callable[[SessionStore], T]) -> T:
        """``job(store)`` on the writer thread (session/store/writer.py), never on the loop."""
        assert self._writer is not None
        return await asyncio.wrap_future(self._writer.submit(job))

    def node_of(self, owner: str | None) -> str | None:
        """The node whose process ``owner`` is (its workers are ``<node>.<i>``); None outside a
        cluster."""
        if self.keeper is None or owner is None:
            return None
        return owner.partition("/")[0].partition(".")[0]

    async def read(self, job: Callable[[SessionStore], T]) -> T:
        """``job(store)`` on a reader thread (session/store/reader.py), never on the loop."""
        assert self._reader is not None
        return await asyncio.wrap_future(self._reader.submit(job))

    # --- one worker's life ----------------------------------------------------------------------

    def _set_state(self, worker: Worker, state: WorkerState) -> None:
        if worker.state is not state:
            worker.state = state
            self._count_states()

    def _count_states(self) -> None:
        for state in WorkerState:
            self.metrics.workers.labels(state.value).set(
                sum(1 for w in self.workers if w.state is state)
            )

    async def _spawn(self, worker: Worker) -> None:
        args = ["worker", "--index", str(worker.slot.index)]
        if self.config_path:
            args += ["--config", self.config_path]
        env = self._worker_env()
        worker.proc = None
        if self.fork_server is not None:
            try:
                worker.proc = await self.fork_server.fork(args, env)
            except (OSError, ForkServerError) as exc:
                # The next start tries a new fork server; this one must not wait for it.
                log.warning(
                    "pool.fork_failed", extra={"worker": worker.slot.name, "error": str(exc)}
                )
        if worker.proc is None:
            worker.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "voicegate",
                *args,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        worker.started_at = time.monotonic()
        worker.owner = None
        worker.failed_checks = 0
        self._set_state(worker, WorkerState.STARTING)
        log.info(
            "worker.started",
            extra={"worker": worker.slot.name, "pid": worker.proc.pid, "sip": worker.slot.sip_uri},
        )

    async def _keep_running(self, worker: Worker) -> None:
        while not self.stopping:
            await self._starting.acquire()
            started = _Once(self._starting.release)
            try:
                if self.stopping:
                    break
                await self._spawn(worker)
                reason = await self._watch(worker, started)
            finally:
                started()
            await self._reap_process(worker)
            if self.stopping:
                break
            worker.restarts += 1
            self.metrics.restarts.labels(worker.slot.name, reason).inc()
            up_s = time.monotonic() - worker.started_at
            worker.backoff_s = next_backoff(
                worker.backoff_s,
                up_s=up_s,
                base_s=self.pool.restart_backoff_s,
                cap_s=self.pool.restart_backoff_max_s,
            )
            self._set_state(worker, WorkerState.RESTARTING)
            log.warning(
                "worker.restarting",
                extra={
                    "worker": worker.slot.name,
                    "reason": reason,
                    "exit_status": worker.last_exit,
                    "up_s": round(up_s, 1),
                    "backoff_s": worker.backoff_s,
                },
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=worker.backoff_s)
        self._set_state(worker, WorkerState.STOPPED)

    async def _watch(self, worker: Worker, started: Callable[[], None]) -> str:
        """Until the worker process is gone: its readiness, then its health. Returns why it went.
        ``started()`` once it is ready (or gone): the next worker waiting may start."""
        assert worker.proc is not None
        proc = worker.proc
        exited = asyncio.ensure_future(proc.wait())
        loop = asyncio.get_running_loop()
        try:
            deadline = loop.time() + self.pool.start_timeout_s
            while not exited.done():
                if self.stopping:
                    await exited
                    return "stopped"
                if await self._probe(worker, "/readyz"):
                    break
                if loop.time() > deadline:
                    log.error("worker.start_timeout", extra={"worker": worker.slot.name})
                    await self._kill(worker, exited)
                    return "start_timeout"
                await asyncio.wait({exited}, timeout=_READY_POLL_S)
            else:
                return "exited"
            started()
            self._set_state(worker, WorkerState.READY)
            log.info("worker.ready", extra={"worker": worker.slot.name, "owner": worker.owner})
            if self.front is not None:
                await self.front.set_worker(worker.slot.sip_uri, "ap")
            while True:
                await asyncio.wait({exited}, timeout=self.pool.health_interval_s)
                if exited.done():
                    return "exited"
                if self.stopping:
                    await exited
                    return "stopped"
                if await self._probe(worker, "/healthz"):
                    if worker.state is WorkerState.UNHEALTHY:
                        self._set_state(worker, WorkerState.READY)
                    worker.failed_checks = 0
                    continue
                worker.failed_checks += 1
                self.metrics.health_failures.labels(worker.slot.name).inc()
                self._set_state(worker, WorkerState.UNHEALTHY)
                if worker.failed_checks >= self.pool.health_failures:
                    log.error(
                        "worker.unresponsive",
                        extra={"worker": worker.slot.name, "failed_checks": worker.failed_checks},
                    )
                    await self._kill(worker, exited)
                    return "unresponsive"
        finally:
            if not exited.done():
                exited.cancel()

    async def _probe(self, worker: Worker, path: str) -> bool:
        assert self._http is not None
        timeout = aiohttp.ClientTimeout(total=self.pool.health_timeout_s)
        try:
            async with self._http.get(worker.slot.control_url + path, timeout=timeout) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        # Both answers name the incarnation: how the supervisor tells a new one from the last.
        if isinstance(body, dict) and isinstance(body.get("owner"), str):
            worker.owner = body["owner"]
        return True

    async def _kill(self, worker: Worker, exited: asyncio.Future[int]) -> None:
        assert worker.proc is not None
        with contextlib.suppress(ProcessLookupError):
            worker.proc.kill()
        await exited

    async def _reap_process(self, worker: Worker) -> None:
        """After a worker process ended: forget its live gauges, take it out of the front door."""
        assert worker.proc is not None
        pid, status = worker.proc.pid, worker.proc.returncode
        worker.last_exit = status
        multiprocess.mark_process_dead(pid, str(self.metrics_dir))  # type: ignore[no-untyped-call]
        if self.fork_server is not None:
            reap_orphans()  # what the dead worker left running, adopted by this subreaper
        if self.front is not None and not self.stopping:
            await self.front.set_worker(worker.slot.sip_uri, "ip")
        level = logging.INFO if self.stopping and status == 0 else logging.WARNING
        log.log(
            level, "worker.exited", extra={"worker": worker.slot.name, "pid": pid, "status": status}
        )

    async def _watch_front_door(self) -> None:
        """Kamailio is the pool's only way in: if it dies, start it again."""
        while self.front is not None:
            status = await self.front.wait_exit()
            if self.stopping:
                return
            self.metrics.front_door_up.set(0)
            self.metrics.front_door_restarts.inc()
            if self.fork_server is not None:
                reap_orphans()  # Kamailio's children, adopted by this subreaper
            self.metrics.fold_front_door_counters()
            log.error("front_door.exited", extra={"status": status})
            await asyncio.sleep(_FRONT_DOOR_RESTART_S)
            try:
                await self.front.start()
            except FrontDoorError as exc:
                log.error("front_door.restart_failed", extra={"error": str(exc)})
                continue
            self.metrics.front_door_up.set(1)
            for worker in self.workers:
                if worker.state is not WorkerState.READY:
                    await self.front.set_worker(worker.slot.sip_uri, "ip")

    # --- the control plane's view ---------------------------------------------------------------

    @property
    def resume_ttl_s(self) -> float:
        return self.settings.session.resume_ttl_s

    async def record_resume(self, record: ResumeRecord) -> None:
        assert self._writer is not None
        await asyncio.wrap_future(self._writer.submit(lambda store: store.record_handle(record)))
        self.metrics.resume_issued.inc()

    async def reap(self) -> list[str]:
        """Finalise sessions whose process is gone, on the writer thread (off the loop)."""
        assert self._writer is not None
        now, after_s, me = time.time(), self.settings.session.reap_after_s, self.owner
        reaped = await asyncio.wrap_future(
            self._writer.submit(
                lambda store: reap_stale(store, now=now, stale_after_s=after_s, me=me)
            )
        )
        if reaped:
            self.metrics.sessions_reaped.inc(len(reaped))
            log.warning("sessions.reaped", extra={"count": len(reaped)})
        # Transferred sessions nobody came back to (session/away.py): completed, not reaped.
        await asyncio.wrap_future(
            self._writer.submit(lambda store: expire_away(store, me=me, now=now))
        )
        return reaped

    def worker_of(self, owner: str | None) -> Worker | None:
        """The worker whose current incarnation is ``owner``, if it is still that one."""
        if owner is None:
            return None
        for worker in self.workers:
            if worker.owner == owner and worker.pid is not None:
                return worker
        return None

    def is_live(self, summary: SessionSummary) -> bool:
        if summary.terminal_state is not None:
            return False
        if self.worker_of(summary.owner) is not None:
            return True
        # Held by a worker of another node that is up (a parked session has no call).
        node = self.node_of(summary.owner)
        return (
            self.keeper is not None
            and node is not None
            and node != self.keeper.name
            and self.keeper.is_up(node)
            and not parked(summary)
        )

    @property
    def ready(self) -> bool:
        front_ok = self.front.running if self.front is not None else not self.pool.front_door
        return (
            not self.stopping
            and front_ok
            and any(w.state is WorkerState.READY for w in self.workers)
        )

    async def refresh_front_door_counters(self) -> None:
        if self.front is not None and self.front.running:
            self.metrics.front_door_counters = await self.front.counters()

    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None
        return self._http

    # --- stop -----------------------------------------------------------------------------------

    async def drain(self, hurry: asyncio.Event) -> None:
        """Stop sending calls in, let the workers drain and exit, then stop the front door."""
        self.stopping = True
        self._wake.set()
        log.info("pool.drain", extra={"deadline_s": self.settings.sip.drain_deadline_s})
        if self.keeper is not None:
            await self.keeper.drain()
        if self.front is not None:
            for worker in self.workers:
                await self.front.set_worker(worker.slot.sip_uri, "d")
        for worker in self.workers:
            self._signal(worker, signal.SIGTERM)
            if worker.pid is not None:
                self._set_state(worker, WorkerState.DRAINING)
        tasks = [w.task for w in self.workers if w.task is not None]
        limit = self.settings.sip.drain_deadline_s + self.settings.sip.shutdown_grace_s
        hurried = asyncio.ensure_future(hurry.wait())
        everyone = asyncio.ensure_future(asyncio.wait(tasks, timeout=limit + _EXIT_SLACK_S))
        await asyncio.wait({hurried, everyone}, return_when=asyncio.FIRST_COMPLETED)
        if hurried.done() and not everyone.done():
            log.info("pool.drain_skipped")
            for worker in self.workers:
                self._signal(worker, signal.SIGTERM)  # a worker's second signal skips its drain
        await everyone
        hurried.cancel()
        for worker in self.workers:
            if worker.pid is not None:
                log.error("worker.did_not_exit", extra={"worker": worker.slot.name})
                self._signal(worker, signal.SIGKILL)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        await self.close()

    def _signal(self, worker: Worker, signum: int) -> None:
        if worker.pid is not None and worker.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                worker.proc.send_signal(signum)

    async def close(self) -> None:
        self.stopping = True
        self._wake.set()
        for worker in self.workers:
            self._signal(worker, signal.SIGKILL)
            if worker.task is not None and not worker.task.done():
                worker.task.cancel()
        if self._front_task is not None:
            self._front_task.cancel()
        if self.front is not None:
            await self.front.stop()
            self.metrics.front_door_up.set(0)
        if self.keeper is not None:
            await self.keeper.stop()
            self.keeper = None
        if self.fork_server is not None:
            await self.fork_server.stop()
            self.fork_server.close()
        if self._http is not None:
            await self._http.close()
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
        if self._reader is not None:
            await asyncio.to_thread(self._reader.close)
        log.info("pool.stopped")
