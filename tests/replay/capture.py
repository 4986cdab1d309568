"""Write a replay history (``tests/replay/histories/NAME.jsonl``) and its final state.

Two sources:

    python tests/replay/capture.py --db PATH --session ID --name NAME
        Export a real session from a SQLite store file (``voicegate.sqlite3`` in a server's data
        dir). The session should be terminal; its log's fold must equal the store's latest
        checkpoint, or the capture is refused (the log and the live state disagree: a bug).

    python tests/replay/capture.py --example media-gap-then-hangup
        Rebuild the hand-crafted history committed first, by driving the state machine: a call
        offered and answered, a media gap and its restoration, a caller hang-up.

    python tests/replay/capture.py --db PATH --list
        The sessions in a store file, to find the ID.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``session`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from session import events as ev
from session.machine import step
from session.state import SessionState
from tests.replay.replayer import HISTORIES, Record, write

# Wall-clock times, as the runtime logs them (epoch seconds).
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def media_gap_then_hangup() -> tuple[str, list[Record]]:
    """Offered, answered, one exchange, a 1.4 s media gap restored, the caller hangs up."""
    session_id = "example-media-gap"
    policy = {
        "recovery_timeout_s": 20.0,
        "max_duration_s": 3600.0,
        "no_input_s": 0.0,
        "no_input_grace_s": 10.0,
    }
    timeline: list[tuple[ev.Event, float]] = [
        (ev.CallOffered("sip:*******234@192.0.2.10", "service", policy), 0.0),
        (ev.CallAnswered(), 0.4),
        (ev.TurnStarted("t1"), 1.2),
        (ev.TurnCommitted("t1"), 2.5),
        (ev.ResponseStarted("r1", "t1"), 2.9),
        (ev.ResponseFinished("r1", 2100), 5.0),
        (ev.MediaLost(), 7.3),
    ]
    state = SessionState(session_id)
    records: list[Record] = []

    def feed(event: ev.Event, dt: float) -> None:
        nonlocal state
        state, _ = step(state, event, T0 + dt)
        assert state.version == len(records) + 1, f"{event.type} was not accepted"
        records.append(Record(state.version, event.type, event.to_dict(), T0 + dt))

    for event, dt in timeline:
        feed(event, dt)
    # The recovery's first scheduled attempt comes due inside the gap; its OPTIONS is answered.
    recovery = state.recovery
    assert recovery is not None and "recovery_retry" in state.deadlines
    retry_at = state.deadlines["recovery_retry"].due - T0
    feed(ev.RecoveryRetryDue(recovery.generation, 0), retry_at)
    feed(ev.RecoveryProbed(recovery.generation, 0, 200, "OK"), retry_at + 0.05)
    feed(ev.MediaRestored(recovery.generation), 8.7)
    feed(ev.TurnStarted("t2"), 9.5)
    feed(ev.TurnCommitted("t2"), 10.8)
    feed(ev.CallerHangup(), 12.0)
    assert state.ended is not None and state.ended.terminal_state == "completed"
    return session_id, records


EXAMPLES: dict[str, Callable[[], tuple[str, list[Record]]]] = {
    "media-gap-then-hangup": media_gap_then_hangup,
}


def export(db: Path, session_id: str) -> list[Record]:
    """The log of ``session_id`` in the SQLite store ``db``, checked against its checkpoint."""
    from session.store.sqlite import SqliteSessionStore

    store = SqliteSessionStore(db)
    try:
        summary = store.get(session_id)
        if summary is None:
            raise SystemExit(f"capture: no session {session_id!r} in {db}")
        if summary.terminal_state is None:
            print(f"capture: warning: session {session_id!r} is not terminal", file=sys.stderr)
        stored = store.events(session_id)
        checkpoint = store.latest_checkpoint(session_id)
    finally:
        store.close()
    records = [Record(r.seq, r.type, r.payload, r.at) for r in stored]
    if checkpoint is not None and checkpoint.seq == len(records):
        state = SessionState(session_id)
        for r in records:
            state, _ = step(state, ev.event_from_dict(r.type, r.payload), r.at)
        if json.loads(json.dumps(state.to_dict())) != json.loads(json.dumps(checkpoint.state)):
            raise SystemExit(
                f"capture: the fold of {session_id!r} differs from its stored checkpoint at seq"
                f" {checkpoint.seq}: the log does not rebuild the live state (a bug to report)"
            )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--db", type=Path, help="a SQLite session store file")
    parser.add_argument("--session", help="the session id to export from --db")
    parser.add_argument("--list", action="store_true", help="list the sessions in --db")
    parser.add_argument("--example", choices=sorted(EXAMPLES), help="rebuild a crafted history")
    parser.add_argument("--name", help="history name (default: the example's name)")
    parser.add_argument("--out", type=Path, default=HISTORIES, help="directory to write to")
    args = parser.parse_args(argv)
    if args.db is not None and not args.db.is_file():
        # Opening a store creates it: never leave an empty one behind a typo.
        parser.error(f"--db {args.db}: no such file")

    if args.list:
        if args.db is None:
            parser.error("--list needs --db")
        from session.store.sqlite import SqliteSessionStore

        store = SqliteSessionStore(args.db)
        try:
            summaries, _ = store.list(limit=500)
        finally:
            store.close()
        for s in summaries:
            print(f"{s.session_id}\t{s.terminal_state or 'open'}\t{s.last_seq} events\t{s.status}")
        return 0
    if args.example:
        session_id, records = EXAMPLES[args.example]()
        name = args.name or args.example
    elif args.db is not None and args.session:
        if not args.name:
            parser.error("--db/--session need --name")
        session_id, records, name = args.session, export(args.db, args.session), args.name
    else:
        parser.error("give --example NAME, or --db PATH with --session ID --name NAME (or --list)")
    history = args.out / f"{name}.jsonl"
    state = write(history, records, session_id)
    print(f"capture: wrote {history} ({len(records)} events, ended {state.status()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
