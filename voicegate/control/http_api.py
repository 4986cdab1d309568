"""The control plane of one process: health, readiness, metrics and the calls API (aiohttp).

The sessions API reads only the store, so the pool's supervisor serves the same handlers over the
store its workers share (:class:`SessionsView`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from config.rules import Invalid, sip_uri
from config.settings import CONSULT_COMPLETIONS, TRANSFER_MODES
from config.tenants import DEFAULT_TENANT
from session.durable import DurableSession
from session.resume import ResumeRecord, issue
from session.state import TERMINAL_STATES, SessionState
from session.store import (
    EventRecord,
    SessionFinished,
    SessionStore,
    SessionSummary,
)
from voicegate.call.legs import PlaceRefused
from voicegate.control.auth import ACCESS, Access, authenticate, foreign, scope
from voicegate.control.handoff import handoff
from voicegate.control.http_rules import json_error, json_object, new_app
from voicegate.control.status_page import status_page
from voicegate.runtime import Runtime

T = TypeVar("T")


class SessionsView(Protocol):
    """What the sessions API needs: store reads, the reaper, and which sessions are live here."""

    async def read(self, job: Callable[[SessionStore], T]) -> T:
        """``job(store)`` on a reader thread (session/store/reader.py), never on the loop."""
        ...

    async def reap(self) -> list[str]:
        """Finalise sessions whose process is gone (a write: off the event loop)."""
        ...

    def node_of(self, owner: str | None) -> str | None:
        """The cluster node whose process ``owner`` is; None outside a cluster."""
        ...

    def is_live(self, summary: SessionSummary) -> bool:
        """Whether a call is serving the session now (from what the store last said)."""
        ...

    @property
    def resume_ttl_s(self) -> float: ...

    async def record_resume(self, record: ResumeRecord) -> None:
        """Store a new resume handle's record (a write: off the event loop) and count it."""
        ...


RUNTIME = web.AppKey("runtime", Runtime)
SESSIONS = web.AppKey("sessions", SessionsView)


async def healthz(request: web.Request) -> web.Response:
    """Alive: the event loop answers. Says nothing about SIP (that is /readyz)."""
    return web.json_response({"status": "ok", "owner": request.app[RUNTIME].owner})


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    sip_up = runtime.sip_ready and runtime.sip is not None and runtime.sip.running
    store_down_s = runtime.store_down_for()
    ready = sip_up and not runtime.draining and store_down_s is None
    body = {
        "ready": ready,
        "sip_transports_up": sip_up,
        "draining": runtime.draining,
        # Seconds the session store has not answered; null while it does (docs/storage.md).
        "store_unavailable_s": None if store_down_s is None else round(store_down_s, 1),
        "owner": runtime.owner,
    }
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    return prometheus_response(generate_latest(request.app[RUNTIME].metrics.registry))


def prometheus_response(payload: bytes) -> web.Response:
    response = web.Response(body=payload)
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    response.charset = "utf-8"
    return response


