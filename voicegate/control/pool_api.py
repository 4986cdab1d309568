"""The pool's one control plane: the supervisor's aiohttp app over all workers.

Sessions are read from the store the workers share (the same handlers as a single process).
Live calls are asked of the workers: the list is gathered from every worker, and a request about
one call goes to the worker whose current incarnation owns its session. ``/metrics`` sums every
worker's metrics (prometheus-client multiprocess files, kept across worker restarts) and adds the
supervisor's own.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from config.tenant_loader import tenants_of
from voicegate.control.auth import ACCESS, Access, authenticate, foreign
from voicegate.control.http_api import (
    add_sessions_routes,
    prometheus_response,
    read_placement,
    read_say,
    read_transfer,
)
from voicegate.control.http_rules import json_error, new_app
from voicegate.control.status_page import status_page
from voicegate.pool.supervisor import Supervisor, Worker, WorkerState

SUPERVISOR = web.AppKey("supervisor", Supervisor)
_WORKER_TIMEOUT = aiohttp.ClientTimeout(total=3.0)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    sup = request.app[SUPERVISOR]
    body = {
        "ready": sup.ready,
        "draining": sup.stopping,
        "front_door_up": sup.front is not None and sup.front.running,
        "workers_ready": sum(1 for w in sup.workers if w.state is WorkerState.READY),
        "workers": len(sup.workers),
    }
    return web.json_response(body, status=200 if sup.ready else 503)


async def pool(request: web.Request) -> web.Response:
    sup = request.app[SUPERVISOR]
    return web.json_response(
        {
            "workers": [w.snapshot() for w in sup.workers],
            "calls_per_worker": sup.pool.calls_per_worker,
            "front_door": {
                "sip": f"{sup.settings.sip.address}:{sup.settings.sip.port}",
                "running": sup.front is not None and sup.front.running,
                "config": str(sup.front.config_path) if sup.front is not None else None,
            },
        }
    )


async def metrics(request: web.Request) -> web.Response:
    sup = request.app[SUPERVISOR]
    await sup.refresh_front_door_counters()
    workers = CollectorRegistry()
    multiprocess.MultiProcessCollector(workers, path=str(sup.metrics_dir))  # type: ignore[no-untyped-call]
    return prometheus_response(generate_latest(workers) + generate_latest(sup.metrics.registry))


async def _ask(
    sup: Supervisor,
    worker: Worker,
    method: str,
    path: str,
    body: object = None,
    *,
    on_behalf: web.Request | None = None,
) -> tuple[int, object] | None:
    """One request to a worker's control port (``body`` as JSON); None if it does not answer.

    ``on_behalf``: the request being served, whose key goes along (the worker holds the same
    keys and answers for that tenant only)."""
    auth = on_behalf.headers.get("Authorization") if on_behalf is not None else None
    headers = {"Authorization": auth} if auth else None
    try:
        async with sup.http().request(
            method,
            worker.slot.control_url + path,
            json=body,
            headers=headers,
            timeout=_WORKER_TIMEOUT,
        ) as resp:
            return resp.status, await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def list_calls(request: web.Request) -> web.Response:
    sup = request.app[SUPERVISOR]
    alive = [w for w in sup.workers if w.pid is not None]
    answers = await asyncio.gather(
        *(_ask(sup, w, "GET", "/v1/calls", on_behalf=request) for w in alive)
    )
    calls: list[object] = []
    unreachable = []
    for worker, answer in zip(alive, answers, strict=True):
        if answer is None or answer[0] != 200 or not isinstance(answer[1], dict):
            unreachable.append(worker.slot.name)
            continue
        for call in answer[1].get("calls", []):
            if isinstance(call, dict):
                calls.append({**call, "worker": worker.slot.name})
    # In a cluster, only this node's calls: another node's are on its own API (/v1/cluster).
    scope = {"scope": "node", "node": sup.keeper.name} if sup.keeper is not None else {}
    return web.json_response({"calls": calls, "unreachable_workers": unreachable, **scope})


async def _owning_worker(
    request: web.Request, sup: Supervisor, call_id: str
) -> tuple[Worker | None, web.Response | None]:
    summary = await sup.read(lambda store: store.get(call_id))
    if summary is None:
        return None, json_error(404, "no such call", call_id=call_id)
    if refusal := foreign(request, summary.tenant, call_id=call_id):
        return None, refusal
    if (elsewhere := _held_elsewhere(sup, summary.owner, call_id)) is not None:
        return None, elsewhere
    worker = sup.worker_of(summary.owner)
    if summary.terminal_state is not None or worker is None:
        return None, json_error(
            409 if summary.terminal_state is None else 404,
            "the call is not live on any worker",
            call_id=call_id,
            session=f"/v1/sessions/{call_id}",
            terminal_state=summary.terminal_state,
        )
    return worker, None


def _held_elsewhere(sup: Supervisor, owner: str | None, call_id: str) -> web.Response | None:
    """A call another live node of the cluster holds: 409 with that node's name and API, which
    the client asks instead. Not forwarded: the node's own API answers with its own keys and
    errors, and a client that follows the 409 once talks to the right node from then on."""
    keeper = sup.keeper
    node_name = sup.node_of(owner)
    if keeper is None or node_name is None or node_name == keeper.name:
        return None
    node = keeper.node(node_name)
    if node is None or not keeper.is_up(node_name):
        return None
    return json_error(
        409,
        "the call is held by another node of the cluster: ask that node",
        call_id=call_id,
        node=node.name,
        api=node.api_url,
    )


async def cluster(request: web.Request) -> web.Response:
    """The nodes of the cluster as this node last read the registry, with their open sessions."""
    sup = request.app[SUPERVISOR]
    keeper = sup.keeper
    if keeper is None:
        return json_error(404, "this pool is not a node of a cluster (node.name is empty)")
    summaries = await sup.read(lambda store: store.open_sessions())
    open_by_node: dict[str, int] = {}
    for summary in summaries:
        if (name := sup.node_of(summary.owner)) is not None:
            open_by_node[name] = open_by_node.get(name, 0) + 1
    view = keeper.view
    nodes = [
        {
            "name": n.name,
            "state": n.state_at(view.read_at, keeper.dead_after_s).value,
            "incarnation": n.incarnation,
            "api": n.api_url,
            "workers": n.workers_json(),
            "started_at": n.started_at,
            "heartbeat_at": n.heartbeat_at,
            "heartbeat_age_s": round(max(0.0, view.read_at - n.heartbeat_at), 3),
            "taken_over_by": n.taken_over_by,
            "open_sessions": open_by_node.get(n.name, 0),
        }
        for n in view.nodes
    ]
    return web.json_response(
        {
            "node": keeper.name,
            "read_at": view.read_at,
            "dead_after_s": keeper.dead_after_s,
            "nodes": nodes,
        }
    )


async def get_call(request: web.Request) -> web.Response:
    sup = request.app[SUPERVISOR]
    call_id = request.match_info["call_id"]
    summary = await sup.read(lambda store: store.get(call_id))
    if summary is None:
        return json_error(404, "no such call", call_id=call_id)
    if refusal := foreign(request, summary.tenant, call_id=call_id):
        return refusal
    if (elsewhere := _held_elsewhere(sup, summary.owner, call_id)) is not None:
        return elsewhere
    worker = sup.worker_of(summary.owner)
    live = None
    if worker is not None and summary.terminal_state is None:
        answer = await _ask(sup, worker, "GET", f"/v1/calls/{call_id}", on_behalf=request)
        if answer is not None and answer[0] == 200 and isinstance(answer[1], dict):
            live = answer[1].get("live")
    return web.json_response(
        {
            "call_id": call_id,
            "live": live,
            "worker": worker.slot.name if worker is not None else None,
            "session": f"/v1/sessions/{call_id}",
        }
    )


async def hangup_call(request: web.Request) -> web.Response:
    return await _forward(request, "hangup")


async def transfer_call(request: web.Request) -> web.Response:
    """The body is checked here (400 names the field) and sent on to the call's worker, whose
    answer (202, 403, 409) is the answer."""
    body = await read_transfer(request)
    if isinstance(body, web.Response):
        return body
    return await _forward(request, "transfer", body)


async def complete_transfer(request: web.Request) -> web.Response:
    """An attended transfer's go-ahead, sent on to the call's worker (no body)."""
    return await _forward(request, "transfer/complete")


async def cancel_transfer(request: web.Request) -> web.Response:
    """An attended transfer called off, sent on to the call's worker (no body)."""
    return await _forward(request, "transfer/cancel")


