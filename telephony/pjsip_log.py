"""PJSIP's own log lines into the ``pjsip`` logger, from the library's first line to its last.

PJSIP writes its lines through one log function. From ``libInit`` on, that is pjsua's, which
hands each line to pjsua2's :class:`LogWriter` (ours) only if its level is within
``LogConfig.consoleLevel`` (pjsua_core.c, ``log_writer``), so that is set to the same level as
``LogConfig.level``; with ``consoleLevel = 0`` nothing reached us. Before ``libInit``,
``libCreate`` (pj_init, the endpoint) logs through pjlib's default function, which prints to
stdout at pjlib's default level (5): :func:`route_early_lines` installs, before ``libCreate``, a
function of ours at the configured level that ends in the same place.

Both run on PJSIP's threads: with ``uaConfig.mainThreadOnly`` pjsua2 queues other threads' lines
for the SIP thread, and the early function runs on the thread calling ``libCreate``. Each line
costs a level check, and only a line that will be logged is masked (telephony.sip_message
``mask_text``: from level 4 PJSIP quotes whole SIP messages, callers' numbers and resume handles
included; the keys a caller presses are starred; STYLE.md habit 10) and handed to
:mod:`logging`, whose handlers take their own lock.
PJSIP's levels 4 to 6 (where SIP messages are) are debug, never info.
"""

from __future__ import annotations

import ctypes
import logging
import re
from typing import Any

import pjsua2 as pj

from telephony.sip_message import mask_text

pjsip_log = logging.getLogger("pjsip")

# PJSIP's level (0 fatal, 1 error, 2 warning, 3 info, 4 to 6 debug and traces) -> logging's.
_LEVELS = (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)
# The file that logged it and the line, nothing else: the time, thread switches and indents
# are ours to add (or PJSIP's noise), and the newline is the handler's.
DECOR = pj.PJ_LOG_HAS_SENDER | pj.PJ_LOG_HAS_SPACE

# void pj_log_func(int level, const char *data, int len) (pj/log.h)
_LOG_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_int)


# The keys a caller presses, which may be a card number in a payment flow (STYLE.md habit 10):
# pjmedia's stream.c logs each RFC 2833 digit it receives (level 5), and an INFO's
# application/dtmf-relay body carries it as Signal= (level 4, a whole SIP message).
_DIGITS = re.compile(r"(DTMF digit\W*|Signal\s*=\s*)[0-9A-Da-d*#]+")


def logging_level(pjsip_level: int) -> int:
    return _LEVELS[min(max(pjsip_level, 0), len(_LEVELS) - 1)]


def emit(pjsip_level: int, line: str) -> None:
    """Log one of PJSIP's lines (``sender  text``, as :data:`DECOR` makes them) at the matching
    level, with the sender as the ``src`` field."""
    level = logging_level(pjsip_level)
    if not pjsip_log.isEnabledFor(level):
        return
    sender, _, text = line.strip().partition(" ")
    if not text:
        sender, text = "", sender
    text = _DIGITS.sub(r"\1*", mask_text(text.strip()))
    pjsip_log.log(level, text, extra={"src": sender} if sender else None)


class LogWriter(pj.LogWriter):  # type: ignore[misc]
    """pjsua2's log writer (``EpConfig.logConfig.writer``): every line into :func:`emit`."""

    def write(self, entry: Any) -> None:
        emit(entry.level, entry.msg)


def _early_line(level: int, data: bytes | None, length: int) -> None:
    if data:
        emit(level, data[:length].decode("utf-8", "replace"))


# A module global: PJSIP may call it for as long as the process lives.
_early_line_c = _LOG_FUNC(_early_line)


def _pjlib(library_path: str | None) -> Any | None:
    """pjlib's log setters in the pjsua2 extension, typed; None where they cannot be found."""
    try:
        lib = ctypes.CDLL(library_path or pj._pjsua2.__file__)
        set_level, set_decor, set_func = (
            lib.pj_log_set_level,
            lib.pj_log_set_decor,
            lib.pj_log_set_log_func,
        )
    except (OSError, AttributeError):
        return None
    set_level.argtypes, set_level.restype = (ctypes.c_int,), None
    set_decor.argtypes, set_decor.restype = (ctypes.c_uint,), None
    set_func.argtypes, set_func.restype = (_LOG_FUNC,), None
    return lib


def route_early_lines(pjsip_level: int, library_path: str | None = None) -> bool:
    """Before ``libCreate``: PJSIP's lines at ``pjsip_level`` and below go to :func:`emit`
    instead of stdout until ``libInit`` installs pjsua's. False (and nothing changed) where
    pjlib's log functions cannot be found in the pjsua2 extension."""
    lib = _pjlib(library_path)
    if lib is None:
        return False
    lib.pj_log_set_level(pjsip_level)
    lib.pj_log_set_decor(DECOR)
    lib.pj_log_set_log_func(_early_line_c)
    return True


def stop_lines(library_path: str | None = None) -> None:
    """After ``libDestroy`` (or a start that failed half-way): no log function at all, so that
    nothing PJSIP still says calls into Python while the interpreter goes down (pj_log skips a
    null function)."""
    lib = _pjlib(library_path)
    if lib is not None:
        lib.pj_log_set_level(0)
        lib.pj_log_set_log_func(_LOG_FUNC())