async def list_calls(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    tenant = scope(request)
    calls = [c for c in runtime.live_calls() if tenant is None or c["tenant"] == tenant]
    return web.json_response({"calls": calls})


async def get_call(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    call_id = request.match_info["call_id"]
    live = runtime.calls.get(call_id)
    summary = await runtime.read(lambda store: store.get(call_id))
    if live is None and summary is None:
        return json_error(404, "no such call", call_id=call_id)
    owner = live.tenant if live is not None else summary.tenant if summary else DEFAULT_TENANT
    if refusal := foreign(request, owner, call_id=call_id):
        return refusal
    return web.json_response(
        {
            "call_id": call_id,
            "live": live.snapshot() if live is not None else None,
            "session": f"/v1/sessions/{call_id}" if summary is not None else None,
        }
    )


async def hangup_call(request: web.Request) -> web.Response:
    """An operator ends a live call: the caller gets a BYE, the session ends ``canceled``."""
    runtime = request.app[RUNTIME]
    call_id = request.match_info["call_id"]
    live = runtime.calls.get(call_id)
    if live is not None and (refusal := foreign(request, live.tenant, call_id=call_id)):
        return refusal
    if not runtime.hang_up(call_id, "hung up by operator"):
        return json_error(404, "no such live call here", call_id=call_id)
    return web.json_response({"call_id": call_id, "hanging_up": True}, status=202)


_TARGET = sip_uri()


async def read_placement(request: web.Request) -> dict[str, str] | web.Response:
    """The body of ``POST /v1/calls``: ``target`` (a bare SIP URI), or the 400 naming the field
    (shared with the pool's app)."""
    body = await json_object(request, required=frozenset({"target"}), optional=frozenset())
    if isinstance(body, web.Response):
        return body
    try:
        _TARGET.check(body["target"])
    except Invalid as exc:
        return json_error(400, f"target: {exc}", field="target")
    return body


async def place_call(request: web.Request) -> web.Response:
    """Place an outbound call (voicegate/call/legs.py). 202 once its session exists (the INVITE
    follows once that is durable); the outcome is the session's. 403 for a target outside
    ``outbound.allowed_targets``; 503 without a free call slot (or while draining)."""
    runtime = request.app[RUNTIME]
    body = await read_placement(request)
    if isinstance(body, web.Response):
        return body
    # The call is the key's tenant's: its agent answers and only its keys see the session.
    tenant = scope(request) or DEFAULT_TENANT
    placed = await runtime.place_call(body["target"], tenant=tenant)
    outbound = runtime.outbound_for(tenant)
    if isinstance(placed, PlaceRefused):
        extra: dict[str, object] = {}
        if placed.status == 403:
            extra["allowed_targets"] = list(outbound.allowed_targets)
        if placed.status == 503:
            extra["live_calls"] = len(runtime.calls)
            extra["max_calls"] = runtime.settings.pool.calls_per_worker
        response = json_error(placed.status, placed.message, field=placed.field, **extra)
        if placed.status == 503:
            response.headers["Retry-After"] = "5"
        return response
    return web.json_response(
        {
            "call_id": placed,
            "placing": True,
            "target": body["target"],
            "ring_timeout_s": outbound.ring_timeout_s,
            "session": f"/v1/sessions/{placed}",
        },
        status=202,
    )


async def read_transfer(request: web.Request) -> dict[str, str] | web.Response:
    """The body of ``POST /v1/calls/{id}/transfer``: ``target`` (a bare SIP URI), an optional
    ``mode`` and, for an attended transfer, an optional ``complete`` (when the caller is handed
    over, voicegate/call/consult.py), or the 400 naming the field (shared with the pool's app)."""
    body = await json_object(
        request, required=frozenset({"target"}), optional=frozenset({"mode", "complete"})
    )
    if isinstance(body, web.Response):
        return body
    complete = body.get("complete")
    if complete is not None and complete not in CONSULT_COMPLETIONS:
        return json_error(
            400,
            f"complete must be one of {', '.join(CONSULT_COMPLETIONS)}",
            field="complete",
            allowed=list(CONSULT_COMPLETIONS),
        )
    try:
        _TARGET.check(body["target"])
    except Invalid as exc:
        return json_error(400, f"target: {exc}", field="target")
    mode = body.get("mode")
    if mode is not None and mode not in TRANSFER_MODES:
        return json_error(
            400,
            f"mode must be one of {', '.join(TRANSFER_MODES)}",
            field="mode",
            allowed=list(TRANSFER_MODES),
        )
    return body


async def transfer_call(request: web.Request) -> web.Response:
    """Transfer a live call (blind: REFER, RFC 3515). 202 once the REFER is on its way; the
    outcome is the session's (``/v1/sessions/{id}``)."""
    runtime = request.app[RUNTIME]
    call_id = request.match_info["call_id"]
    live = runtime.calls.get(call_id)
    if live is not None and (refusal := foreign(request, live.tenant, call_id=call_id)):
        return refusal
    body = await read_transfer(request)
    if isinstance(body, web.Response):
        return body
    refused = runtime.transfer(call_id, body["target"], body.get("mode"), body.get("complete"))
    if refused is not None:
        # Only a live call can be refused for its target: its tenant's patterns are the answer.
        allowed = (
            {"allowed_targets": list(runtime.transfer_for(live.tenant).allowed_targets)}
            if refused.status == 403 and live is not None
            else {}
        )
        return json_error(
            refused.status, refused.message, field=refused.field, call_id=call_id, **allowed
        )
    return web.json_response(
        {
            "call_id": call_id,
            "transferring": True,
            "target": body["target"],
            # Under way means live: its tenant's default mode applies.
            "mode": body.get("mode") or runtime.transfer_for(live.tenant).default_mode
            if live is not None
            else body.get("mode"),
            "session": f"/v1/sessions/{call_id}",
        },
        status=202,
    )


async def complete_transfer(request: web.Request) -> web.Response:
    return await _consultation(request, "complete")


async def cancel_transfer(request: web.Request) -> web.Response:
    return await _consultation(request, "cancel")


async def read_say(request: web.Request) -> dict[str, str] | web.Response:
    """The body of ``POST /v1/calls/{id}/transfer/say``: exactly one of ``text`` and
    ``prompt``, or the 400 naming the field (shared with the pool's app)."""
    body = await json_object(request, required=frozenset(), optional=frozenset({"text", "prompt"}))
    if isinstance(body, web.Response):
        return body
    if ("text" in body) == ("prompt" in body):
        return json_error(400, "give exactly one of text and prompt", field="text")
    return body


async def say_to_consult(request: web.Request) -> web.Response:
    """Say ``text`` (synthesised) or play ``prompt`` to the person an attended transfer
    consults, on the consult leg only. 202 once queued; 400 a bad body (the field named), 404
    not live here, 409 no answered consult leg (or the hand-over under way)."""
    runtime = request.app[RUNTIME]
    call_id = request.match_info["call_id"]
    live = runtime.calls.get(call_id)
    if live is not None and (refusal := foreign(request, live.tenant, call_id=call_id)):
        return refusal
    body = await read_say(request)
    if isinstance(body, web.Response):
        return body
    if live is None:
        return json_error(404, "no such live call here", field="call_id", call_id=call_id)
    say_id, refused = live.transfer.say(text=body.get("text"), prompt=body.get("prompt"))
    if refused is not None:
        return json_error(refused.status, refused.message, field=refused.field, call_id=call_id)
    return web.json_response(
        {
            "call_id": call_id,
            "saying": True,
            "say_id": say_id,
            "session": f"/v1/sessions/{call_id}",
        },
        status=202,
    )


async def _consultation(request: web.Request, action: str) -> web.Response:
    """An attended transfer's go-ahead (``.../transfer/complete``: the REFER with Replaces goes
    now) or its cancel (``.../transfer/cancel``: the consult leg is hung up, the caller goes
    back to the agent). 202 once done; 404 not live here, 409 no consultation to act on."""
    runtime = request.app[RUNTIME]
    call_id = request.match_info["call_id"]
    live = runtime.calls.get(call_id)
    if live is not None and (refusal := foreign(request, live.tenant, call_id=call_id)):
        return refusal
    refused = runtime.consultation(call_id, action)
    if refused is not None:
        return json_error(refused.status, refused.message, field=refused.field, call_id=call_id)
    key = "completing" if action == "complete" else "canceled"
    return web.json_response(
        {"call_id": call_id, key: True, "session": f"/v1/sessions/{call_id}"}, status=202
    )


def _summary_json(summary: SessionSummary, view: SessionsView) -> dict[str, object]:
    return {
        "session_id": summary.session_id,
        "tenant": summary.tenant,
        "created_at": summary.created_at,
        "updated_at": summary.updated_at,
        "owner": summary.owner,
        "node": view.node_of(summary.owner),
        "lease_epoch": summary.lease_epoch,
        "status": summary.status,
        "terminal_state": summary.terminal_state,
        "events": summary.last_seq,
        "meta": dict(summary.meta),
    }


_STATES = ("open", "ended")
MAX_LIMIT = 500


async def list_sessions(request: web.Request) -> web.Response:
    view = request.app[SESSIONS]
    query = request.query  # unknown and repeated parameters are refused before (http_rules)
    state = query.get("state")
    if state is not None and state not in _STATES:
        return json_error(
            400,
            f"state must be one of {', '.join(_STATES)}",
            parameter="state",
            value=state,
            allowed=list(_STATES),
        )
    terminal = query.get("terminal_state")
    if terminal is not None and terminal not in TERMINAL_STATES:
        return json_error(
            400,
            f"terminal_state must be one of {', '.join(TERMINAL_STATES)}",
            parameter="terminal_state",
            value=terminal,
            allowed=list(TERMINAL_STATES),
        )
    raw_limit = query.get("limit", "50")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        return json_error(
            400,
            f"limit must be an integer from 1 to {MAX_LIMIT}",
            parameter="limit",
            value=raw_limit,
        )
    if state == "ended" and terminal is None:
        terminal_filter, open_only = None, False
    else:
        terminal_filter, open_only = terminal, state == "open"
    if state == "open" and terminal is not None:
        return json_error(
            400, "state=open sessions have no terminal_state", parameter="state", value=state
        )
    await view.reap()  # seed 004: the reaper runs on read
    try:
        tenant, cursor_in = scope(request), query.get("cursor")
        summaries, cursor = await view.read(
            lambda store: store.list(
                terminal_state=terminal_filter,
                open_only=open_only,
                limit=int(raw_limit),
                cursor=cursor_in,
                tenant=tenant,
            )
        )
    except ValueError:
        return json_error(
            400,
            "cursor is not one this server issued",
            parameter="cursor",
            value=query.get("cursor"),
        )
    if state == "ended":
        summaries = [s for s in summaries if s.terminal_state is not None]
    return web.json_response(
        {"sessions": [_summary_json(s, view) for s in summaries], "next_cursor": cursor}
    )


async def own_session(
    request: web.Request, view: SessionsView, session_id: str
) -> SessionSummary | web.Response:
    """The session asked about, if it exists and the request's key may see it; else the 404, or
    the 403 for another tenant's session."""
    summary = await view.read(lambda store: store.get(session_id))
    if summary is None:
        return json_error(404, "no such session", session_id=session_id)
    if refusal := foreign(request, summary.tenant, session_id=session_id):
        return refusal
    return summary


async def get_session(request: web.Request) -> web.Response:
    view = request.app[SESSIONS]
    session_id = request.match_info["session_id"]
    summary = await own_session(request, view, session_id)
    if isinstance(summary, web.Response):
        return summary
    if summary.terminal_state is None:
        await view.reap()  # seed 004: a dead process's session is finalised when it is read
    state, events, intents, latest = await view.read(
        lambda store: _session_detail(store, session_id)
    )
    summary = latest or summary
    return web.json_response(
        {
            **_summary_json(summary, view),
            "status": state.status(),
            "live": view.is_live(summary),
            "dimensions": {
                "signaling": state.signaling.value,
                "media": state.media.value,
                "agent_link": state.agent_link.value,
                "gate": state.gate.value,
            },
            "gate": {"state": state.gate.value, "since": state.gate_since},
            "playback_generation": state.playback_generation,
            "recovery": None
            if state.recovery is None
            else {
                "generation": state.recovery.generation,
                "interruptions": list(state.recovery.interruptions),
                "started_at": state.recovery.started_at,
                "deadline": state.recovery.deadline,
            },
            "transfer": None
            if state.transfer is None
            else {
                "generation": state.transfer.generation,
                "mode": state.transfer.mode,
                "stage": state.transfer.stage.value,
                "started_at": state.transfer.started_at,
                "summary": state.transfer_summary(),
            },
            "turn": None if state.turn is None else state.turn.turn_id,
            "response": None if state.response is None else state.response.response_id,
            "outstanding_intents": intents,
            "acceptable_terminal_states": list(state.acceptable_terminal_states()),
            "ended": None
            if state.ended is None
            else {
                "terminal_state": state.ended.terminal_state,
                "reason": state.ended.reason,
                "stage": state.ended.stage,
                "at": state.ended.at,
            },
            "events": [
                {
                    "seq": e.seq,
                    "type": e.type,
                    "at": e.at,
                    "payload": dict(e.payload),
                    "effects": [dict(x) for x in e.effects],
                }
                for e in events
            ],
        }
    )


def _session_detail(
    store: SessionStore, session_id: str
) -> tuple[SessionState, list[EventRecord], list[dict[str, object]], SessionSummary | None]:
    """Everything GET /v1/sessions/{id} shows, read in one job off the loop."""
    state = DurableSession.load(store, session_id).state
    events = store.events(session_id)
    intents: list[dict[str, object]] = []
    for outstanding in state.outstanding:
        stored = store.intent(outstanding.key)
        receipt = store.receipt(outstanding.key)
        intents.append(
            {
                "key": outstanding.key,
                "tool": outstanding.tool,
                "kind": outstanding.kind,
                "digest": outstanding.digest,
                "turn_id": outstanding.turn_id,
                "stage": outstanding.stage,
                "created_at": stored.created_at if stored else None,
                "receipt": receipt.outcome if receipt else None,
            }
        )
    return state, events, intents, store.get(session_id)


async def get_handoff(request: web.Request) -> web.Response:
    """What a person taking the call over needs (voicegate/control/handoff.py)."""
    view = request.app[SESSIONS]
    session_id = request.match_info["session_id"]
    summary = await own_session(request, view, session_id)
    if isinstance(summary, web.Response):
        return summary
    live = view.is_live(summary)
    body = await view.read(lambda store: handoff(store, session_id, live=live))
    if body is None:
        return json_error(404, "no such session", session_id=session_id)
    return web.json_response(body)


async def new_resume_handle(request: web.Request) -> web.Response:
    """A new resume handle for an open session of the key's tenant (docs/tenants.md): it
    supersedes the session's previous one and is shown here once; only its digest is kept."""
    view = request.app[SESSIONS]
    session_id = request.match_info["session_id"]
    summary = await own_session(request, view, session_id)
    if isinstance(summary, web.Response):
        return summary
    handle = issue(session_id, summary.tenant, now=time.time(), ttl_s=view.resume_ttl_s)
    try:
        await view.record_resume(handle.record)
    except SessionFinished:
        return json_error(409, "the session has ended: it cannot be resumed", session_id=session_id)
    return web.json_response(
        {
            "session_id": session_id,
            "resume_handle": handle.text,
            "expires_at": handle.record.expires_at,
        },
        status=201,
    )


def make_app(runtime: Runtime) -> web.Application:
    """One process's control plane (docs/openapi.yaml; the rules of http_rules.py)."""
    app = new_app(authenticate)
    app[ACCESS] = Access(
        runtime.tenants, runtime.settings.http.metrics_keys, runtime.metrics.api_refused
    )
    app[RUNTIME] = runtime
    # No HEAD twins (aiohttp adds one to each GET by default): the API is what the document
    # says, and a method it does not list gets a JSON 405.
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/readyz", readyz, allow_head=False)
    app.router.add_get("/metrics", metrics, allow_head=False)
    app.router.add_get("/status", status_page, allow_head=False)
    app.router.add_get("/v1/calls", list_calls, allow_head=False)
    app.router.add_post("/v1/calls", place_call)
    app.router.add_get("/v1/calls/{call_id}", get_call, allow_head=False)
    app.router.add_post("/v1/calls/{call_id}/hangup", hangup_call)
    app.router.add_post("/v1/calls/{call_id}/transfer", transfer_call)
    app.router.add_post("/v1/calls/{call_id}/transfer/complete", complete_transfer)
    app.router.add_post("/v1/calls/{call_id}/transfer/cancel", cancel_transfer)
    app.router.add_post("/v1/calls/{call_id}/transfer/say", say_to_consult)
    add_sessions_routes(app, runtime)
    return app


def add_sessions_routes(app: web.Application, view: SessionsView) -> None:
    app[SESSIONS] = view
    app.router.add_get("/v1/sessions", list_sessions, allow_head=False)
    app.router.add_get("/v1/sessions/{session_id}", get_session, allow_head=False)
    app.router.add_get("/v1/sessions/{session_id}/handoff", get_handoff, allow_head=False)
    app.router.add_post("/v1/sessions/{session_id}/resume", new_resume_handle)
