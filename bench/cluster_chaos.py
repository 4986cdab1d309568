"""Cluster chaos: payments through two nodes behind Kamailio, a node or a worker killed at random.

Prints figures, never passes or fails on time (STYLE.md; tests assert behaviour, benchmarks
measure). It exits 1 only for what must never happen, whatever the timing: a payment charged
twice, the provider's ledger and the sessions' receipts disagreeing, or a session still open at
the end (each printed as ``INVARIANT BROKEN: ...``); 2 if the run itself could not be carried out.

    python bench/cluster_chaos.py --rounds 20 --seed 1
    python bench/cluster_chaos.py --rounds 5 --seed 7 --window 20     # a quick look

The cluster is tests/integration/cluster.py's: two nodes (2 workers each) on two hosts (network
namespaces), one PostgreSQL and Kamailio on the gateway, the reference payment provider. Each
round, every choice drawn from ``--seed`` in the same order whatever happens:

- the provider's faults for the round (none, the answer held back 4 s or 20 s after the commit,
  the commit itself 3 s late, or one 503 before anything is written);
- one payer call through Kamailio (``uac-pay-then-drop.xml``, a number of its own each round);
- a moment 0.5 to 20 s after its session opened, and a victim: a whole node (every process of
  its host, ``Cluster.kill_host``) or one worker of a node (its pid from ``GET /v1/pool``),
  either the one serving the call (``--aim``) or any; then ``kill -9``;
- a node killed is started again once the survivor has taken its sessions over (kill to the
  survivor's ``owner_lost``, or ``session_reaped`` for a session with nothing to settle), or at
  once (``--quick-restart``: the node comes back before anybody takes over); a worker is
  restarted by its supervisor. The round waits for every worker to be back in Kamailio's set;
- once the round's session is parked for a callback (``signaling dropped``), the caller calls
  back through Kamailio with its resume code (``--callback``) or lets the window pass.

The nodes run with the product's media gap threshold (1 s), a 2 s recovery timeout and a short
callback window (``--window``), so a drop parks in seconds and a parked session ends soon after
the run. At the end the bench waits until every session is terminal, then prints: kills by kind,
what the kill found the round's payment doing, take-over times (p50 and max), payments, the
ledger's rows, duplicate charges (two committed rows for one key, or more committed rows than
sessions with a committed receipt), whether every committed row has a session whose receipt
says committed for its key and the other way round, sessions by terminal state, sessions left
open, and worker exits and error log lines that were not the bench's kills. Each node's logs are
in the work directory: ``n1/server-N.log`` (one file per start), ``front/kamailio.log``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from session.state import AWAY_STATUS, DROPPED_STATUS  # noqa: E402
from tests.integration.cluster import (  # noqa: E402
    DEAD_AFTER_S,
    WORKERS,
    Cluster,
    caller_args,
    cluster_up,
    running_cluster,
)
from tests.integration.harness import Server, Sipp, wait_for  # noqa: E402
from tests.integration.test_callback import _code_of  # noqa: E402

# The provider's faults, drawn per round; every round sets all of them (the rest to none).
NO_FAULTS: dict[str, Any] = {
    "charge_delay_s": 0.0,
    "respond_delay_s": 0.0,
    "fail_status": None,
    "fail_count": 0,
    "status_unknown": False,
}
FAULTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("none", {}),
    ("answer 4 s late", {"respond_delay_s": 4.0}),
    ("answer 20 s late", {"respond_delay_s": 20.0}),
    ("commit 3 s late", {"charge_delay_s": 3.0}),
    ("one 503", {"fail_status": 503, "fail_count": 1}),
)
KILL_WINDOW_S = (0.5, 20.0)  # after the round's session opened
TAKEN = ("owner_lost", "session_reaped")  # the first write of whoever took a session over
SETTLE_S = 90.0  # a restarted node or worker back in Kamailio's set
FATE_S = 120.0  # the round's session parked or ended


class RunError(Exception):
    """The run could not go on (a node that does not come back, an API that does not answer)."""


@dataclass
class Kill:
    round: int
    kind: str  # "node" or "worker"
    node: str
    worker: str  # the worker's name, "" for a node
    at: float  # wall clock, as the events' "at"
    hit: bool  # the process serving the round's call was among the killed
    phase: str  # what the round's payment was doing at the kill
    pids: list[int] = field(default_factory=list)  # the workers killed
    quick: bool = False  # a node started again at once, before any take-over
    victims: list[str] = field(default_factory=list)  # open, unparked sessions it held
    taken: dict[str, tuple[str, float]] = field(default_factory=dict)  # session -> (event, s)


@dataclass
class Round:
    index: int
    faults: str
    number: str
    session: str | None = None
    kill: Kill | None = None
    fate: str = ""  # parked, ended <state>, or what the bench saw instead
    callback: str = ""  # "", "with code: <outcome>", "let be", "no code"
    payer_rc: int | None = None


@dataclass
class Outcome:
    rounds: list[Round]
    kills: list[Kill]
    summaries: list[dict[str, Any]]
    details: dict[str, dict[str, Any]]
    ledger: list[dict[str, Any]]
    open_after_wait: list[dict[str, Any]]
    waited_s: float
    unexpected_exits: list[str]
    error_lines: collections.Counter[str]
    killed_pids: set[int]


# --- the cluster's API, through whichever node answers -------------------------------------------


def up_nodes(cluster: Cluster) -> list[str]:
    return [
        n for n, s in cluster.nodes.items() if s.process is not None and s.process.poll() is None
    ]


def api(cluster: Cluster) -> Server:
    for name in up_nodes(cluster):
        server = cluster.nodes[name]
        status, _ = server.http("/v1/cluster")
        if status == 200:
            return server
    raise RunError("no node's API answers")


def summaries(cluster: Cluster) -> list[dict[str, Any]]:
    status, body = api(cluster).http("/v1/sessions?limit=500")
    if status != 200:
        raise RunError(f"GET /v1/sessions answered {status}: {body}")
    return list(body["sessions"])


def detail(cluster: Cluster, session_id: str) -> dict[str, Any]:
    status, body = api(cluster).http(f"/v1/sessions/{session_id}")
    if status != 200:
        raise RunError(f"GET /v1/sessions/{session_id} answered {status}: {body}")
    return dict(body)


def parked(summary: dict[str, Any]) -> bool:
    return str(summary["status"]).startswith((DROPPED_STATUS, AWAY_STATUS))


def workers_of(server: Server) -> list[dict[str, Any]]:
    status, body = server.http("/v1/pool")
    return list(body["workers"]) if status == 200 else []


def settled(cluster: Cluster) -> bool:
    """Both nodes up in both registries' views, every worker ready and in Kamailio's set."""
    assert cluster.door is not None
    if len(up_nodes(cluster)) != len(cluster.nodes):
        return False
    for name, server in cluster.nodes.items():
        if not cluster_up(cluster, name, len(cluster.nodes)):
            return False
        if sum(1 for w in workers_of(server) if w["state"] == "ready" and w["pid"]) != WORKERS:
            return False
    return len(cluster.door.active() or []) == WORKERS * len(cluster.nodes)


def wait_settled(cluster: Cluster, what: str) -> float:
    began = time.monotonic()
    try:
        wait_for(lambda: settled(cluster), SETTLE_S, what, interval=0.25)
    except AssertionError as exc:
        raise RunError(
            f"{exc} (logs: {[str(s.log_path) for s in cluster.nodes.values()]})"
        ) from None
    return time.monotonic() - began


# --- one round -----------------------------------------------------------------------------------


def phase_of(session: dict[str, Any]) -> str:
    types = [e["type"] for e in session["events"]]
    if session["ended"] is not None:
        return "ended"
    if parked(session):
        return "parked"
    if "tool_receipt" in types:
        return "receipt in"
    if "tool_request_sent" in types:
        return "request in flight"
    if "tool_intent" in types:
        return "intent logged"
    return "before the payment"


def find_session(cluster: Cluster, number: str, known: set[str]) -> str | None:
    def new() -> str | None:
        for s in summaries(cluster):
            if s["session_id"] in known:
                continue
            caller = detail(cluster, s["session_id"])["events"][0]["payload"].get("caller", "")
            if f"{number[-3:]}@" in str(caller):
                return str(s["session_id"])
        return None

    try:
        return wait_for(new, 20, "the round's session", interval=0.2)
    except AssertionError:
        return None


def kill(cluster: Cluster, rnd: Round, rng_draw: dict[str, Any]) -> Kill:
    """Kill -9 the victim the round drew; the victims are the open, unparked sessions it held."""
    session = detail(cluster, rnd.session) if rnd.session else None
    call_owner = str(session["owner"] or "") if session else ""
    call_node = call_owner.split(".", 1)[0] if call_owner else ""
    nodes = sorted(cluster.nodes)
    node = call_node if rng_draw["aim"] and call_node in nodes else nodes[rng_draw["node"]]
    kind = rng_draw["kind"]
    worker, pids = "", [int(w["pid"]) for w in workers_of(cluster.nodes[node]) if w["pid"]]
    if kind == "worker":
        listed = sorted(workers_of(cluster.nodes[node]), key=lambda w: str(w["name"]))
        mine = [w for w in listed if w["owner"] and w["owner"] == call_owner]
        victim = mine[0] if rng_draw["aim"] and mine else listed[rng_draw["worker"] % len(listed)]
        if not victim["pid"]:
            raise RunError(f"worker {victim['name']} has no pid to kill: {victim}")
        worker, pids = str(victim["name"]), [int(victim["pid"])]
    prefix = f"{worker}/" if worker else f"{node}."
    victims = [
        str(s["session_id"])
        for s in summaries(cluster)
        if s["terminal_state"] is None
        and not parked(s)
        and str(s["owner"] or "").startswith(prefix)
    ]
    phase = phase_of(session) if session else "no session"
    at = time.time()
    if kind == "node":
        cluster.kill_host(node)
    else:
        os.kill(pids[0], signal.SIGKILL)
    # A parked session's owner may still hold its dialog (the goodbye, the BYE): a hit too.
    hit = bool(call_owner) and call_owner.startswith(prefix) and phase != "ended"
    return Kill(rnd.index, kind, node, worker, at, hit, phase, pids, victims=victims)


def take_overs(cluster: Cluster, made: Kill, timeout: float) -> None:
    """Wait until every victim got its taker's first write (or ended); note the times."""

    def done() -> bool:
        for session_id in made.victims:
            if session_id in made.taken:
                continue
            session = detail(cluster, session_id)
            first = next(
                (e for e in session["events"] if e["type"] in TAKEN and e["at"] >= made.at), None
            )
            if first is not None:
                made.taken[session_id] = (first["type"], first["at"] - made.at)
            elif session["ended"] is not None:
                made.taken[session_id] = ("ended", session["ended"]["at"] - made.at)
        return len(made.taken) == len(made.victims)

    # What is left untaken is in the figures (and among the open sessions at the end).
    with contextlib.suppress(AssertionError):
        wait_for(done, timeout, "the killed process's sessions to be taken over", interval=0.1)


