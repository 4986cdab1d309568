"""voicegate/observe/logs.py: which format a process logs in, and that text and JSON lines carry
the same facts (so the secret audit judges both alike)."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

from telephony.sip_message import mask_uri
from tests.secret_audit import SecretAudit, register_scenarios
from voicegate.observe.logs import JsonFormatter, TextFormatter, chosen_format, setup_logging


@pytest.fixture
def terminal() -> Iterator[TextIO]:
    """A pseudo-terminal's writing end, as a process's stderr is when run from a shell."""
    leader, follower = pty.openpty()
    stream = os.fdopen(follower, "w")
    try:
        yield stream
    finally:
        stream.close()
        os.close(leader)


@pytest.fixture
def pipe() -> Iterator[TextIO]:
    reader, writer = os.pipe()
    stream = os.fdopen(writer, "w")
    try:
        yield stream
    finally:
        stream.close()
        os.close(reader)


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _record(event: str, name: str = "voicegate.call", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.INFO, __file__, 1, event, (), None)
    record.__dict__.update(extra)
    return record


def test_auto_is_text_on_a_terminal_and_json_on_a_pipe_or_file(
    terminal: TextIO, pipe: TextIO, tmp_path: Path
) -> None:
    assert chosen_format("auto", terminal) == "text"
    assert chosen_format("auto", pipe) == "json"
    with open(tmp_path / "server.log", "w") as file:
        assert chosen_format("auto", file) == "json"
    closed = io.StringIO()
    closed.close()
    assert chosen_format("auto", closed) == "json", "a stream that cannot tell is a machine's"


def test_the_setting_overrides_what_stderr_is(terminal: TextIO, pipe: TextIO) -> None:
    assert chosen_format("json", terminal) == "json"
    assert chosen_format("text", pipe) == "text"


@pytest.mark.parametrize(
    ("setting", "on_terminal", "formatter"),
    [
        ("auto", True, TextFormatter),
        ("auto", False, JsonFormatter),
        ("json", True, JsonFormatter),
        ("text", False, TextFormatter),
    ],
)
def test_setup_logging_formats_stderr_as_chosen(
    setting: str,
    on_terminal: bool,
    formatter: type[logging.Formatter],
    terminal: TextIO,
    pipe: TextIO,
    root_logger: logging.Logger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", terminal if on_terminal else pipe)
    chosen = setup_logging("info", setting)
    (handler,) = root_logger.handlers
    assert type(handler.formatter) is formatter, (
        f"{setting} on {'a tty' if on_terminal else 'a pipe'}"
    )
    assert chosen == ("text" if formatter is TextFormatter else "json")


def test_a_text_line_is_time_level_event_and_every_fact() -> None:
    record = _record("call.answered", call_id="4f0c9a", codec="PCMU", calls=2)
    line = TextFormatter().format(record)
    when = time.strftime("%H:%M:%S", time.localtime(record.created))
    assert (
        line
        == f"{when}.{int(record.msecs):03d} INFO  call.answered call_id=4f0c9a codec=PCMU calls=2"
    )


def test_text_quotes_what_would_blur_where_a_value_ends() -> None:
    line = TextFormatter().format(
        _record(
            "sip.ready",
            addresses=["udp:127.0.0.1:5060", "tcp:127.0.0.1:5060"],
            error="address in use",
            caller='"Ann" <sip:***0123@example.com>',
            empty="",
            flag=True,
            none=None,
        )
    )
    assert ' addresses=["udp:127.0.0.1:5060","tcp:127.0.0.1:5060"]' in line
    assert ' error="address in use"' in line
    assert r' caller="\"Ann\" <sip:***0123@example.com>"' in line
    assert ' empty="" flag=true none=null' in line


def test_text_names_loggers_other_than_voicegates_and_keeps_tracebacks() -> None:
    pjsip = TextFormatter().format(_record("pjsua version 2.15.1 for Linux", name="pjsip"))
    assert " INFO  pjsip: pjsua version 2.15.1 for Linux" in pjsip
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = _record("agent.crashed", call_id="c1")
        record.exc_info = sys.exc_info()
    lines = TextFormatter().format(record).splitlines()
    assert lines[0].endswith("agent.crashed call_id=c1")
    assert lines[-1] == "RuntimeError: boom"


_TEXT_FIELD = re.compile(r' (\w+)=("(?:[^"\\]|\\.)*"|\[[^ ]*\]|\{[^ ]*\}|\S*)')


def _text_fields(line: str) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, raw in _TEXT_FIELD.findall(line):
        try:
            found[key] = json.loads(raw)
        except ValueError:
            found[key] = raw
    return found


RECORDS = [
    _record("call.answered", call_id="4f0c", codec="PCMU", rtp=[20000, 20001]),
    _record("call.offered", caller=mask_uri('"+15550100123" <sip:+15550100123@127.0.0.1:5070>')),
    # Leaks, as a careless call site would log them: each format must show them alike.
    _record("call.offered", remote='"+15550100123" <sip:+15550100123@127.0.0.1:5070>'),
    _record("payment.keys", digits="59#", amount_cents=59),
    _record("agent.link", token="not-a-real-token-but-long"),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: str(r.msg))
def test_text_and_json_carry_the_same_facts(record: logging.LogRecord) -> None:
    entry = json.loads(JsonFormatter().format(record))
    facts = {k: v for k, v in entry.items() if k not in ("ts", "level", "logger", "event")}
    assert _text_fields(TextFormatter().format(record)) == facts


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: str(r.msg))
def test_the_secret_audit_judges_text_and_json_lines_alike(record: logging.LogRecord) -> None:
    audit = SecretAudit()
    register_scenarios(audit)
    as_json = sorted(audit.scan_line(JsonFormatter().format(record)))
    as_text = sorted(audit.scan_line(TextFormatter().format(record)))
    assert as_text == as_json
    leak = record.msg in ("payment.keys", "agent.link") or hasattr(record, "remote")
    assert bool(as_text) == leak, as_text
