"""``voicegate serve``, ``worker``, ``migrate``, ``front-door-config`` and ``check-config``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
from pathlib import Path

from aiohttp import web

from agents.loading import AgentLoadError
from config import ConfigError, Settings, load_settings
from config.rules import Invalid, name_token
from config.workers import worker_settings, worker_slots
from session.store import StoreError
from session.store.location import StoreLocation
from session.store.migrations import SchemaMismatch
from session.store.nodes import NodeRecord, NodeState
from telephony.endpoint import TelephonyStartError
from voicegate.control.http_api import make_app
from voicegate.control.http_rules import app_runner as app_runner_for
from voicegate.control.pool_api import make_pool_app
from voicegate.observe.logs import setup_logging
from voicegate.observe.stacks import dump_tasks_on_signal, dump_threads_on_signal
from voicegate.pool.front_door import front_door_for
from voicegate.pool.kamailio_config import render_config, render_dispatcher_list, render_tls_config
from voicegate.pool.supervisor import Supervisor, SupervisorStartError
from voicegate.runtime import Runtime, agent_factories, prompt_problems
from voicegate.signals import stop_signals
from voicegate.tls_files import tls_problems

log = logging.getLogger("voicegate")

EXIT_CONFIG = 2
EXIT_START = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voicegate", description="SIP voice-agent server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="answer calls (embedded defaults without --config)")
    serve.add_argument("--config", metavar="FILE", help="TOML settings file")
    worker = sub.add_parser(
        "worker", help="run one worker of a pool (the supervisor of `serve` starts these)"
    )
    worker.add_argument("--config", metavar="FILE", help="TOML settings file")
    worker.add_argument("--index", type=int, required=True, help="the worker's slot in the pool")
    door = sub.add_parser(
        "front-door-config",
        help="write the Kamailio front door's configuration (for workers on several hosts)",
    )
    door.add_argument("--config", metavar="FILE", help="TOML settings file")
    door.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="NAME=SIP_URI",
        help="a worker, e.g. hostb.0=sip:10.0.0.12:5100 (repeat; default: this host's pool)",
    )
    door.add_argument(
        "--from-store",
        action="store_true",
        help="list every node of the cluster from the store's node registry (storage.url)",
    )
    door.add_argument(
        "--nodes-file",
        metavar="FILE",
        help='list the nodes of a JSON file: {"nodes": [{"name": ..., "workers": [{"name": ...,'
        ' "sip": ...}]}]}, as GET /v1/cluster answers',
    )
    door.add_argument("--run-dir", default="/run/voicegate-front", help="Kamailio's runtime dir")
    door.add_argument("--out", default=".", help="directory to write the two files into")
    door.add_argument(
        "--list-file",
        help="where Kamailio will read dispatcher.list (default: the written one, absolute)",
    )
    migrate = sub.add_parser(
        "migrate", help="create the session store or step its schema up to this release's"
    )
    migrate.add_argument("--config", metavar="FILE", help="TOML settings file")
    check = sub.add_parser("check-config", help="validate settings without starting")
    check.add_argument("file", nargs="?", metavar="FILE", help="TOML settings file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    path = args.file if args.command == "check-config" else args.config
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        print(f"voicegate: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        # Importing the user's agent is part of checking the config: a typo stops start-up.
        agent_factories(settings)
    except AgentLoadError as exc:
        print(f"voicegate: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for problem in [*prompt_problems(settings), *tls_problems(settings)]:
        print(f"voicegate: config error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "check-config":
        print(f"voicegate: config OK ({path or 'embedded defaults'})")
        return 0
    location = StoreLocation.of(settings.storage)
    if args.command == "migrate":
        return migrate(location)
    if args.command in ("serve", "worker") and (refused := check_store(location)) is not None:
        return refused
    if args.command == "front-door-config":
        out = Path(args.out).resolve()
        list_file = Path(args.list_file) if args.list_file else out / "dispatcher.list"
        specs = list(args.worker)
        if args.from_store or args.nodes_file:
            found = cluster_workers(location if args.from_store else None, args.nodes_file)
            if isinstance(found, int):
                return found
            specs += found
        return write_front_door_config(settings, specs, Path(args.run_dir), out, list_file)
    if args.command == "worker":
        if not 0 <= args.index < settings.pool.workers:
            print(
                f"voicegate: worker index {args.index} is outside pool.workers = "
                f"{settings.pool.workers}",
                file=sys.stderr,
            )
            return EXIT_CONFIG
        settings = worker_settings(settings, args.index)
    pooled = settings.pool.workers > 1
    process = (
        ("supervisor" if args.command == "serve" else settings.session.worker_name)
        if pooled
        else None
    )
    setup_logging(settings.log.level, settings.log.format, process)
    dump_threads_on_signal()
    try:
        if args.command == "serve" and pooled:
            return asyncio.run(supervise(settings, args.config))
        return asyncio.run(serve(settings))
    except SupervisorStartError as exc:
        log.error("startup.failed", extra={"error": str(exc)})
        print(f"voicegate: cannot start the pool: {exc}", file=sys.stderr)
        return EXIT_START
    except TelephonyStartError as exc:
        log.error("startup.failed", extra={"error": str(exc)})
        print(f"voicegate: cannot start SIP: {exc}", file=sys.stderr)
        return EXIT_START
    except OSError as exc:
        log.error("startup.failed", extra={"error": str(exc)})
        print(f"voicegate: cannot start: {exc}", file=sys.stderr)
        return EXIT_START


def migrate(location: StoreLocation) -> int:
    """``voicegate migrate``: apply every migration this release has, in one transaction."""
    try:
        found, now = location.migrate()
    except SchemaMismatch as exc:
        print(f"voicegate: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreError as exc:
        print(f"voicegate: cannot migrate: {exc}", file=sys.stderr)
        return EXIT_START
    where = location.describe()
    if found == 0:
        print(f"voicegate: created the session store {where} at schema version {now}")
    elif found == now:
        print(f"voicegate: session store {where} is at schema version {now}: nothing to do")
    else:
        print(f"voicegate: migrated the session store {where} from version {found} to {now}")
    return 0


def check_store(location: StoreLocation) -> int | None:
    """Before serving: the store answers and its schema is this release's (an empty one is
    created). None if so; else the exit status, with one line on stderr saying why."""
    try:
        location.open().close()
    except SchemaMismatch as exc:
        print(f"voicegate: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreError as exc:
        print(f"voicegate: cannot start: {exc}", file=sys.stderr)
        return EXIT_START
    return None


def _is_name(text: str) -> bool:
    """A worker name as session.worker_name allows it (it becomes part of owner ids)."""
    try:
        name_token().check(text)
    except Invalid:
        return False
    return True


def cluster_workers(location: StoreLocation | None, nodes_file: str | None) -> list[str] | int:
    """``NAME=SIP_URI`` of every worker of every node not left, from the node registry or a
    file; or the exit status, with one line on stderr saying why."""
    nodes: list[NodeRecord] = []
    if location is not None:
        try:
            store = location.open()
        except StoreError as exc:
            print(f"voicegate: cannot read the node registry: {exc}", file=sys.stderr)
            return EXIT_START
        try:
            nodes = store.nodes()
        finally:
            store.close()
    if nodes_file is not None:
        try:
            data = json.loads(Path(nodes_file).read_text())
            listed = data["nodes"]
            if not isinstance(listed, list):
                raise TypeError("nodes is not a list")
            for entry in listed:
                workers = NodeRecord.workers_from(entry["workers"])
                nodes.append(NodeRecord(str(entry["name"]), "", "", workers, 0.0, 0.0, "up"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"voicegate: --nodes-file {nodes_file}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    specs = [f"{w.name}={w.sip}" for n in nodes if n.state != NodeState.LEFT for w in n.workers]
    if not specs:
        print("voicegate: no node lists a worker: nothing to dispatch to", file=sys.stderr)
        return EXIT_CONFIG
    return specs


def write_front_door_config(
    settings: Settings, specs: list[str], run_dir: Path, out: Path, list_file: Path
) -> int:
    workers = [(slot.name, slot.sip_uri) for slot in worker_slots(settings)]
    if specs:
        workers = []
        for spec in specs:
            name, _, uri = spec.partition("=")
            if not _is_name(name) or not uri.startswith("sip:"):
                print(f"voicegate: --worker {spec!r}: expected NAME=sip:host:port", file=sys.stderr)
                return EXIT_CONFIG
            workers.append((name, uri))
    door = front_door_for(
        settings.sip.address,
        settings.sip.port,
        run_dir,
        settings.pool.probe_interval_s,
        settings.pool.source_max_rate,
        media_ipv6=":" in settings.media.address,
        tls_port=settings.sip.tls_port,
        tls_cert_file=settings.sip.tls_cert_file,
        tls_key_file=settings.sip.tls_key_file,
    )
    door = dataclasses.replace(door, dispatcher_list=list_file)
    out.mkdir(parents=True, exist_ok=True)
    if door.tls_port:
        # Deployed beside the dispatcher list, as the README's steps copy them.
        door = dataclasses.replace(door, tls_config=list_file.parent / "tls.cfg")
        (out / "tls.cfg").write_text(render_tls_config(door))
    (out / "kamailio.cfg").write_text(render_config(door))
    (out / "dispatcher.list").write_text(render_dispatcher_list(workers))
    tls = f", {out / 'tls.cfg'}" if door.tls_port else ""
    print(f"voicegate: wrote {out / 'kamailio.cfg'}{tls} and {out / 'dispatcher.list'}")
    return 0


def _log_started(settings: Settings, **extra: object) -> None:
    log.info(
        "serve.started",
        extra={
            "sip": f"{settings.sip.address}:{settings.sip.port}",
            "http": f"{settings.http.address}:{settings.http.port}",
            "data_dir": str(settings.storage.data_dir),
            "store": StoreLocation.of(settings.storage).describe(),
            **extra,
        },
    )


async def serve(settings: Settings) -> int:
    stop, hurry = stop_signals()
    dump_tasks_on_signal(asyncio.get_running_loop())
    runtime = Runtime(settings)
    app_runner = app_runner_for(make_app(runtime))
    await app_runner.setup()
    try:
        site = web.TCPSite(app_runner, settings.http.address, settings.http.port)
        await site.start()
        await runtime.start()
        _log_started(settings, agent=settings.agent.kind)
        await stop.wait()
        log.info("serve.signal")
    finally:
        await runtime.shutdown(drain_s=settings.sip.drain_deadline_s, skip_drain=hurry)
        await app_runner.cleanup()
    return 0


async def supervise(settings: Settings, config_path: str | None) -> int:
    """``serve`` with ``pool.workers > 1``: run the pool until SIGTERM, then drain it."""
    stop, hurry = stop_signals()
    dump_tasks_on_signal(asyncio.get_running_loop())
    supervisor = Supervisor(settings, config_path)
    runner = app_runner_for(make_pool_app(supervisor))
    await runner.setup()
    try:
        try:
            await supervisor.start()
            await web.TCPSite(runner, settings.http.address, settings.http.port).start()
        except BaseException:
            await supervisor.close()
            raise
        _log_started(settings, workers=settings.pool.workers)
        await stop.wait()
        log.info("serve.signal")
        await supervisor.drain(hurry)
    finally:
        await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