async def say_to_consult(request: web.Request) -> web.Response:
    """Something said to the person an attended transfer consults: the body is checked here
    (400 names the field) and sent on to the call's worker."""
    body = await read_say(request)
    if isinstance(body, web.Response):
        return body
    return await _forward(request, "transfer/say", body)


async def place_call(request: web.Request) -> web.Response:
    """An outbound call goes to the first ready worker with a free call slot: each is asked in
    turn, and a worker's 503 (no free slot) sends the request on to the next. The body is checked
    here (400 names the field); a 403 (target not allowed) is the same at every worker."""
    sup = request.app[SUPERVISOR]
    body = await read_placement(request)
    if isinstance(body, web.Response):
        return body
    full = []
    for worker in sup.workers:
        if worker.state is not WorkerState.READY:
            continue
        answer = await _ask(sup, worker, "POST", "/v1/calls", body, on_behalf=request)
        if answer is None:
            full.append({"worker": worker.slot.name, "answer": "did not answer"})
            continue
        status, answer_body = answer
        if status == 503:
            full.append({"worker": worker.slot.name, "answer": "no free call slot"})
            continue
        return web.json_response(
            {**answer_body, "worker": worker.slot.name}
            if isinstance(answer_body, dict)
            else answer_body,
            status=status,
        )
    response = json_error(503, "no worker has a free call slot", workers=full)
    response.headers["Retry-After"] = "5"
    return response


