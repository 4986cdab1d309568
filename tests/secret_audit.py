"""The secret audit (issue 17, "secrets stay secret"): what voicegate wrote must hold no secret.

Everything the product produced during the test run is collected here: the log file of every
server the harness started (a pool's workers and its Kamailio write to the same file), the
HTTP error bodies and ``/metrics`` texts the harness fetched, other process outputs a test keeps
(:meth:`SecretAudit.keep_file`), and every log record emitted in the test process itself (unit
tests run the product's code in-process). At the end of the session (tests/conftest.py) all of
it is scanned, and the run fails naming each file and line that holds:

- a *registered secret*: any value handed to :meth:`SecretAudit.register` (API keys, agent
  secrets, resume handles as they come to exist); values of environment variables the harness
  passes whose names say they are secret (:meth:`SecretAudit.register_env`); values the product
  hands out under a secret-looking JSON key (:meth:`SecretAudit.learn`); the caller numbers of
  the SIPp scenarios as they are on the wire (unmasked) and the key sequences of their payment
  flows (:func:`register_scenarios`); the short resume codes a session reads out for a callback
  after a drop (:meth:`SecretAudit.register_resume_code`, from tests/integration/test_callback.py);
- a *sensitive field*: a structured field (JSON log line, ``key=value`` text, a ``repr``) named
  like a DTMF digit string, a card number, an amount, a secret or a token, with a value in it;
- an *unmasked caller*: a ``caller``/``remote``/``from`` field holding a run of 4 or more digits
  (``mask_uri`` keeps only the last 3; STYLE.md habit 10).

Findings never quote the secret itself: the report names the kind, the file and the line.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "sipp-scenarios"

# Secrets shorter than this, made only of digits, would match by chance (timestamps, ports):
# they are audited by the field rules below, not as substrings.
MIN_DIGITS_SECRET = 6
MIN_SECRET = 3

# Names of environment variables and JSON keys whose values are secrets.
_SECRET_NAME = re.compile(
    r"(secret|token|api_?key|password|passwd|resume_?handle|credential)", re.I
)
# Field names whose value must never be logged: DTMF strings and what a payment flow keys in.
_SENSITIVE_FIELD = (
    r"digits?|dtmf|dtmf_digits|pressed|pin|cvv|cvc|pan|card|card_number|amount|amount_cents"
    r"|resume_handle|secret|\w*_secret|token|\w*_token|api_key|apikey|password|authorization"
)
# ``"digits": "59#"``, ``digits=59``, ``digit='5'`` (a repr), ``'amount_cents': 59``: the name
# as a whole word, then a value that starts with something a caller keys in or a secret holds.
_SENSITIVE_VALUE = re.compile(
    r"(?<![\w.-])[\"']?(" + _SENSITIVE_FIELD + r")[\"']?\s*[:=]\s*[\"']?(?=[0-9A-Za-z*#+])",
    re.I,
)
# A caller field with a number still in it: mask_uri leaves the last 3 digits only.
_CALLER_FIELD = re.compile(
    r"(?<![\w.-])[\"']?(caller|remote|from|remote_uri|caller_uri)[\"']?\s*[:=]\s*"
    r"(\"(?:[^\"\\]|\\.)*\"|'[^']*'|\S+)",
    re.I,
)
_DIGIT_RUN = re.compile(r"\d{4,}")
_TAG_PARAM = re.compile(r";\s*tag\s*=\s*[^;>\s\"',]*", re.I)
# What a masked URI keeps as it is: its host (an address), its port.
_HOST_PART = re.compile(r"@[^;>\s\"',]*|\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?|:\d+")


@dataclass(frozen=True, slots=True)
class Secret:
    value: str
    kind: str  # what it is, for the report: "caller number", "payment DTMF", "API key", ...
    source: str  # where it was registered from
    # Matched only as a whole number (not inside a longer run of digits): a short numeric
    # secret would otherwise be found by chance in timestamps and counters.
    whole_number: bool = False

    def found_in(self, line: str) -> bool:
        if not self.whole_number:
            return self.value in line
        return re.search(rf"(?<!\d){re.escape(self.value)}(?!\d)", line) is not None


@dataclass(frozen=True, slots=True)
class Finding:
    origin: str  # a file path, or what produced a text ("GET /metrics of server-0")
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.origin}:{self.line}: {self.what}"


def _mask(value: str) -> str:
    """A secret as the report may show it: its kind says what it is, this only tells two apart."""
    return f"{value[:1]}{'*' * max(0, len(value) - 2)}{value[-1:]}" if len(value) > 2 else "**"


@dataclass
class SecretAudit:
    secrets: dict[str, Secret] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)  # path -> what wrote it
    texts: list[tuple[str, str]] = field(default_factory=list)  # (origin, text)
    latest: dict[str, str] = field(default_factory=dict)  # origin -> its last text

    # --- what is secret ------------------------------------------------------------------------

    def register(self, value: str, kind: str, source: str = "a test") -> None:
        """Audit ``value``: it must appear in nothing voicegate wrote. Raises ValueError for a
        value so short that it would match by chance (it would make the audit fail for nothing,
        or be quietly dropped: neither is an audit)."""
        value = str(value)
        if len(value) < MIN_SECRET or (value.isdigit() and len(value) < MIN_DIGITS_SECRET):
            raise ValueError(f"a {kind} of {len(value)} characters cannot be audited as text")
        self.secrets.setdefault(value, Secret(value, kind, source))

    def register_resume_code(self, code: str, source: str) -> None:
        """A callback's resume code (voicegate/call/callback_keys.py): six digits the caller is
        read out, never logged, put in a metric label or an error; found as a whole number."""
        if not (code.isdigit() and len(code) >= MIN_DIGITS_SECRET):
            raise ValueError(f"a resume code of {len(code)} characters cannot be audited")
        self.secrets.setdefault(code, Secret(code, "resume code", source, whole_number=True))

    def register_env(self, env: Mapping[str, str], source: str) -> None:
        """Every variable whose name says it is secret (``*_SECRET``, ``*_TOKEN``, ...)."""
        for name, value in env.items():
            if name.startswith("VOICEGATE_") and _SECRET_NAME.search(name) and value:
                self.register(value, f"secret setting {name}", source)

    def learn(self, body: Any, source: str) -> None:
        """Values the product handed out under a secret-looking key (a resume handle, a token)
        in a JSON answer: they may be given to their owner, never written to a log."""
        for key, value in _walk(body):
            if _SECRET_NAME.search(key) and isinstance(value, str) and len(value) >= 8:
                self.register(value, f"secret handed out as {key!r}", source)

    # --- what was produced ---------------------------------------------------------------------

    def keep_file(self, path: Path, what: str) -> None:
        """Audit ``path`` at the end of the run (it must still exist then)."""
        self.files.setdefault(Path(path), what)

    def record(self, origin: str, text: str) -> None:
        """Audit ``text`` (an HTTP error body, a metrics page) under the name ``origin``."""
        if text:
            self.texts.append((origin, text))

    def record_latest(self, origin: str, text: str) -> None:
        """Audit the last ``text`` recorded under ``origin`` only: a process's metrics page
        keeps every label value it ever had, so its last one holds all of the earlier ones
        (and a test polling /metrics a thousand times keeps one page, not a thousand)."""
        self.latest[origin] = text

    # --- the check -----------------------------------------------------------------------------

    def scan(self) -> list[Finding]:
        findings: list[Finding] = []
        for path, what in self.files.items():
            if not path.exists():
                findings.append(Finding(f"{path} ({what})", 0, "deleted before it was audited"))
                continue
            findings += self.scan_text(str(path), path.read_text(errors="replace"))
        for origin, text in [*self.texts, *self.latest.items()]:
            findings += self.scan_text(origin, text)
        return findings

    def scan_text(self, origin: str, text: str) -> list[Finding]:
        findings = []
        for number, line in enumerate(text.splitlines(), 1):
            findings += [Finding(origin, number, what) for what in self.scan_line(line)]
        return findings

    def scan_line(self, line: str) -> Iterator[str]:
        for secret in self.secrets.values():
            if secret.found_in(line):
                yield f"{secret.kind} {_mask(secret.value)} (registered by {secret.source})"
        for match in _SENSITIVE_VALUE.finditer(line):
            yield f"sensitive field {match.group(1)!r} has a value"
        for match in _CALLER_FIELD.finditer(line):
            # A dialog's tag is a random id the UA made up, not a number of anyone's.
            value = _TAG_PARAM.sub("", match.group(2))
            if _DIGIT_RUN.search(_HOST_PART.sub("", value)):
                yield f"field {match.group(1)!r} holds an unmasked number"


def _walk(body: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(body, dict):
        for key, value in body.items():
            yield str(key), value
            yield from _walk(value)
    elif isinstance(body, list):
        for item in body:
            yield from _walk(item)


# --- what the SIPp scenarios send -----------------------------------------------------------------

_FROM = re.compile(r"^\s*(?:From|Contact|P-Asserted-Identity)\s*:\s*(.*)$", re.M | re.I)
_PHONE = re.compile(r"\+?\d[\d\-.]{5,}\d")
_DTMF_PCAP = re.compile(r"dtmf_2833_(\w+)\.pcap")
_PCAP_KEY = {"pound": "#", "star": "*"}


def register_scenarios(audit: SecretAudit, scenarios: Iterable[Path] | None = None) -> None:
    """The callers' numbers of every scenario (each as sent, and as digits only), and the keys a
    payment scenario presses after its menu choice (the amount and what follows), as strings."""
    for path in sorted(scenarios if scenarios is not None else SCENARIOS.glob("*.xml")):
        text = path.read_text(errors="replace")
        source = f"sipp-scenarios/{path.name}"
        for header in _FROM.findall(text):
            for number in _PHONE.findall(header):
                audit.register(number, "caller number", source)
                digits = re.sub(r"\D", "", number)
                if len(digits) >= MIN_DIGITS_SECRET:
                    audit.register(digits, "caller number", source)
        if "payment" in path.stem:
            keys = "".join(_PCAP_KEY.get(k, k) for k in _DTMF_PCAP.findall(text))
            # The first key picks the menu item; what follows is the payment's own input.
            entered = keys[1:]
            for candidate in {entered, entered.split("#")[0] + "#" if "#" in entered else ""}:
                if len(candidate) >= MIN_SECRET and not candidate.isdigit():
                    audit.register(candidate, "payment DTMF", source)


# --- the test process's own log records -----------------------------------------------------------


# The product's loggers (voicegate.*, and PJSIP's through telephony.library.LogWriter). The
# reference payment provider's are not audited: it is the third party that is given the amount.
PRODUCT_LOGGERS = ("voicegate", "pjsip")


class RecordingHandler(logging.Handler):
    """Keeps every record of the product's loggers in the test process, formatted as
    voicegate's JSON lines (extras included), under the name of the test that emitted it."""

    def __init__(self, audit: SecretAudit) -> None:
        super().__init__(logging.DEBUG)
        from voicegate.observe.logs import JsonFormatter

        self.setFormatter(JsonFormatter())
        self.audit = audit
        self.test = "collection"

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a record the formatter cannot take is not the audit's business
            line = json.dumps({"event": str(record.msg)}, default=str)
        self.audit.record(f"in-process log of {self.test}", line)


AUDIT = SecretAudit()
