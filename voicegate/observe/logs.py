"""Logs: JSON lines for machines, readable text for people, the same facts in both.

Callers log an event name as the message and facts as ``extra`` fields, e.g.
``log.info("call.answered", extra={"call_id": cid})``. Nothing here masks for them: the code that
logs a URI masks it (STYLE.md habit 10), and DTMF strings and tokens are never logged. Both
formats render exactly the record's fields (:func:`fields`), so what one shows the other shows,
and nothing one leaves out can reappear in the other.

``log.format = "auto"`` (the default) picks text when stderr is a terminal (someone is watching
``scripts/serve``) and JSON otherwise (a file, a pipe, journald, a log shipper).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import TextIO

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
# Text-format values that need no quoting: no spaces, quotes or '=' to confuse a reader (or
# tests/secret_audit.py's key=value rules) about where a value ends.
_BARE_UNSAFE = frozenset(" \t\r\n\"'=")


def fields(record: logging.LogRecord) -> Iterator[tuple[str, object]]:
    """The record's ``extra`` facts, in the order they were given."""
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            yield key, value


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``12:01:02.345 INFO  call.answered call_id=4f0c codec=PCMU``: local time, level, event,
    then every field as ``key=value`` (a value with spaces or quotes as a JSON string). A logger
    outside ``voicegate`` is named before the event (``pjsip: pjsua version ...``)."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        source = "" if record.name.split(".")[0] == "voicegate" else f"{record.name}: "
        head = f"{when}.{int(record.msecs):03d} {record.levelname:<5} {source}{record.getMessage()}"
        line = " ".join([head, *(f"{key}={_text_value(value)}" for key, value in fields(record))])
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: object) -> str:
    if isinstance(value, str):
        return value if value and not _BARE_UNSAFE.intersection(value) else json.dumps(value)
    return json.dumps(value, default=str, separators=(",", ":"))


def chosen_format(fmt: str, stream: TextIO) -> str:
    """``"json"`` or ``"text"``: ``fmt`` itself, or for ``"auto"`` text when ``stream`` is a
    terminal and JSON otherwise (also when it cannot tell: a closed or replaced stream)."""
    if fmt != "auto":
        return fmt
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError, OSError):
        return "json"


class _Tag(logging.Filter):
    """Names the process on every line, so a pool's interleaved logs say which worker spoke."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def filter(self, record: logging.LogRecord) -> bool:
        record.proc = self.process
        return True


def setup_logging(level: str, fmt: str, process: str | None = None) -> str:
    """Send every log record to stderr in ``fmt`` (``auto``, ``json`` or ``text``); returns the
    format chosen."""
    chosen = chosen_format(fmt, sys.stderr)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    if process is not None:
        handler.addFilter(_Tag(process))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    return chosen