def dead_seen(cluster: Cluster, node: str) -> bool:
    survivor = cluster.nodes[cluster.other(node)]
    status, body = survivor.http("/v1/cluster")
    return status == 200 and any(n["name"] == node and n["state"] == "dead" for n in body["nodes"])


def door_target(cluster: Cluster) -> str:
    assert cluster.door is not None
    return cluster.door.target


def fate(cluster: Cluster, session_id: str) -> dict[str, Any] | None:
    """The session once parked for a callback or ended, else None."""
    session = detail(cluster, session_id)
    if session["ended"] is not None or parked(session):
        return session
    return None


def play_round(
    cluster: Cluster, args: argparse.Namespace, rng: random.Random, index: int, work: Path
) -> Round:
    assert cluster.door is not None
    gateway = cluster.net.gateway
    target = cluster.door.target
    # Every draw of the round, in one fixed order: the same seed, the same choices.
    faults_name, faults = FAULTS[rng.randrange(len(FAULTS))]
    draw = {
        "kind": "node" if rng.random() < args.node_share else "worker",
        "aim": rng.random() < args.aim,
        "node": rng.randrange(len(cluster.nodes)),
        "worker": rng.randrange(WORKERS),
        "after": rng.uniform(*KILL_WINDOW_S),
        "quick": rng.random() < args.quick_restart,
        "callback": rng.random() < args.callback,
    }
    number = f"+1555020{index:04d}"
    rnd = Round(index, faults_name, number)
    cluster.provider.set_faults(**(NO_FAULTS | faults))
    known = {s["session_id"] for s in summaries(cluster)}
    here = work / f"round-{index:02d}"
    payer = Sipp(
        "uac-pay-then-drop.xml", target, here / "pay", local_ip=gateway, timeout_s=60,
        extra=caller_args(here / "pay", number),
    ).start()  # fmt: skip
    try:
        rnd.session = find_session(cluster, number, known)
        time.sleep(draw["after"])
        made = kill(cluster, rnd, draw)
        rnd.kill = made
        if made.hit:
            payer.kill()  # its call is gone with the process: nobody will send it a BYE
        if made.kind == "node":
            made.quick = bool(draw["quick"])
            if not made.quick:
                try:
                    wait_for(
                        lambda: dead_seen(cluster, made.node),
                        DEAD_AFTER_S + 20,
                        f"the survivor to find {made.node} dead",
                    )
                except AssertionError as exc:
                    raise RunError(str(exc)) from None
                take_overs(cluster, made, DEAD_AFTER_S + 40)
            cluster.nodes[made.node].start()
            if made.quick:
                take_overs(cluster, made, 60)
        else:
            take_overs(cluster, made, 60)
        wait_settled(cluster, f"round {index}: every worker back after the kill")
        if rnd.session is not None:
            try:
                found = wait_for(
                    lambda: fate(cluster, rnd.session or ""),
                    FATE_S,
                    "the round's session to park or end",
                    interval=0.25,
                )
            except AssertionError:
                found = None
            if found is None:
                s = detail(cluster, rnd.session)
                rnd.fate = f"neither parked nor ended after {FATE_S:g} s ({s['status']})"
            elif found["ended"] is not None:
                rnd.fate = f"ended {found['ended']['terminal_state']}"
            else:
                rnd.fate = "parked"
                rnd.callback = call_back(cluster, rnd, found, draw["callback"], here)
        else:
            rnd.fate = "no session opened"
        if payer.process is not None and payer.process.poll() is None:
            try:
                rnd.payer_rc = payer.wait(timeout=30)
            except AssertionError:
                rnd.payer_rc = None
        else:
            rnd.payer_rc = payer.process.returncode if payer.process else None
    finally:
        payer.kill()
    return rnd


