"""The control plane of one process: health, readiness, metrics and the calls API (aiohttp)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from voicegate.runtime import Runtime

RUNTIME = web.AppKey("runtime", Runtime)


def _error(status: int, message: str, **fields: object) -> web.Response:
    return web.json_response({"error": message, **fields}, status=status)


async def healthz(request: web.Request) -> web.Response:
    """Alive: the event loop answers. Says nothing about SIP (that is /readyz)."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    sip_up = runtime.sip_ready and runtime.sip is not None and runtime.sip.running
    ready = sip_up and not runtime.draining
    body = {"ready": ready, "sip_transports_up": sip_up, "draining": runtime.draining}
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    payload = generate_latest(runtime.metrics.registry)
    response = web.Response(body=payload)
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    response.charset = "utf-8"
    return response


async def list_calls(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    return web.json_response({"calls": runtime.live_calls()})


async def get_call(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    call_id = request.match_info["call_id"]
    live = runtime.calls.get(call_id)
    record = runtime.store.get(call_id)
    if live is None and record is None:
        return _error(404, "no such call", call_id=call_id)
    return web.json_response(
        {
            "call_id": call_id,
            "live": live.snapshot() if live is not None else None,
            "record": record.as_json() if record is not None else None,
        }
    )


def make_app(runtime: Runtime) -> web.Application:
    app = web.Application()
    app[RUNTIME] = runtime
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/calls", list_calls)
    app.router.add_get("/v1/calls/{call_id}", get_call)
    return app
