"""RFC 4028 session timers with real SIPp dialogs (Min-SE is 90 s, so these take a minute)."""

from __future__ import annotations

from pathlib import Path

from tests.integration.harness import Server, ServerFactory, Sipp, wait_for

# These SIPp callers talk for 7 s and then send no RTP for a minute, which a real phone would not
# do: keep the media-gap monitor out of the way of the timer under test.
QUIET_CALLER = {"VOICEGATE_MEDIA_GAP_THRESHOLD_S": "300"}


def test_voicegate_refreshes_as_refresher(server_factory: ServerFactory, tmp_path: Path) -> None:
    server: Server = server_factory(**QUIET_CALLER)
    sipp = Sipp("uac-session-timer-refresh.xml", server.sip_target, tmp_path, timeout_s=90)
    # The scenario fails unless the server sends its UPDATE refresh within 60 s.
    assert sipp.run() == 0, sipp.errors()
    (session,) = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]] or None, 10, "the session to end"
    )
    assert session["ended"]["terminal_state"] == "completed"


def test_an_unrefreshed_session_ends_timed_out(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server: Server = server_factory(**QUIET_CALLER)
    sipp = Sipp("uac-session-timer-expiry.xml", server.sip_target, tmp_path, timeout_s=120)
    assert sipp.run() == 0, sipp.errors()  # SIPp got PJSIP's BYE
    (session,) = wait_for(
        lambda: [s for s in server.sessions() if s["ended"]] or None, 10, "the session to end"
    )
    ended = session["ended"]
    assert (ended["terminal_state"], ended["stage"]) == ("timed_out", "session_timer")
    assert "No session refresh received" in ended["reason"]
    last = session["events"][-1]
    assert last["type"] == "session_expired"
    # About 90 - 30 s after the answer (RFC 4028 section 10: before the interval runs out).
    assert 55 <= last["at"] - session["events"][1]["at"] <= 65