def call_back(
    cluster: Cluster, rnd: Round, session: dict[str, Any], wanted: bool, here: Path
) -> str:
    """The caller of a parked session calls back with its code (when the draw says so)."""
    if not wanted:
        return "let be"
    if not any(e["type"] == "resume_code_issued" for e in session["events"]):
        return "no code issued: let be"
    assert rnd.session is not None
    code = _code_of(api(cluster), session)
    gateway = cluster.net.gateway
    back = Sipp(
        "uac-callback.xml", door_target(cluster), here / "back", local_ip=gateway,
        timeout_s=60, extra=caller_args(here / "back", rnd.number, "1" + code),
    )  # fmt: skip
    rc = back.run()
    try:
        ended = wait_for(
            lambda: detail(cluster, rnd.session or "")["ended"],
            30,
            "the called-back session to end",
            interval=0.25,
        )
        outcome = str(ended["terminal_state"])
    except AssertionError:
        outcome = "still open 30 s after the callback"
    told = ""
    if rc != 0:
        told = f", SIPp exit {rc}: {back.errors().strip().splitlines()[-1:] or ''}"
    return f"called back with the code: {outcome}{told}"


def round_line(rnd: Round) -> str:
    k = rnd.kill
    if k is None:
        killed = "no kill"
    else:
        what = f"node {k.node}" if k.kind == "node" else f"worker {k.worker}"
        times = [t for _, t in k.taken.values()]
        took = f", taken over in {max(times):.1f} s" if times else ""
        quick = " (restarted at once)" if k.quick else ""
        killed = (
            f"kill {what}{quick} [{'the call' if k.hit else 'not the call'}, {k.phase}], "
            f"{len(k.victims)} sessions held{took}"
        )
    back = f" -> {rnd.callback}" if rnd.callback else ""
    return (
        f"  round {rnd.index:>2}: faults {rnd.faults:<16} | {killed} | {rnd.fate}{back}"
        f" | payer exit {rnd.payer_rc}"
    )


