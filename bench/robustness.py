"""The PROTOS c07-sip corpus, all of it, through one worker's call path: does anything kill it?

Prints figures, never passes or fails (the suite's tests/robustness/ runs the fast samples).

    python bench/robustness.py                       # all 4,527 cases over UDP
    python bench/robustness.py --groups sdp-connection-ip,sdp-origin-ip
    python bench/robustness.py --first 2400          # from case 2400 on
    python bench/robustness.py --no-ack              # answered cases left half-open

Each case is replayed as tests/robustness/protos.py does it (answered cases ACKed and hung up,
ringing ones CANCELled with their own teardown). Every ``--check-every`` cases an OPTIONS must be
answered; a worker that dies is noted with the case and PJSIP's last assertion line, then started
again so the run goes on. At the end: the final status of the INVITEs per group, the deaths, the
sessions left open once the worker has stopped, and the worker's RSS before and after. Cases of
more than 65,507 bytes only fit over TCP and are counted as skipped. Every ``--call-every`` cases
a real SIPp call must go through too.

``--no-ack`` leaves every answered case half-open (never ACKed, its BYE never answered), as a
careless or hostile caller would: the worker must free those call slots itself at
``sip.ack_timeout_s`` (``--ack-timeout``), so few later cases should meet a full worker (486).
"""

from __future__ import annotations

import argparse
import collections
import socket
import sys
import time
from pathlib import Path
from tempfile import mkdtemp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.harness import Server, Sipp  # noqa: E402
from tests.robustness.protos import Replayer, load  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def options_answered(port: int) -> bool:
    """An out-of-dialog OPTIONS to the worker gets a final answer within 2 s."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        local = sock.getsockname()[1]
        call_id = f"bench-options-{time.monotonic_ns()}"
        message = (
            f"OPTIONS sip:service@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bK{time.monotonic_ns()}\r\n"
            f"From: <sip:bench@127.0.0.1:{local}>;tag=bench\r\n"
            f"To: <sip:service@127.0.0.1:{port}>\r\nCall-ID: {call_id}\r\n"
            "CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        )
        sock.sendto(message.encode(), ("127.0.0.1", port))
        sock.settimeout(2.0)
        try:
            return sock.recvfrom(65535)[0].startswith(b"SIP/2.0 2")
        except TimeoutError:
            return False


def real_call(server: Server, work: Path) -> bool:
    """A SIPp caller that talks and hangs up, as a user would, gets through."""
    work.mkdir(parents=True, exist_ok=True)
    # Wait out the set-up rate's refusals and slots still held by the last cases: a call that
    # a full worker refused (486, 503) is tried again a few times.
    for _ in range(5):
        if Sipp("uac-server-hangup.xml", server.sip_target, work).run() == 0:
            return True
        time.sleep(2)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default="", help="comma-separated PROTOS groups (all)")
    parser.add_argument("--first", type=int, default=0, help="first case number")
    parser.add_argument("--last", type=int, default=10**9, help="last case number")
    parser.add_argument("--check-every", type=int, default=25, help="an OPTIONS every N cases")
    parser.add_argument("--call-every", type=int, default=250, help="a SIPp call every N cases")
    parser.add_argument("--no-ack", action="store_true", help="never ACK an answered case")
    parser.add_argument("--ack-timeout", default="8", help="sip.ack_timeout_s of the worker")
    parser.add_argument("--work", help="keep the servers' data here (default: a temp dir)")
    args = parser.parse_args()
    groups = set(args.groups.split(",")) if args.groups else None
    work = Path(args.work or mkdtemp(prefix="voicegate-robustness-"))
    env = {"VOICEGATE_SIP_MAX_SETUP_RATE": "60", "VOICEGATE_SIP_ACK_TIMEOUT_S": args.ack_timeout}
    servers = [Server(work / "server-0", env_overrides=env).start()]
    server = servers[0]
    assert server.process is not None
    rss_before = rss_mib(server.process.pid)
    replayer = Replayer("127.0.0.1", server.sip_port, ack=not args.no_ack)
    finals: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    deaths: list[tuple[int, str, str]] = []
    silent_checks = 0
    calls_tried = calls_failed = 0
    started = time.monotonic()
    print(f"voicegate robustness: PROTOS c07-sip over UDP at one worker (work dir {work})")
    replayed = 0
    for case in load(groups):
        if not args.first <= case.number <= args.last:
            continue
        outcome = replayer.replay(case)
        replayed += 1
        finals[case.group][str(outcome.final) if outcome.final else "none"] += 1
        assert server.process is not None
        if server.process.poll() is not None:
            lines = [line for line in server.log().splitlines() if "Assertion" in line]
            deaths.append((case.number, case.group, lines[-1] if lines else "(no assertion)"))
            print(f"  case {case.number} ({case.group}) killed the worker: {deaths[-1][2]}")
            server = Server(work / f"server-{len(servers)}", env_overrides=env).start()
            servers.append(server)
            replayer.close()
            replayer = Replayer("127.0.0.1", server.sip_port, ack=not args.no_ack)
        else:
            if replayed % args.check_every == 0 and not options_answered(server.sip_port):
                silent_checks += 1
            if replayed % args.call_every == 0:
                calls_tried += 1
                if not real_call(server, work / f"call-{replayed}"):
                    calls_failed += 1
        if replayed % 500 == 0:
            print(f"  {replayed} cases, {time.monotonic() - started:.0f} s", flush=True)
    assert server.process is not None
    # No slot outlives the ACK timer and the local end of an unanswered BYE (telephony/half_open.py,
    # dialog_end.py): the worker must be empty by then, whatever the last cases left.
    last_case = time.monotonic()
    slot_bound_s = float(args.ack_timeout) + 4.0 + 2.0
    while server.live_calls() and time.monotonic() - last_case < slot_bound_s:
        time.sleep(0.2)
    held = len(server.live_calls())
    emptied_s = time.monotonic() - last_case
    rss_after = rss_mib(server.process.pid)
    half_open = sum(s.metric("voicegate_calls_half_open_total") for s in servers[-1:])
    ended_locally = sum(s.metric("voicegate_dialogs_ended_locally_total") for s in servers[-1:])
    replayer.close()
    for each in servers:
        each.stop()
    left_open = sum(
        1
        for each in servers
        if (each.data_dir / "voicegate.sqlite3").exists()
        for s in each.stored_sessions()
        if s["terminal_state"] is None
    )
    print(f"\n{replayed} cases in {time.monotonic() - started:.0f} s")
    print(f"{'group':32} final statuses of the INVITEs")
    for group, counts in finals.items():
        print(f"{group:32} " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"worker deaths: {len(deaths)}" + "".join(f"\n  {n} {g}: {a}" for n, g, a in deaths))
    print(f"OPTIONS checks unanswered: {silent_checks}")
    print(f"real calls: {calls_tried - calls_failed} of {calls_tried} went through")
    if args.no_ack:
        print(f"half-open calls ended by the worker: {half_open:.0f} (sip.ack_timeout_s)")
        print(f"dialogs ended locally (BYE unanswered): {ended_locally:.0f}")
    print(
        f"calls still on the line {slot_bound_s:g} s after the last case: {held}"
        f" (empty {emptied_s:.1f} s after it)"
    )
    print(f"sessions left open after the run: {left_open}")
    print(f"worker RSS: {rss_before:.1f} MiB before, {rss_after:.1f} MiB after (last worker)")


if __name__ == "__main__":
    main()
