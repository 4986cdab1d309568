"""Caller callback end to end (issue 18; docs/tenants.md, "Coming back"): a real SIPp caller
starts a payment through the demo agent against the real reference payment provider (slow to
answer), then its RTP stops for good; the server's media recovery gives up and hangs up, and the
session is dropped, not ended. The caller calls back from the same number: "Press 1", the resume
code, and the payment's outcome (reconciled by status, never charged again). One server for the
module, at the product's gap threshold (1 s); each drop is about seventeen seconds of call (14 s
of it the caller's own capture), each callback about eight.

The test plays a caller who heard the code read out: it recovers the code from the digest in
the session's log and the installation key in the server's data directory (which the test
owns), as no log, metric or API answer ever holds it.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.caller_stream import PAY_THEN_DROP, last_packet_ms
from tests.integration.harness import Provider, Server, Sipp, wait_for
from tests.secret_audit import AUDIT
from voicegate.call.callback_keys import CODE_DIGITS, KEY_FILE

# Two callers cut off at once (the module makes both drops in parallel), and a third who never
# called before.
CALLER = "+15550100177"
OTHER_CALLER = "+15550100188"
STRANGER = "+15550100199"
RESPOND_DELAY_S = 120.0
# uac-pay-then-drop.xml's caller sends RTP without a break for this long from its ACK, then
# none: the one media gap of its call begins there.
DROP_AFTER_S = last_packet_ms(PAY_THEN_DROP) / 1000
GAP_THRESHOLD_S = 1.0


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    p = Provider(tmp_path_factory.mktemp("provider")).start()
    p.set_faults(respond_delay_s=RESPOND_DELAY_S)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, provider: Provider) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("callback")
    env = {
        **provider.tool_env(timeout_s=100.0),
        # The product's own threshold: the harness's default (30 s, for scenarios silent
        # between their steps) would hold every drop half a minute before its gap counts.
        "VOICEGATE_MEDIA_GAP_THRESHOLD_S": str(GAP_THRESHOLD_S),
        "VOICEGATE_SESSION_RECOVERY_TIMEOUT_S": "2",
        "VOICEGATE_SESSION_CALLBACK_WINDOW_S": "120",
    }
    s = Server(root / "server", env_overrides=env).start()
    yield s
    s.stop()


def _session(server: Server, session_id: str) -> dict[str, Any]:
    status, body = server.http(f"/v1/sessions/{session_id}")
    assert status == 200, body
    return dict(body)


def _types(session: dict[str, Any]) -> list[str]:
    return [e["type"] for e in session["events"]]


def _dropping(server: Server, work: Path, number: str) -> Sipp:
    """A payment started, then the media lost for good (uac-pay-then-drop.xml)."""
    work.mkdir(parents=True, exist_ok=True)
    csv = work / "caller.csv"
    csv.write_text(f"SEQUENTIAL\n{number};\n")
    AUDIT.register(number, "caller number", "tests/integration/test_callback.py")
    return Sipp(
        "uac-pay-then-drop.xml", server.sip_target, work, extra=("-inf", str(csv)), timeout_s=45
    ).start()


@pytest.fixture(scope="module")
def dropped(
    server: Server, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """The dropped session of each of the two callers, by number."""
    work = tmp_path_factory.mktemp("drops")
    callers = {n: _dropping(server, work / n.lstrip("+"), n) for n in (CALLER, OTHER_CALLER)}
    for caller in callers.values():
        assert caller.wait() == 0, caller.errors()  # it got the server's BYE
    sessions = {}
    for number in callers:
        (session,) = [
            s
            for s in server.sessions()
            if f"{number[-3:]}@" in s["events"][0]["payload"]["caller"]
        ]
        sessions[number] = _when_dropped(server, session["session_id"])
        assert sessions[number]["ended"] is None
    return sessions


def _when_dropped(server: Server, session_id: str) -> dict[str, Any]:
    def dropped() -> dict[str, Any] | None:
        session = _session(server, session_id)
        return session if session["status"].startswith("signaling dropped") else None

    found: dict[str, Any] = wait_for(dropped, 10, "the session to be dropped")
    return found


def _code_of(server: Server, session: dict[str, Any]) -> str:
    """The code the agent read out, as the caller heard it (see the module's docstring)."""
    (issued,) = [e for e in session["events"] if e["type"] == "resume_code_issued"]
    digest = issued["payload"]["digest"]
    key = hmac.new((server.data_dir / KEY_FILE).read_bytes(), digestmod=sha256)
    prefix = b"\0".join((b"code", session["session_id"].encode(), b""))
    for n in range(10**CODE_DIGITS):
        code = f"{n:0{CODE_DIGITS}d}"
        mac = key.copy()
        mac.update(prefix + code.encode())
        if mac.hexdigest() == digest:
            AUDIT.register_resume_code(code, "tests/integration/test_callback.py")
            return code
    raise AssertionError("no code has the session's digest")


def _call_back(server: Server, work: Path, scenario: str, number: str, keys: str) -> None:
    work.mkdir(parents=True, exist_ok=True)
    csv = work / "keys.csv"
    csv.write_text(f"SEQUENTIAL\n{number};{';'.join(keys)};\n")
    AUDIT.register(number, "caller number", "tests/integration/test_callback.py")
    sipp = Sipp(scenario, server.sip_target, work, extra=("-inf", str(csv)), timeout_s=60)
    assert sipp.run() == 0, sipp.errors()


def _new_sessions(server: Server, known: set[str]) -> list[dict[str, Any]]:
    return [s for s in server.sessions() if s["session_id"] not in known]


def test_a_dropped_callers_gap_is_found_within_the_threshold_of_its_last_packet(
    dropped: dict[str, dict[str, Any]],
) -> None:
    # The server's own times: its answer comes before SIPp's ACK, from which the caller's
    # capture plays for DROP_AFTER_S, so its gap can be found no sooner than the threshold after
    # that, and within a few health polls (media.health_poll_s, 200 ms) and SIPp's set-up.
    for session in dropped.values():
        types = _types(session)
        assert types.count("media_lost") == 1, types  # no gap but the drop: RTP was continuous
        answered = next(e for e in session["events"] if e["type"] == "call_answered")
        lost = next(e for e in session["events"] if e["type"] == "media_lost")
        found = lost["at"] - answered["at"] - DROP_AFTER_S
        assert GAP_THRESHOLD_S <= found <= GAP_THRESHOLD_S + 2.0, found


def test_a_caller_cut_off_mid_payment_calls_back_enters_the_code_and_hears_the_outcome(
    server: Server, provider: Provider, dropped: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    mine = dropped[CALLER]
    session_id = mine["session_id"]
    types = _types(mine)
    # The write was under way: its intent sent, no receipt yet, and the code issued with it.
    assert "tool_intent" in types and "tool_receipt" not in types
    assert types.index("resume_code_issued") > types.index("tool_intent")
    fired = mine["events"][-1]
    assert fired["type"] == "deadline_fired" and fired["payload"]["name"] == "recovery"
    assert not any(x["kind"] == "finished" for x in fired["effects"])
    code = _code_of(server, mine)
    known = {s["session_id"] for s in server.sessions()}

    _call_back(server, tmp_path / "back", "uac-callback.xml", CALLER, "1" + code)
    session = wait_for(
        lambda: (s := _session(server, session_id))["ended"] and s, 15, "the session to end"
    )
    types = _types(session)
    (back,) = [e for e in session["events"] if e["type"] == "called_back"]
    assert back["payload"]["generation"] == 1 and back["payload"]["with_code"] is True
    assert session["lease_epoch"] == 2  # taken over for the callback
    responses = [
        e["payload"]["response_id"] for e in session["events"] if e["type"] == "response_started"
    ]
    assert len(responses) == len(set(responses)), responses  # the callback's are g1.r1, ...
    # Reconciled by status after the callback, not sent again: one receipt, one ledger row.
    assert types.index("tool_receipt") > types.index("called_back")
    (receipt,) = [e for e in session["events"] if e["type"] == "tool_receipt"]
    assert receipt["payload"]["outcome"] == "committed"
    key = receipt["payload"]["key"]
    assert [r["status"] for r in provider.ledger() if r["key"] == key] == ["committed"]
    # The caller heard the outcome: the demo agent told it (its log line, no digits in it).
    told = [e for e in server.log_events() if e.get("event") == "demo.payment"]
    assert [e["outcome"] for e in told if e.get("call_id") == session_id] == ["committed"]
    assert session["ended"]["terminal_state"] == "completed"
    assert _new_sessions(server, known) == []  # no other session for this call
    assert server.metric("voicegate_callbacks_offered_total") >= 1
    assert server.metric("voicegate_callbacks_total", outcome="accepted") == 1
    assert server.metric("voicegate_callback_code_attempts_total", result="ok") == 1
    assert code not in server.log()


def test_another_number_or_a_wrong_code_three_times_starts_a_new_session(
    server: Server, dropped: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    mine = dropped[OTHER_CALLER]
    session_id = mine["session_id"]
    code = _code_of(server, mine)
    wrong = f"{(int(code) + 1) % 10**CODE_DIGITS:0{CODE_DIGITS}d}"
    offered = server.metric("voicegate_callbacks_offered_total")
    known = {s["session_id"] for s in server.sessions()}

    # Another number: not offered, a new session; the dropped one keeps waiting.
    _call_back(server, tmp_path / "stranger", "uac-callback.xml", STRANGER, "1" + code)
    (stranger,) = _new_sessions(server, known)
    assert server.metric("voicegate_callbacks_offered_total") == offered
    assert "called_back" not in _types(stranger)
    assert _session(server, session_id)["status"].startswith("signaling dropped")
    known.add(stranger["session_id"])

    # The right number, a wrong code three times: each counted, then a new session, and the
    # dropped one ends as it would have at the drop.
    wrongs = server.metric("voicegate_callback_code_attempts_total", result="wrong")
    _call_back(
        server, tmp_path / "wrong", "uac-callback-wrong-code.xml", OTHER_CALLER, "1" + wrong
    )
    assert server.metric("voicegate_callbacks_offered_total") == offered + 1
    assert server.metric("voicegate_callback_code_attempts_total", result="wrong") == wrongs + 3
    assert server.metric("voicegate_callbacks_total", outcome="code_refused") == 1
    (fresh,) = _new_sessions(server, known)
    assert "called_back" not in _types(fresh)
    ended = _session(server, session_id)
    assert ended["ended"]["terminal_state"] == "timed_out"
    assert ended["ended"]["stage"] == "recovery"
    assert "media not recovered within 2 s" in ended["ended"]["reason"]
    (last,) = [e for e in ended["events"] if e["type"] == "callback_ended"]
    assert last["payload"]["cause"] == "code_refused"
    assert "called_back" not in _types(ended)