# --- the end -------------------------------------------------------------------------------------


def wait_all_terminal(cluster: Cluster, timeout: float) -> tuple[list[dict[str, Any]], float]:
    began = time.monotonic()
    last_print = 0.0
    while True:
        left = [s for s in summaries(cluster) if s["terminal_state"] is None]
        waited = time.monotonic() - began
        if not left or waited > timeout:
            return left, waited
        if waited - last_print >= 15:
            last_print = waited
            print(f"  waiting: {len(left)} sessions open after {waited:.0f} s", flush=True)
        time.sleep(1.0)


def log_events(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                yield event


def log_findings(
    cluster: Cluster, killed_pids: set[int]
) -> tuple[list[str], collections.Counter[str]]:
    """Worker exits that were not our kills, and error lines by event, from every node's logs."""
    exits: list[str] = []
    errors: collections.Counter[str] = collections.Counter()
    for name, server in cluster.nodes.items():
        for path in sorted(server.data_dir.glob("server-*.log")):
            for event in log_events(path):
                if event.get("event") == "worker.exited" and event.get("pid") not in killed_pids:
                    exits.append(
                        f"{name} {event.get('worker')} pid {event.get('pid')} "
                        f"status {event.get('status')} ({path.name})"
                    )
                if event.get("level") in ("error", "critical"):
                    errors[f"{name} {event.get('event')}"] += 1
    return exits, errors


def run(args: argparse.Namespace, work: Path) -> Outcome:
    rng = random.Random(args.seed)
    env = {
        "VOICEGATE_SESSION_CALLBACK_WINDOW_S": str(args.window),
        # The product's gap threshold (the harness's 30 s is for scenarios silent between
        # steps; the payer's capture is continuous until its drop) and a short recovery.
        "VOICEGATE_MEDIA_GAP_THRESHOLD_S": "1",
        "VOICEGATE_SESSION_RECOVERY_TIMEOUT_S": "2",
    }
    rounds: list[Round] = []
    with running_cluster(work, env=env) as cluster:
        print(
            f"  cluster up: nodes {sorted(cluster.nodes)} on {cluster.net.subnet}, Kamailio on "
            f"{door_target(cluster)}",
            flush=True,
        )
        wait_settled(cluster, "every worker of both nodes in Kamailio's set")
        for index in range(1, args.rounds + 1):
            rnd = play_round(cluster, args, rng, index, work)
            rounds.append(rnd)
            print(round_line(rnd), flush=True)
        killed_pids = {pid for r in rounds if r.kill is not None for pid in r.kill.pids}
        cluster.provider.set_faults(**NO_FAULTS)
        budget = args.window + 120.0
        print(f"  rounds done; waiting up to {budget:.0f} s for every session to end", flush=True)
        left, waited = wait_all_terminal(cluster, budget)
        listed = summaries(cluster)
        details = {str(s["session_id"]): detail(cluster, s["session_id"]) for s in listed}
        ledger = cluster.provider.ledger()
        exits, errors = log_findings(cluster, killed_pids)
    kills = [r.kill for r in rounds if r.kill is not None]
    return Outcome(rounds, kills, listed, details, ledger, left, waited, exits, errors, killed_pids)


def report(out: Outcome, args: argparse.Namespace) -> int:
    print(f"\nrounds: {len(out.rounds)} (seed {args.seed})")
    by_kind = collections.Counter(
        f"{k.kind}{' (restarted at once)' if k.quick else ''}" for k in out.kills
    )
    hits = collections.Counter(f"{k.kind} {k.phase}" for k in out.kills if k.hit)
    print(
        f"kills: {len(out.kills)}: "
        + ", ".join(f"{n} {kind}" for kind, n in sorted(by_kind.items()))
    )
    print(
        f"  of them on the process serving the round's call: {sum(hits.values())} ("
        + ", ".join(f"{n} {what}" for what, n in sorted(hits.items()))
        + ")"
    )
    for kind in ("node", "worker"):
        taken = [t for k in out.kills if k.kind == kind and not k.quick for t in k.taken.values()]
        times = [t for how, t in taken if how != "ended"]
        untaken = sum(len(k.victims) - len(k.taken) for k in out.kills if k.kind == kind)
        how = collections.Counter(h for h, _ in taken)
        who = "the survivor's" if kind == "node" else "the restarted worker's"
        if times:
            print(
                f"  take-over after a {kind} kill (kill to {who} first write): "
                f"p50 {statistics.median(times):.1f} s, max {max(times):.1f} s over "
                f"{len(times)} sessions ({dict(how)}); not taken within the wait: {untaken}"
            )
        else:
            print(
                f"  take-over after a {kind} kill: no session held at a kill ({dict(how)}); "
                f"not taken within the wait: {untaken}"
            )
    quick = [t for k in out.kills if k.quick for _, t in k.taken.values()]
    if quick:
        print(
            f"  node restarted at once: its sessions finalised in p50 "
            f"{statistics.median(quick):.1f} s, max {max(quick):.1f} s after the kill"
        )

    sessions = out.details
    with_intent = [
        s for s in sessions.values() if any(e["type"] == "tool_intent" for e in s["events"])
    ]
    sent = collections.Counter(
        (sid, e["payload"]["key"])
        for sid, s in sessions.items()
        for e in s["events"]
        if e["type"] == "tool_request_sent"
    )
    print(
        f"payments attempted: {len(out.rounds)} payer calls, {len(with_intent)} sessions logged a "
        f"charge intent, {len(sent)} requests sent ({sum(1 for n in sent.values() if n > 1)} keys "
        f"sent more than once)"
    )
    rows = out.ledger
    committed = [r for r in rows if r["status"] == "committed"]
    statuses = collections.Counter(str(r["status"]) for r in rows)
    print(f"provider's ledger: {len(rows)} rows ({dict(statuses)}); charges: {len(committed)}")

    receipts: dict[str, set[str]] = collections.defaultdict(set)  # key -> outcomes
    committed_by: dict[str, set[str]] = collections.defaultdict(set)  # key -> sessions
    for sid, s in sessions.items():
        for e in s["events"]:
            if e["type"] == "tool_receipt":
                receipts[e["payload"]["key"]].add(e["payload"]["outcome"])
                if e["payload"]["outcome"] == "committed":
                    committed_by[e["payload"]["key"]].add(sid)
    intent_of = {  # key -> the session that logged its intent
        e["payload"]["key"]: sid
        for sid, s in sessions.items()
        for e in s["events"]
        if e["type"] == "tool_intent"
    }
    per_key = collections.Counter(r["key"] for r in committed)
    twice_by_key = sum(n - 1 for n in per_key.values() if n > 1)
    per_session = collections.Counter(intent_of.get(r["key"], r["key"]) for r in committed)
    twice_by_session = sum(n - 1 for n in per_session.values() if n > 1)
    sessions_committed = {sid for ids in committed_by.values() for sid in ids}
    beyond = max(0, len(committed) - len(sessions_committed))
    duplicates = twice_by_key + twice_by_session + beyond
    print(
        f"duplicate charges: {duplicates} ({twice_by_key} keys with two committed rows, "
        f"{twice_by_session} sessions whose intents have two committed rows, {beyond} committed "
        f"rows beyond the sessions with a committed receipt: {len(committed)} rows, "
        f"{len(sessions_committed)} sessions)"
    )
    ledger_keys = {str(r["key"]) for r in committed}
    unmatched_rows = sorted(ledger_keys - set(committed_by))
    unmatched_receipts = sorted(set(committed_by) - ledger_keys)
    conflicted = {k: v for k, v in receipts.items() if len(v) > 1}
    agree = not unmatched_rows and not unmatched_receipts
    print(
        f"ledger and receipts agree: {'yes' if agree else 'NO'} ({len(ledger_keys)} committed "
        f"keys in the ledger, {len(committed_by)} keys with a committed receipt; ledger only: "
        f"{len(unmatched_rows)}, receipts only: {len(unmatched_receipts)}; keys with two "
        f"outcomes: {len(conflicted)})"
    )
    round_of = {r.session: r for r in out.rounds if r.session}
    for key in unmatched_rows[:5] + unmatched_receipts[:5]:
        sid = intent_of.get(key) or next(iter(committed_by.get(key, ())), "")
        where = "ledger only" if key in unmatched_rows else "receipt only"
        print(f"  {where}: {key}: session {sid or 'none'}, receipts {sorted(receipts[key])}")
        if sid in round_of:
            print(f"    {round_line(round_of[sid]).strip()}")
        if sid in sessions:
            s = sessions[sid]
            print(f"    ended: {s['ended']}; outstanding intents: {s['outstanding_intents']}")
            events = [f"{e['type']}@{e['at'] - s['events'][0]['at']:.1f}" for e in s["events"]]
            print(f"    events (s after the offer): {' '.join(events[-14:])}")

    states = collections.Counter(str(s["terminal_state"]) for s in out.summaries)
    print(f"sessions: {len(out.summaries)}, by terminal state: {dict(sorted(states.items()))}")
    needs = [
        sid
        for sid, s in sessions.items()
        if s["ended"] and s["ended"]["terminal_state"] == "needs_human"
    ]
    if needs:
        print(f"  needs_human: {needs[:5]}")
    print(f"sessions left open: {len(out.open_after_wait)} (after waiting {out.waited_s:.0f} s)")
    for s in out.open_after_wait[:10]:
        print(f"  open: {s['session_id']} owner {s['owner']}: {s['status']}")
    callbacks = collections.Counter(r.callback.split(":")[0] or "-" for r in out.rounds)
    fates = collections.Counter(r.fate for r in out.rounds)
    print(f"round sessions: {dict(fates)}; callbacks: {dict(callbacks)}")
    print(f"worker exits that were not the bench's kills: {len(out.unexpected_exits)}")
    for line in out.unexpected_exits[:10]:
        print(f"  {line}")
    print(f"error log lines: {sum(out.error_lines.values())} {dict(out.error_lines)}")

    broken = []
    if duplicates:
        broken.append(
            f"{duplicates} duplicate charges ({twice_by_key} by key, {twice_by_session} by "
            f"session, {beyond} committed rows beyond the sessions with a committed receipt)"
        )
    if not agree:
        broken.append(
            f"ledger and receipts disagree ({len(unmatched_rows)} committed rows without a "
            f"committed receipt, {len(unmatched_receipts)} committed receipts without a row)"
        )
    if out.open_after_wait:
        broken.append(f"{len(out.open_after_wait)} sessions left open")
    for problem in broken:
        print(f"INVARIANT BROKEN: {problem}")
    return 1 if broken else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="payment calls, one kill each")
    parser.add_argument("--seed", type=int, default=1, help="seed of every choice of the run")
    parser.add_argument(
        "--node-share", type=float, default=0.5,
        help="share of the kills that take a whole node (the rest: one worker)",
    )  # fmt: skip
    parser.add_argument(
        "--aim", type=float, default=0.5,
        help="share of the kills aimed at the node or worker serving the round's call",
    )  # fmt: skip
    parser.add_argument(
        "--quick-restart", type=float, default=0.2,
        help="share of the node kills restarted at once, before the survivor takes over",
    )  # fmt: skip
    parser.add_argument(
        "--callback", type=float, default=0.5,
        help="share of the parked sessions whose caller calls back with the code",
    )  # fmt: skip
    parser.add_argument(
        "--window", type=float, default=30.0,
        help="session.callback_window_s of the nodes: a parked session ends this long after",
    )  # fmt: skip
    parser.add_argument("--work", help="keep logs and SIPp traces here (default: a temp dir)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="voicegate-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"voicegate cluster chaos: {args.rounds} rounds, seed {args.seed}, 2 nodes x {WORKERS} "
        f"workers, dead after {DEAD_AFTER_S:g} s, callback window {args.window:g} s, "
        f"{os.cpu_count()} cores\n  work dir: {work}",
        flush=True,
    )
    try:
        out = run(args, work)
    except (RunError, AssertionError, OSError) as exc:
        traceback.print_exc()
        print(f"\nthe run could not be carried out: {exc}\n  logs: {work}")
        return 2
    return report(out, args)


if __name__ == "__main__":
    sys.exit(main())
