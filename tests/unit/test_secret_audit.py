"""The secret audit itself (tests/secret_audit.py): it must be able to fail. Each leak below is
written where voicegate writes (a log file, the product's loggers in this process, an HTTP error
body) and must be caught, naming the place and the line; masked forms must pass."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from telephony.sip_message import mask_uri
from tests.secret_audit import SCENARIOS, RecordingHandler, SecretAudit, register_scenarios
from voicegate.observe.logs import JsonFormatter

REPO = Path(__file__).resolve().parents[2]


def _line(event: str, **extra: object) -> str:
    record = logging.LogRecord("voicegate.call", logging.INFO, __file__, 1, event, (), None)
    record.__dict__.update(extra)
    return JsonFormatter().format(record)


def test_the_scenarios_give_caller_numbers_and_payment_keys() -> None:
    audit = SecretAudit()
    register_scenarios(audit)
    kinds = {s.value: s.kind for s in audit.secrets.values()}
    assert kinds["+15550100123"] == "caller number"
    assert kinds["15550100123"] == "caller number"
    # uac-payment.xml keys 2 (the menu), then 5 9 # (the amount) and 1 (pay).
    assert kinds["59#1"] == kinds["59#"] == "payment DTMF"
    assert (SCENARIOS / "uac-payment.xml").exists()


def test_a_leaked_caller_number_in_a_log_file_is_caught_with_file_and_line(
    tmp_path: Path,
) -> None:
    audit = SecretAudit()
    register_scenarios(audit)
    log = tmp_path / "server-0.log"
    caller = '"+15550100123" <sip:+15550100123@127.0.0.1:5070>'
    log.write_text(
        _line("call.offered", caller=mask_uri(caller)) + "\n"  # masked: fine
        + _line("call.offered", remote=caller) + "\n"  # line 2: the leak
    )  # fmt: skip
    audit.keep_file(log, "a server log")
    findings = audit.scan()
    assert findings, "a caller number in a server log went unseen"
    assert {(f.origin, f.line) for f in findings} == {(str(log), 2)}
    assert any("caller number" in f.what for f in findings)
    # The report never repeats the secret it found.
    assert not any("15550100123" in str(f) for f in findings)


def test_a_registered_secret_is_caught_anywhere(tmp_path: Path) -> None:
    audit = SecretAudit()
    audit.register_env({"VOICEGATE_AGENT_SECRET": "s3cr3t-agent-value"}, "env of a test")
    audit.learn({"session": {"resume_handle": "rh_abcdef0123456789"}}, "GET /v1/calls/x")
    audit.register("sk_live_0123456789", "API key")
    audit.record("GET /nope -> 404", json.dumps({"error": "bad key sk_live_0123456789"}))
    audit.record_latest("GET /metrics", 'x{agent="s3cr3t-agent-value"} 1.0')
    audit.record("in-process log", _line("agent.resumed", note="rh_abcdef0123456789"))
    found = {(f.origin, f.what.split(" ")[0]) for f in audit.scan()}
    assert found == {("GET /nope -> 404", "API"), ("GET /metrics", "secret"),
                     ("in-process log", "secret")}  # fmt: skip


def test_a_resume_code_is_caught_as_a_whole_number_only() -> None:
    audit = SecretAudit()
    audit.register_resume_code("471902", "a test")
    with pytest.raises(ValueError, match="cannot be audited"):
        audit.register_resume_code("4719", "a test")
    audit.record("read out", _line("agent.said", note="enter 471902 to continue"))
    # Inside a longer run of digits it is chance, not the code (a timestamp, a counter).
    audit.record("timestamps", _line("tick", at=1764471902.5, n=94719020))
    assert [(f.origin, f.what.split(" (")[0]) for f in audit.scan()] == [
        ("read out", "resume code 4****2")
    ]


@pytest.mark.parametrize(
    "leak",
    [
        _line("dtmf", digits="59#"),
        _line("dtmf", digit="5"),
        _line("call.ignored_event", ev="DtmfReceived(call_id='c', digit='5', method='rfc2833')"),
        _line("tool.sent", arguments={"amount_cents": 59, "currency": "EUR"}),
        _line("call.offered", caller="sip:+15550109999@10.0.0.1:5060"),
        "2024-01-01 INFO voicegate.call: call.offered caller=tel:+15550109999",
    ],
)
def test_sensitive_fields_are_caught_without_registration(leak: str) -> None:
    audit = SecretAudit()
    audit.record("log", leak)
    assert audit.scan(), f"not caught: {leak}"


@pytest.mark.parametrize(
    "clean",
    [
        _line("call.offered", caller=mask_uri("sip:+15550109999@10.0.0.1:5060")),
        _line("call.offered", remote=mask_uri('"+15550109999" <sip:+15550109999@[::1]:5062>')),
        _line("demo.readback", call_id="c", count=4),
        _line("barge_in", reason="dtmf", heard_ms=5959),
        'voicegate_dtmf_digits_total{method="rfc2833"} 4.0',
        _line("call.offered", caller='"sipp" <sip:sipp@127.0.0.1:40000>'),
    ],
)
def test_masked_and_harmless_lines_pass(clean: str) -> None:
    audit = SecretAudit()
    register_scenarios(audit)
    audit.record("log", clean)
    assert audit.scan() == []


def test_records_of_this_process_are_recorded() -> None:
    # tests/conftest.py hangs a RecordingHandler on the product's loggers; here one on a logger
    # of its own, so that this deliberate leak stays out of the real audit of the run.
    audit = SecretAudit()
    handler = RecordingHandler(audit)
    handler.test = "this test"
    logger = logging.getLogger("tests.secret_audit.selftest")
    logger.addHandler(handler)
    try:
        logger.warning("call.dtmf", extra={"digits": "1234"})
    finally:
        logger.removeHandler(handler)
    (finding,) = audit.scan()
    assert finding.origin == "in-process log of this test"


def test_a_kept_file_that_vanished_is_a_finding(tmp_path: Path) -> None:
    audit = SecretAudit()
    audit.keep_file(tmp_path / "gone.log", "a server log")
    assert [f.what for f in audit.scan()] == ["deleted before it was audited"]


def test_too_short_a_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        SecretAudit().register("59", "payment DTMF")


LEAKING_TEST = '''
import logging

from tests.secret_audit import AUDIT


def test_a_leak() -> None:
    AUDIT.register("vg-probe-secret-0123456789abcdef", "api key")
    logging.getLogger("voicegate.probe").warning("key vg-probe-secret-0123456789abcdef")


def test_clean() -> None:
    pass
'''


@pytest.mark.parametrize("processes", [[], ["-n", "2"]], ids=["one process", "two processes"])
def test_a_leak_in_any_test_process_fails_the_run(tmp_path: Path, processes: list[str]) -> None:
    """scripts/test runs the suite under pytest-xdist: a leak a worker finds must fail the run."""
    probe = tmp_path / "test_leak_probe.py"
    probe.write_text(LEAKING_TEST)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), "-c", "/dev/null", *processes, str(probe)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "secret audit: LEAKS FOUND" in run.stdout
    assert "test_leak_probe.py::test_a_leak" in run.stdout
    assert "2 passed" in run.stdout
    assert "0123456789abcdef" not in run.stdout