async def _forward(request: web.Request, action: str, body: object = None) -> web.Response:
    """A per-call command, sent to the worker that owns the call's session."""
    sup = request.app[SUPERVISOR]
    call_id = request.match_info["call_id"]
    worker, refusal = await _owning_worker(request, sup, call_id)
    if refusal is not None:
        return refusal
    assert worker is not None
    answer = await _ask(
        sup, worker, "POST", f"/v1/calls/{call_id}/{action}", body, on_behalf=request
    )
    if answer is None:
        return json_error(502, "the call's worker did not answer", worker=worker.slot.name)
    status, body = answer
    return web.json_response(
        {**body, "worker": worker.slot.name} if isinstance(body, dict) else body, status=status
    )


def make_pool_app(supervisor: Supervisor) -> web.Application:
    """The pool's control plane: the routes of one process's, and ``/v1/pool``."""
    app = new_app(authenticate)
    app[ACCESS] = Access(
        tenants_of(supervisor.settings),
        supervisor.settings.http.metrics_keys,
        supervisor.metrics.api_refused,
    )
    app[SUPERVISOR] = supervisor
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/readyz", readyz, allow_head=False)
    app.router.add_get("/metrics", metrics, allow_head=False)
    app.router.add_get("/status", status_page, allow_head=False)
    app.router.add_get("/v1/pool", pool, allow_head=False)
    app.router.add_get("/v1/cluster", cluster, allow_head=False)
    app.router.add_get("/v1/calls", list_calls, allow_head=False)
    app.router.add_post("/v1/calls", place_call)
    app.router.add_get("/v1/calls/{call_id}", get_call, allow_head=False)
    app.router.add_post("/v1/calls/{call_id}/hangup", hangup_call)
    app.router.add_post("/v1/calls/{call_id}/transfer", transfer_call)
    app.router.add_post("/v1/calls/{call_id}/transfer/complete", complete_transfer)
    app.router.add_post("/v1/calls/{call_id}/transfer/cancel", cancel_transfer)
    app.router.add_post("/v1/calls/{call_id}/transfer/say", say_to_consult)
    add_sessions_routes(app, supervisor)
    return app
