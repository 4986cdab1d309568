"""Speech on real calls: does recognising some callers move the other calls' frame path?

Prints figures, never passes or fails (STYLE.md; tests assert behaviour, benchmarks measure).

    python bench/speech_calls.py              # 3 talkers + 1 barge-in caller, speech off, on
    python bench/speech_calls.py --repeat 3

For each of ``agent.speech = false`` (the demo takes no audio) and ``true``, it starts
``voicegate serve`` on free loopback ports, runs three SIPp callers that talk for 7 s
(``uac-speech-dtmf.xml``) and, a second later, one that talks over the greeting
(``uac-barge-in.xml``), then reads the server's own histograms: barge-in latency (speech onset to
the last agent frame sent, every barge-in of the run), and how late the media tick ran
(``voicegate_event_loop_lag_seconds``: the event loop held by anything, the recognition
thread's GIL included). One worker, at most 4 calls; loopback only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.harness import Server, Sipp, wait_for  # noqa: E402

LAG_BUCKETS = ("0.005", "0.01", "0.02")


def run(speech: bool, work: Path) -> dict[str, float]:
    server = Server(
        work / "server",
        env_overrides={"VOICEGATE_AGENT_SPEECH": "true" if speech else "false",
                       "VOICEGATE_LOG_LEVEL": "warning"},
    ).start()  # fmt: skip
    try:
        talkers = [
            Sipp("uac-speech-dtmf.xml", server.sip_target, work / f"talk{i}").start()
            for i in range(3)
        ]
        time.sleep(1.0)
        barge = Sipp("uac-barge-in.xml", server.sip_target, work / "barge").start()
        codes = [s.wait() for s in (*talkers, barge)]
        wait_for(lambda: len([s for s in server.sessions() if s["ended"]]) == 4 or None, 20,
                 "the sessions to end")  # fmt: skip
        m = server.metrics()
    finally:
        server.stop()

    def value(name: str, **labels: str) -> float:
        return m.get((name, tuple(sorted(labels.items()))), 0.0)

    lag_count = value("voicegate_event_loop_lag_seconds_count")
    out = {
        "failed_calls": float(sum(1 for c in codes if c != 0)),
        "barge_ins": value("voicegate_barge_in_latency_seconds_count"),
        "barge_in_mean_ms": 1000 * value("voicegate_barge_in_latency_seconds_sum")
        / max(1.0, value("voicegate_barge_in_latency_seconds_count")),
        "ticks": lag_count,
        "lag_mean_ms": 1000 * value("voicegate_event_loop_lag_seconds_sum") / max(1.0, lag_count),
    }
    for bucket in LAG_BUCKETS:
        below = value("voicegate_event_loop_lag_seconds_bucket", le=bucket)
        out[f"over_{bucket}"] = (lag_count - below) / max(1.0, lag_count)
    out["said"] = sum(
        value("voicegate_caller_said_total", decision=d)
        for d in ("accepted", "confirmed", "rejected", "reprompted", "keypad_offered")
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print("speech on real calls: 3 talking callers + 1 barge-in caller on one worker")
    for n in range(args.repeat):
        for speech in (False, True):
            with tempfile.TemporaryDirectory(prefix="voicegate-speech-") as tmp:
                r = run(speech, Path(tmp))
            print(
                f"  run {n + 1}, speech {'on ' if speech else 'off'}: "
                f"{r['barge_ins']:.0f} barge-ins, mean latency {r['barge_in_mean_ms']:.0f} ms; "
                f"media tick late by {r['lag_mean_ms']:.1f} ms on average over {r['ticks']:.0f} "
                f"ticks, {r['over_0.005']:.1%} over 5 ms, {r['over_0.01']:.1%} over 10 ms, "
                f"{r['over_0.02']:.1%} over 20 ms; {r['said']:.0f} utterances logged; "
                f"{r['failed_calls']:.0f} SIPp failures"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
