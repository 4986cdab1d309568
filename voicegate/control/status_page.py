"""``GET /status``: one HTML page for a person on call, served by both control apps.

No build step and nothing from a CDN: the CSS and JavaScript are inline, and the page reads the
same JSON API an operator would curl (docs/runbooks/README.md): ``/v1/calls``, open sessions (with
each one's dimensions, recovery and transfer from ``/v1/sessions/{id}``), sessions ended
``needs_human``,
``/v1/pool`` where there is one (a single process answers it 404 and the section is hidden), and
``/v1/cluster`` on a node of a cluster (docs/cluster.md; elsewhere 404, and hidden).
It refreshes itself every 2 s. Everything shown is text set with ``textContent``: a caller's
display name or a reason can never inject markup.
"""

from __future__ import annotations

from aiohttp import web

REFRESH_MS = 2000
# Open sessions whose detail the page fetches on each refresh; the detail carries the whole event
# log, so the page stays cheap on a busy pool and says when it shows only the newest ones.
DETAIL_LIMIT = 50

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>voicegate status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d2330; background: #f7f8fa; }
  h1 { font-size: 1.4em; margin: 0 0 .2em; }
  h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
  #updated { color: #5b6475; }
  #error { color: #fff; background: #b3261e; padding: .4em .8em; border-radius: 4px; }
  table { border-collapse: collapse; width: 100%; background: #fff; }
  th, td { text-align: left; padding: .3em .6em; border-bottom: 1px solid #e1e4ea; }
  th { background: #eef0f4; font-weight: 600; }
  td.empty { color: #5b6475; font-style: italic; }
  .bad { color: #b3261e; font-weight: 600; }
  .warn { color: #9a6700; font-weight: 600; }
  .ok { color: #1a7f37; }
  code { font-size: .95em; }
</style>
</head>
<body>
<h1>voicegate status</h1>
<div id="updated">loading&hellip;</div>
<div id="error" hidden></div>

<h2>Live calls (<span id="calls-count">0</span>)</h2>
<table id="calls"><thead><tr>
  <th>call</th><th>worker</th><th>state</th><th>caller</th><th>codec</th><th>duration</th>
  <th>signaling</th><th>media</th><th>agent link</th><th>gate</th><th>session status</th>
</tr></thead><tbody></tbody></table>

<h2>Recoveries in progress (<span id="recoveries-count">0</span>)</h2>
<table id="recoveries"><thead><tr>
  <th>session</th><th>interruptions</th><th>generation</th><th>started</th><th>deadline</th>
</tr></thead><tbody></tbody></table>

<h2>Transfers in progress (<span id="transfers-count">0</span>)</h2>
<table id="transfers"><thead><tr>
  <th>session</th><th>transfer</th><th>started</th>
</tr></thead><tbody></tbody></table>

<h2>Sessions needing a human (<span id="needs-human-count">0</span>)</h2>
<table id="needs-human"><thead><tr>
  <th>session</th><th>ended</th><th>status</th><th>owner</th>
</tr></thead><tbody></tbody></table>

<section id="pool" hidden>
<h2>Workers</h2>
<div id="front-door"></div>
<table id="workers"><thead><tr>
  <th>worker</th><th>state</th><th>pid</th><th>restarts</th><th>last exit</th><th>SIP</th>
</tr></thead><tbody></tbody></table>
</section>

<section id="cluster" hidden>
<h2>Cluster (this is node <span id="cluster-node"></span>)</h2>
<table id="nodes"><thead><tr>
  <th>node</th><th>state</th><th>heartbeat</th><th>open sessions</th><th>workers</th>
  <th>taken over by</th><th>API</th>
</tr></thead><tbody></tbody></table>
</section>

<script>
"use strict";
const REFRESH_MS = __REFRESH_MS__;
const DETAIL_LIMIT = __DETAIL_LIMIT__;

// With API keys configured, open the page as /status#key=<key>: a URL fragment never leaves the
// browser, so the key is in no request line and no server log (docs/api.md).
const KEY = new URLSearchParams(location.hash.slice(1)).get("key");
const HEADERS = KEY ? {"Authorization": "Bearer " + KEY} : {};

async function getJson(path) {
  const response = await fetch(path, {cache: "no-store", headers: HEADERS});
  // A single process has no pool, a pool outside a cluster no cluster: their sections hide.
  if (response.status === 404 && (path === "/v1/pool" || path === "/v1/cluster")) return null;
  if (!response.ok) throw new Error(path + " answered " + response.status);
  return response.json();
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls;
  return td;
}

function link(text, href) {
  const td = document.createElement("td");
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  td.appendChild(a);
  return td;
}

function fill(id, rows, columns, emptyText) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  if (rows.length === 0) {
    const tr = document.createElement("tr");
    const td = cell(emptyText, "empty");
    td.colSpan = columns;
    tr.appendChild(td);
    body.appendChild(tr);
  }
  for (const cells of rows) {
    const tr = document.createElement("tr");
    cells.forEach(td => tr.appendChild(td));
    body.appendChild(tr);
  }
}

function time(seconds) {
  return seconds ? new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) : "-";
}

// The values of session/state.py's dimensions, by how worried the reader should be.
const OK = ["up", "open", "connected", "flowing"];
const WARN = ["frozen", "reconciling", "lost", "interrupted", "reinvite_pending", "transferring"];
const BAD = ["closed", "gone"];
function dimensionClass(value) {
  if (OK.includes(value)) return "ok";
  if (WARN.includes(value)) return "warn";
  return BAD.includes(value) ? "bad" : "";
}

async function refresh() {
  const [calls, open, needsHuman, pool, cluster] = await Promise.all([
    getJson("/v1/calls"),
    getJson("/v1/sessions?state=open&limit=" + DETAIL_LIMIT),
    getJson("/v1/sessions?terminal_state=needs_human&limit=50"),
    getJson("/v1/pool"),
    getJson("/v1/cluster"),
  ]);
  const details = await Promise.all(open.sessions.map(
    s => getJson("/v1/sessions/" + encodeURIComponent(s.session_id)).catch(() => null)));
  const bySession = new Map(details.filter(d => d).map(d => [d.session_id, d]));

  document.getElementById("calls-count").textContent = calls.calls.length;
  fill("calls", calls.calls.map(c => {
    const d = bySession.get(c.call_id);
    const dims = d ? d.dimensions : {};
    return [
      link(c.call_id, "/v1/sessions/" + encodeURIComponent(c.call_id)),
      cell(c.worker), cell(c.state), cell(c.caller), cell(c.codec),
      cell(c.duration_s === undefined ? null : Math.round(c.duration_s) + " s"),
      cell(dims.signaling, dimensionClass(dims.signaling)),
      cell(dims.media, dimensionClass(dims.media)),
      cell(dims.agent_link, dimensionClass(dims.agent_link)),
      cell(dims.gate, dimensionClass(dims.gate)),
      cell(c.session_status),
    ];
  }), 11, "no live calls");

  const recovering = details.filter(d => d && d.recovery);
  document.getElementById("recoveries-count").textContent = recovering.length;
  fill("recoveries", recovering.map(d => [
    link(d.session_id, "/v1/sessions/" + encodeURIComponent(d.session_id)),
    cell(d.recovery.interruptions.join(", "), "warn"), cell(d.recovery.generation),
    cell(d.recovery.started_at), cell(d.recovery.deadline),
  ]), 5, "no recovery in progress");

  // A transfer is its own phase, not a recovery: a desk sees "transferring", never a fault.
  const transferring = details.filter(d => d && d.transfer);
  document.getElementById("transfers-count").textContent = transferring.length;
  fill("transfers", transferring.map(d => [
    link(d.session_id, "/v1/sessions/" + encodeURIComponent(d.session_id)),
    cell(d.transfer.summary), cell(d.transfer.started_at),
  ]), 3, "no transfer in progress");

  document.getElementById("needs-human-count").textContent = needsHuman.sessions.length;
  fill("needs-human", needsHuman.sessions.map(s => [
    link(s.session_id, "/v1/sessions/" + encodeURIComponent(s.session_id)),
    cell(time(s.updated_at)), cell(s.status, "bad"), cell(s.owner),
  ]), 4, "none");

  const section = document.getElementById("pool");
  section.hidden = pool === null;
  if (pool !== null) {
    const fd = pool.front_door;
    const door = document.getElementById("front-door");
    door.textContent = "Front door " + fd.sip + ": " + (fd.running ? "running" : "DOWN");
    door.className = fd.running ? "ok" : "bad";
    fill("workers", pool.workers.map(w => [
      cell(w.name), cell(w.state, w.state === "ready" ? "ok" : "warn"), cell(w.pid),
      cell(w.restarts, w.restarts > 0 ? "warn" : ""), cell(w.last_exit), cell(w.sip),
    ]), 6, "no workers");
  }
  const nodes = document.getElementById("cluster");
  nodes.hidden = cluster === null;
  if (cluster !== null) {
    document.getElementById("cluster-node").textContent = cluster.node;
    const NODE_CLASS = {up: "ok", draining: "warn", dead: "bad", left: ""};
    fill("nodes", cluster.nodes.map(n => [
      cell(n.name), cell(n.state, NODE_CLASS[n.state]), cell(n.heartbeat_age_s + " s ago"),
      cell(n.open_sessions), cell(n.workers.map(w => w.name).join(", ")),
      cell(n.taken_over_by, n.taken_over_by ? "warn" : ""), cell(n.api),
    ]), 7, "no nodes registered");
  }
  document.getElementById("updated").textContent = "updated " + new Date().toISOString();
}

async function loop() {
  const error = document.getElementById("error");
  try {
    await refresh();
    error.hidden = true;
  } catch (e) {
    error.textContent = "could not refresh: " + e.message;
    error.hidden = false;
  }
  setTimeout(loop, REFRESH_MS);
}
loop();
</script>
</body>
</html>
"""

PAGE = _PAGE.replace("__REFRESH_MS__", str(REFRESH_MS)).replace(
    "__DETAIL_LIMIT__", str(DETAIL_LIMIT)
)


async def status_page(request: web.Request) -> web.Response:
    """The page; everything it shows it fetches itself, so it is the same for both apps."""
    return web.Response(
        text=PAGE,
        content_type="text/html",
        headers={
            # Inline script and style only, fetches to this origin only: no CDN can be reached.
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'",
            "Cache-Control": "no-store",
        },
    )
