"""What every control-plane request is held to, in both apps (one process's and the pool's).

- Every error is a JSON body ``{"error": "...", <the field it concerns>: ...}`` (STYLE.md habit 2),
  the router's own 404 and 405 included, and an unexpected exception is a JSON 500.
- A query parameter a route does not take is refused (400, naming it), as is one given twice:
  a typo such as ``?limt=5`` must not silently mean "the default".
- Only the routes in :data:`JSON_BODY_ROUTES` take a request body: a small JSON object read with
  :func:`json_object` (its fields checked, each error naming the field). Every other route
  refuses a body without reading it (413 above :data:`CLIENT_MAX_SIZE`, else 400), and
  ``client_max_size`` bounds what the body routes read.
- :func:`app_runner` serves an app with timeouts a slow or idle client cannot outlast.

docs/openapi.yaml describes the routes; tests/unit/test_openapi.py keeps the two in step.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from session.store import StoreUnavailable

log = logging.getLogger("voicegate.control")

# The query parameters each route takes, by its path as registered; a route not listed takes none.
QUERY_PARAMETERS: Mapping[str, frozenset[str]] = {
    "/v1/sessions": frozenset({"state", "terminal_state", "limit", "cursor"}),
}

# The routes that read a JSON body, by path as registered; every other route refuses one.
JSON_BODY_ROUTES: frozenset[str] = frozenset(
    {"/v1/calls", "/v1/calls/{call_id}/transfer", "/v1/calls/{call_id}/transfer/say"}
)

# The most a body route reads; a request's headers and line are bounded by aiohttp's own limits
# (8190 bytes a line or field, 128 headers).
CLIENT_MAX_SIZE = 4096

# An idle keep-alive connection is closed after this long. aiohttp arms the same timer when a
# connection opens and after each response, and a request whose headers have not all arrived by
# then is dropped with it: it is also the bound on a client that sends its headers slowly
# (slowloris). Our clients are probes and operators' tools on a LAN: 10 s is ample for them, and
# short enough that a few hundred stalled sockets cannot pile up.
KEEPALIVE_TIMEOUT_S = 10.0
# How long aiohttp goes on reading (and discarding) a body we refused without reading it, before
# it closes the connection; its default, 10 s, would let a slow sender hold the socket that long.
LINGERING_TIME_S = 1.0
# A handler still running at shutdown gets this long (aiohttp's default is 60 s); the runtime's
# own staged shutdown has its deadlines, and the handlers only read.
SHUTDOWN_TIMEOUT_S = 5.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: int, message: str, **fields: object) -> web.Response:
    """The one error shape of the API: ``{"error": message, **fields}`` with ``status``."""
    return web.json_response({"error": message, **fields}, status=status)


def _refusal(request: web.Request) -> web.Response | None:
    """Why a request that matched a route is refused before its handler runs, if it is."""
    resource = request.match_info.route.resource
    takes_body = resource is not None and resource.canonical in JSON_BODY_ROUTES
    if request.body_exists and not takes_body:
        length = request.content_length
        if length is not None and length > request.client_max_size:
            return json_error(
                413, "request body too large", field="body", limit=request.client_max_size
            )
        return json_error(400, "this route takes no request body", field="body")
    allowed = QUERY_PARAMETERS.get(resource.canonical, frozenset()) if resource else frozenset()
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        return json_error(
            400,
            f"unknown query parameter {unknown[0]!r}",
            parameter=unknown[0],
            unknown=unknown,
            allowed=sorted(allowed),
        )
    for name in sorted(allowed):
        if len(request.query.getall(name, [])) > 1:
            return json_error(400, f"query parameter {name!r} given more than once", parameter=name)
    return None


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    if isinstance(exc, web.HTTPMethodNotAllowed):
        response = json_error(
            405,
            f"{request.method} is not allowed here",
            method=request.method,
            allowed=sorted(exc.allowed_methods),
        )
        response.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
        return response
    if exc.status == 404:
        return json_error(404, "no such path", path=request.path)
    if exc.status == 413:
        return json_error(
            413, "request body too large", field="body", limit=request.client_max_size
        )
    return json_error(exc.status, exc.reason)


@web.middleware
async def strict_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse what no route takes and turn every error, aiohttp's own included, into JSON."""
    try:
        if request.match_info.http_exception is None:
            refusal = _refusal(request)
            if refusal is not None:
                return refusal
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(request, exc)
    except StoreUnavailable:
        # The database is away (docs/storage.md): nothing was read or written; ask again later.
        response = json_error(503, "the session store is unavailable", retry_after_s=5)
        response.headers["Retry-After"] = "5"
        return response
    except Exception:
        # A bug of ours: the client gets the same JSON shape; the traceback goes to the log.
        log.exception("http.handler_failed", extra={"path": request.path})
        return json_error(500, "internal error")


def new_app(authenticate: Middleware | None = None) -> web.Application:
    """An empty control-plane app with :func:`strict_json` and the body limit, behind
    ``authenticate`` when given (voicegate/control/auth.py: keys are checked before anything
    else is said about a request)."""
    middlewares: list[Middleware] = [strict_json]
    if authenticate is not None:
        middlewares.insert(0, authenticate)
    return web.Application(middlewares=middlewares, client_max_size=CLIENT_MAX_SIZE)


def app_runner(
    app: web.Application, *, keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S
) -> web.AppRunner:
    """The runner both ``serve`` and the pool's supervisor use (their timeouts above)."""
    return web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        keepalive_timeout=keepalive_timeout_s,
        lingering_time=LINGERING_TIME_S,
    )


async def json_object(
    request: web.Request, *, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, str] | web.Response:
    """The request's body as a JSON object of strings with exactly these fields, or the 400 (or
    413) that says which field is wrong. Reads at most ``client_max_size`` bytes."""
    if request.content_type != "application/json":
        return json_error(
            400, "the body must be JSON (Content-Type: application/json)", field="body"
        )
    try:
        body = await request.json()
    except web.HTTPRequestEntityTooLarge:
        return json_error(
            413, "request body too large", field="body", limit=request.client_max_size
        )
    except ValueError:
        return json_error(400, "the body is not valid JSON", field="body")
    if not isinstance(body, dict):
        return json_error(400, "the body must be a JSON object", field="body")
    allowed = required | optional
    for name in sorted(body):
        if name not in allowed:
            return json_error(400, f"unknown field {name!r}", field=name, allowed=sorted(allowed))
    for name in sorted(required):
        if name not in body:
            return json_error(400, f"field {name!r} is required", field=name)
    for name, value in body.items():
        if not isinstance(value, str):
            return json_error(400, f"field {name!r} must be a string", field=name)
    return dict(body)
