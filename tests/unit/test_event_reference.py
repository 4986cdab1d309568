"""docs/events.md is what session/event_reference.py makes of the code, and the docs name only
session events that exist."""

from __future__ import annotations

import re
from pathlib import Path

from session import effects as fx
from session import ending, machine
from session import events as ev
from session.event_reference import EFFECTS, effects_of, reach, render_events
from voicegate.call.executor import IN_PROCESS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "events.md"


def test_docs_events_md_is_what_the_code_says() -> None:
    assert PAGE.read_text() == render_events(in_process=IN_PROCESS), (
        "docs/events.md differs from what session/event_reference.py makes of session/events.py "
        "and the machine: run scripts/update_event_reference.py (and commit the page)"
    )


def test_the_page_is_linked_from_the_api_and_the_readme() -> None:
    assert "(events.md)" in (ROOT / "docs" / "api.md").read_text()
    assert "(docs/events.md)" in (ROOT / "README.md").read_text()


def test_every_event_type_has_a_section() -> None:
    page = PAGE.read_text()
    for name in ev.EVENT_TYPES:
        assert f"\n### `{name}`\n" in page, name
    for effect in EFFECTS:
        assert f"\n### `{effect.kind}`\n" in page, effect.kind


def test_the_effects_are_found_through_the_functions_a_handler_calls() -> None:
    # In the handler itself.
    assert effects_of(machine.TRANSITIONS[ev.ResponseStarted].handler) == (fx.BindResponse,)
    # Through session.deadlines.arm (and arm_no_input, drop), one and two calls down.
    assert effects_of(machine.TRANSITIONS[ev.CallAnswered].handler) == (
        fx.ScheduleTimer,
        fx.CancelTimer,
    )
    # The ending sequence, three calls down to session.recovery.finished and the gate's.
    terminate = set(effects_of(ending.terminate))
    assert {fx.Finished, fx.HangUp, fx.RecoveryFinished, fx.GateChanged} <= terminate
    assert ending.terminate in reach(machine.TRANSITIONS[ev.SessionReaped].handler).callees
    # A record only: nothing.
    assert effects_of(machine.TRANSITIONS[ev.CallerSaid].handler) == ()
    assert effects_of(machine.TRANSITIONS[ev.TransferProgress].handler) == ()


# --- the docs' event names -----------------------------------------------------------------------

# Where the docs write a session event: after a log verb ("records `x`", "logged as `x`"), as
# "`x` event", in parentheses after "session log" or "recorded", or naming the step in a sequence
# diagram's note ("Note over V: x: ..."). Wire-protocol messages (`session.accept`, `tool.call`)
# and log lines (`call.offered`) have dots, which these never match; "recorded `canceled`" (a
# terminal state) and "may be logged (`masking`)" (a module) are not caught: "recorded" alone is
# not a log verb here, nor "logged (".
MENTIONS = (
    r"\b(?:records?|logs|logged|writes|written|recorded as|logged as)\s+`([a-z][a-z0-9_]*)`",
    r"`([a-z][a-z0-9_]*)`\s+events?\b",
    r"\bsession(?:'s)? log\b[^.`]{0,20}\(`([a-z][a-z0-9_]*)`",
    r"\brecorded \(`([a-z][a-z0-9_]*)`",
    r"\blog says\s+`([a-z][a-z0-9_]*)`",
    r"Note over [\w,]+: ([a-z][a-z0-9]*(?:_[a-z0-9]+)+):",
)
DOCS = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "docs" / "openapi.yaml"])


def event_mentions(text: str) -> list[str]:
    return [m.group(1) for pattern in MENTIONS for m in re.finditer(pattern, text)]


def test_the_docs_name_only_session_events_that_exist() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}: `{name}`"
        for path in DOCS
        for name in event_mentions(path.read_text())
        if name not in ev.EVENT_TYPES
    ]
    assert not wrong, "no such session event (docs/events.md lists them):\n" + "\n".join(wrong)


def test_the_protocol_and_transfer_docs_are_scanned() -> None:
    # The patterns still find what these pages say of the log (else the test above means little).
    found = {
        page: set(event_mentions((ROOT / "docs" / page).read_text()))
        for page in ("transfer.md", "agent-protocol.md")
    }
    assert {"transfer_started", "transfer_progress", "bridge_up", "transfer_fell_back"} <= found[
        "transfer.md"
    ]
    assert {
        "tool_intent",
        "tool_request_sent",
        "tool_request_withheld",
        "tool_receipt",
        "tool_receipt_conflicted",
        "barge_in_judged",
        "agent_link_lost",
        "agent_link_restored",
        "agent_link_failed",
    } <= found["agent-protocol.md"]


def test_the_docs_name_events_by_their_log_type_not_their_class() -> None:
    classes = {cls.__name__: cls.type for cls in ev.EVENT_TYPES.values()}
    wrong = [
        f"{path.relative_to(ROOT)}: {name} (the log says `{classes[name]}`)"
        for path in DOCS
        if path != PAGE  # the generated page names each class beside its type
        for name in re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)+\b", path.read_text())
        if name in classes
    ]
    assert not wrong, "\n".join(wrong)


def test_a_wrong_name_is_caught() -> None:
    text = (
        "The session records `transfer_done`; the `response_cut` event; in the session log "
        "(`barge_in_judged`); the log says `tool_request_withheld`.\n"
        "    Note over V: agent_link_down: gate frozen\n"
        "`session.accept` and `tool.call` messages; it is recorded `canceled`; what may be "
        "logged (`masking`)."
    )
    assert sorted(event_mentions(text)) == sorted(
        ["transfer_done", "response_cut", "barge_in_judged", "tool_request_withheld",
         "agent_link_down"]
    )  # fmt: skip
