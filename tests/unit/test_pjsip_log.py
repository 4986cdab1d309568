"""telephony/pjsip_log.py: PJSIP's lines in voicegate's log, at the right level, masked, and
never a SIP message at info. (That the server's stdout gets none of them, from the library's
first line on, is tests/integration/test_log_output.py.)"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from telephony.pjsip_log import LogWriter, emit, logging_level
from tests.secret_audit import AUDIT

CALLER = "+15550100123"


@pytest.mark.parametrize(
    ("pjsip_level", "level"),
    [
        (0, logging.CRITICAL),
        (1, logging.ERROR),
        (2, logging.WARNING),
        (3, logging.INFO),
        (4, logging.DEBUG),
        (5, logging.DEBUG),
        (6, logging.DEBUG),
    ],
)
def test_pjsip_levels_map_to_loggings(pjsip_level: int, level: int) -> None:
    assert logging_level(pjsip_level) == level


def test_a_line_is_its_text_with_the_sender_as_a_field(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="pjsip")
    emit(3, "          pjsua_core.c pjsua version 2.15.1 for Linux initialized\n")
    (record,) = caplog.records
    assert (record.name, record.levelno) == ("pjsip", logging.INFO)
    assert record.getMessage() == "pjsua version 2.15.1 for Linux initialized"
    assert record.__dict__["src"] == "pjsua_core.c"


def test_a_sip_message_is_debug_and_masked(caplog: pytest.LogCaptureFixture) -> None:
    message = (
        "pjsua_core.c RX 412 bytes Request msg INVITE/cseq=1 from UDP 127.0.0.1:5070:\n"
        f"INVITE sip:{CALLER}@127.0.0.1:5060 SIP/2.0\r\n"
        f'From: "{CALLER}" <sip:{CALLER}@127.0.0.1:5070>;tag=1\r\n'
        "--end msg--"
    )
    caplog.set_level(logging.INFO, logger="pjsip")
    LogWriter().write(SimpleNamespace(level=4, msg=message))
    assert not caplog.records, "a SIP message was logged at info"
    caplog.set_level(logging.DEBUG, logger="pjsip")
    LogWriter().write(SimpleNamespace(level=4, msg=message))
    (record,) = caplog.records
    assert record.levelno == logging.DEBUG
    assert "RX 412 bytes Request msg INVITE" in record.getMessage()
    assert CALLER not in record.getMessage() and CALLER[1:] not in record.getMessage()


@pytest.mark.parametrize(
    ("pjsip_level", "line"),
    [
        (5, "stream.c  Received DTMF digit 4, vol=10"),
        (4, "pjsua_core.c RX 80 bytes Request msg INFO/cseq=3:\r\nSignal=4\r\nDuration=160\r\n"),
        (4, "pjsua_core.c TX INFO:\r\nSignal= 4\r\n"),
    ],
)
def test_the_keys_a_caller_presses_never_reach_the_log(
    caplog: pytest.LogCaptureFixture, pjsip_level: int, line: str
) -> None:
    # A payment flow's keys are a card number (STYLE.md habit 10), at any PJSIP level.
    caplog.set_level(logging.DEBUG, logger="pjsip")
    emit(pjsip_level, line)
    (record,) = caplog.records
    assert "4" not in record.getMessage().replace("RX 80", ""), record.getMessage()
    assert "*" in record.getMessage()


def test_a_line_below_the_loggers_level_costs_no_masking(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(text: str) -> str:
        raise AssertionError("masked a line nobody logs")

    monkeypatch.setattr("telephony.pjsip_log.mask_text", fail)
    caplog.set_level(logging.INFO, logger="pjsip")
    emit(5, "conference.c Creating conference bridge with 254 ports")
    assert not caplog.records


# Two SDES keys as PJSIP quotes them (base64 of 30 random bytes: master key and salt); the secret
# audit proves they reach no output of the run, this test that the masking takes them out.
SDES_KEYS = ("NjdSb+ZijEYOWlHRXd6WQFl/W1EOrHfJv0vgLYrQ", "/uM01LlcDhYsR/R78hwh04gECdLAM4vG96r37gx2")
for _key in SDES_KEYS:
    AUDIT.register(_key, "SRTP master key", "tests/unit/test_pjsip_log.py")


@pytest.mark.parametrize(
    ("pjsip_level", "line"),
    [
        # A whole SDP as pjsua_core.c quotes it at level 4 (RFC 4568 section 6.1; the MKI and
        # lifetime that may follow the key are not secret).
        (
            4,
            "pjsua_core.c RX 937 bytes Request msg INVITE/cseq=1:\r\nm=audio 15126 RTP/SAVP 8"
            f"\r\na=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{SDES_KEYS[0]}|2^20|1:4\r\n"
            f"a=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:{SDES_KEYS[1]}\r\n",
        ),
        # transport_srtp.c at level 5, when the stream starts.
        (5, f"srtp0x7f3e240c22c0 TX: AES_CM_128_HMAC_SHA1_80 key={SDES_KEYS[1]}"),
        (5, f"srtp0x7f3e240c22c0 RX: AES_CM_128_HMAC_SHA1_80 key={SDES_KEYS[0]}"),
    ],
)
def test_srtp_keys_never_reach_the_log(
    caplog: pytest.LogCaptureFixture, pjsip_level: int, line: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="pjsip")
    emit(pjsip_level, line)
    (record,) = caplog.records
    text = record.getMessage()
    assert not any(key in text for key in SDES_KEYS), text
    # Not a prefix or a tail of one either: the key is cut whole.
    assert not any(key[:8] in text or key[-8:] in text for key in SDES_KEYS), text
    assert "<redacted>" in text
    assert "AES_CM_128_HMAC_SHA1_80" in text  # what is negotiated stays readable
