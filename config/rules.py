"""Validation rules for single settings, and ``key()``, which attaches one to a dataclass field.

A rule knows two things: a noun phrase saying what it allows (used in error messages, the
reference table and the example file, so they cannot disagree) and a ``check`` that returns the
value in canonical form or raises :class:`Invalid`. Checks receive values already of the field's
type (the loader converts TOML and environment text first) and are idempotent: a canonical value
checks to itself, so defaults go through the same checks as overrides.
"""

from __future__ import annotations

import ipaddress
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEC = "voicegate.config"  # the dataclass field metadata key holding a KeySpec


class Invalid(ValueError):
    """A value a key refuses; the message completes ``<key> = <value>: <message>``."""


@dataclass(frozen=True, slots=True)
class Rule:
    allowed: str  # noun phrase, e.g. "an integer from 1 to 65535"
    # Any: one Rule type serves int, float, str, tuple and Path fields; the field's annotation,
    # checked when the schema is built, is what ties a rule to its type.
    check: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class KeySpec:
    rule: Rule
    doc: str  # one line for the reference table


def key(rule: Rule, doc: str) -> Mapping[str, KeySpec]:
    """Field metadata declaring a setting: ``field(default=..., metadata=key(rule, doc))``."""
    return {SPEC: KeySpec(rule, doc)}


def _refuse(allowed: str) -> Invalid:
    return Invalid(f"expected {allowed}")


def boolean() -> Rule:
    """Any boolean: the type check already happened when the value was parsed."""
    return Rule("true or false", lambda value: value)


def int_range(lo: int, hi: int) -> Rule:
    allowed = f"an integer from {lo} to {hi}"

    def check(value: int) -> int:
        if not lo <= value <= hi:
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def float_range(lo: float, hi: float | None = None, *, lo_open: bool = False) -> Rule:
    """Numbers in [lo, hi], or (lo, hi] with ``lo_open``; no upper bound when ``hi`` is None."""
    low = f"> {lo:g}" if lo_open else f">= {lo:g}"
    if hi is None:
        allowed = f"a number {low}"
    elif lo_open:
        allowed = f"a number {low} and <= {hi:g}"
    else:
        allowed = f"a number from {lo:g} to {hi:g}"

    def check(value: float) -> float:
        # NaN fails every comparison, so it is refused here along with infinities.
        ok = math.isfinite(value) and (value > lo if lo_open else value >= lo)
        if not ok or (hi is not None and value > hi):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def one_of(*choices: str) -> Rule:
    """A choice, matched without regard to case and returned in the declared spelling."""
    allowed = "one of " + ", ".join(choices) if len(choices) > 1 else choices[0]
    canonical = {c.lower(): c for c in choices}

    def check(value: str) -> str:
        try:
            return canonical[value.lower()]
        except KeyError:
            raise _refuse(allowed) from None

    return Rule(allowed, check)


def empty_or_one_of(*choices: str, nth: bool = False) -> Rule:
    allowed = f"empty, or one of {', '.join(choices)}"
    if nth:
        allowed += ", each optionally followed by #N (the N-th time)"

    def check(value: str) -> str:
        name, sep, count = value.partition("#") if nth else (value, "", "")
        if value and (name not in choices or (sep and not (count.isdigit() and int(count) > 0))):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def int_choice(*choices: int) -> Rule:
    allowed = " or ".join(str(c) for c in choices)

    def check(value: int) -> int:
        if value not in choices:
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def ip_literal(*, empty_ok: bool = False, wildcard_ok: bool = True) -> Rule:
    # Literals only: a host name would make binding depend on DNS at start-up, and pjsua2 would
    # resolve it once and silently keep the answer.
    allowed = "an IPv4 or IPv6 address literal"
    if not wildcard_ok:
        # An address others send to: 0.0.0.0 in SDP means "hold" (RFC 3264 section 8.4).
        allowed += ", not a wildcard"
    if empty_ok:
        allowed = "empty, or " + allowed

    def check(value: str) -> str:
        if empty_ok and value == "":
            return value
        try:
            ip = ipaddress.ip_address(value)
        except ValueError:
            raise _refuse(allowed) from None
        if ip.is_unspecified and not wildcard_ok:
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def choice_list(*choices: str, what: str) -> Rule:
    """A non-empty list drawn from ``choices`` without repeats; order is kept (it is meaningful)."""
    names = ", ".join(choices)
    allowed = f"a non-empty list of {names} (no repeats)"
    pick = one_of(*choices).check

    def check(value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise Invalid(f"expected at least one {what}, from {names}")
        try:
            picked = tuple(pick(item) for item in value)
        except Invalid:
            raise Invalid(f"each {what} must be one of {names}") from None
        for i, item in enumerate(picked):
            if item in picked[:i]:
                raise Invalid(f"{what} {item} is listed twice")
        return picked

    return Rule(allowed, check)


# Characters that would end or split a user part inside a Request-URI (RFC 3261 section 25.1).
_NOT_IN_USER = frozenset('@:;<>,? \t"')


def sip_users() -> Rule:
    allowed = 'a list of SIP user parts such as "100" or "+4930123" (empty = any)'

    def check(value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not item or not item.isprintable() or _NOT_IN_USER.intersection(item):
                raise Invalid(
                    f"{item!r} is not a SIP user part: give the bare user, no 'sip:', '@host', "
                    "';params' or spaces"
                )
        return value

    return Rule(allowed, check)


def import_path(*, empty_ok: bool = False) -> Rule:
    """``package.module:name``: where a Python object is found (it is imported at start-up)."""
    allowed = '"package.module:name" (a module to import, a colon, a name in it)'
    if empty_ok:
        allowed = "empty, or " + allowed

    def check(value: str) -> str:
        if empty_ok and not value:
            return value
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", value):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def header_text() -> Rule:
    # It goes out verbatim in User-Agent/Server headers: a CR or LF would inject header lines.
    allowed = "non-empty printable text"

    def check(value: str) -> str:
        if not value.strip() or not value.isprintable():
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def name_token() -> Rule:
    # It becomes part of session owner ids ("<worker>/<incarnation>"): no slash, no spaces.
    allowed = "1 to 64 letters, digits, '.', '_' or '-'"

    def check(value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", value):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def node_name(*, empty_ok: bool = False) -> Rule:
    # Its workers are "<node>.<i>": a dot inside would make one node's owner ids another's prefix.
    allowed = "1 to 48 letters, digits, '_' or '-'" + (", or empty" if empty_ok else "")

    def check(value: str) -> str:
        if empty_ok and value == "":
            return value
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,48}", value):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def http_url(*, empty_ok: bool = False) -> Rule:
    allowed = "an http:// or https:// URL with a host" + (", or empty" if empty_ok else "")

    def check(value: str) -> str:
        if empty_ok and value == "":
            return value
        try:
            parts = urllib.parse.urlsplit(value)
            parts.port  # noqa: B018  (raises ValueError on a bad port)
        except ValueError:
            raise _refuse(allowed) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _refuse(allowed)
        return value.rstrip("/")

    return Rule(allowed, check)


def prompt_name(*, empty_ok: bool = False) -> Rule:
    """The name of a prompt file (``<name>.wav`` in agent.prompts_dir); whether it exists is
    checked at start-up, against the directory (voicegate.runtime.prompt_problems)."""
    allowed = "1 to 64 lower-case letters, digits or '_' (a prompt's file name without .wav)"
    if empty_ok:
        allowed = "empty, or " + allowed

    def check(value: str) -> str:
        if empty_ok and not value:
            return value
        if not re.fullmatch(r"[a-z0-9_]{1,64}", value):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def directory(*, empty_ok: bool = False) -> Rule:
    """A directory path, made absolute against the current directory when checked.

    With ``empty_ok`` the empty string means "not set" and checks to None.
    """
    return _path_rule("a directory path (relative to the current directory)", empty_ok)


def existing_file(*, empty_ok: bool = False) -> Rule:
    """A path to a file that exists, made absolute against the current directory when checked.

    With ``empty_ok`` the empty string means "not set" and checks to None.
    """

    def exists(path: Path) -> None:
        if not path.is_file():
            raise Invalid(f"no such file: {path}")

    return _path_rule(
        "the path of an existing file (relative to the current directory)", empty_ok, exists
    )


def _path_rule(allowed: str, empty_ok: bool, require: Callable[[Path], None] | None = None) -> Rule:
    if empty_ok:
        allowed = "empty, or " + allowed

    def check(value: str | Path | None) -> Path | None:
        if value is None or value == "":
            if empty_ok:
                return None
            raise _refuse(allowed)
        text = str(value)
        if text.startswith("~"):
            # Expanding it would read HOME from the real environment, not the one being loaded.
            raise Invalid("'~' is not expanded here: give the full path")
        path = Path(text).resolve()
        if require is not None:
            require(path)
        return path

    return Rule(allowed, check)


# A transfer target as a SIP URI written bare: no display name, no <>, no ?headers (voicegate adds
# its own context headers inside the Refer-To, RFC 3515 section 2.1), no spaces.
# Printable ASCII only (RFC 3261 section 25.1: anything else in a URI is %-escaped), less the
# characters that would end or extend it: space, <, >, ", ? (docs/openapi.yaml says the same).
_SIP_URI = re.compile(r"sips?:[!#-;=@-~]+", re.IGNORECASE)


def sip_uri(*, empty_ok: bool = False) -> Rule:
    allowed = 'a SIP URI such as "sip:desk@callcentre.example.com" (no <>, no ?headers)'
    if empty_ok:
        allowed = "empty, or " + allowed

    def check(value: str) -> str:
        if empty_ok and not value:
            return value
        if not _SIP_URI.fullmatch(value):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def caller_id() -> Rule:
    """The From of an INVITE we send (RFC 3261 section 20.20): a SIP URI, or a display name in
    double quotes and the URI in <>; it goes out verbatim, so nothing that could end the header
    or smuggle parameters into it is allowed."""
    allowed = 'empty, or a SIP URI such as sip:+4930123@trunk.example, or "Name" <sip:...>'

    def check(value: str) -> str:
        if not value:
            return value
        named = re.fullmatch(r'"([ !#-\[\]-~]{1,64})" <(.+)>', value)
        uri = named.group(2) if named else value
        if not _SIP_URI.fullmatch(uri) or (named is not None and not named.group(1).strip()):
            raise _refuse(allowed)
        if named is None and ("," in uri or ";" in uri):
            # RFC 3261 section 20.10: outside <> a URI's ;params are the header's own (a
            # ;tag= would meet pjsua's) and a comma separates header values.
            raise _refuse(allowed + " (a URI with ';' or ',' goes in <>)")
        return value

    return Rule(allowed, check)


def sip_uri_patterns() -> Rule:
    """Shell-style patterns (``*``, ``?``, ``[..]``) that SIP URIs are matched against."""
    allowed = 'a list of SIP URI patterns such as "sip:*@callcentre.example.com" (empty = none)'

    def check(value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not re.fullmatch(r"sips?:[^\s<>\"]+", item, re.IGNORECASE) or not item.isprintable():
                raise Invalid(
                    f"{item!r} is not a SIP URI pattern: give it as sip:user@host, with * for "
                    "any part, no <> and no spaces"
                )
        return value

    return Rule(allowed, check)


def websocket_url(*, empty_ok: bool = False) -> Rule:
    """A ``ws://`` or ``wss://`` URL with a host: where a remote agent listens."""
    allowed = "a ws:// or wss:// URL with a host"
    if empty_ok:
        allowed = "empty, or " + allowed

    def check(value: str) -> str:
        if empty_ok and not value:
            return value
        if not re.fullmatch(r"wss?://[^\s/?#@]+(:\d{1,5})?(/[^\s#]*)?", value):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def postgres_url(*, empty_ok: bool = False) -> Rule:
    """A libpq connection URI, ``postgresql://[user@]host[:port]/dbname[?param=value...]``.

    A password in it is accepted (libpq reads it) but never shown: messages and logs redact it
    (config/loader.py), and docs/storage.md says to use PGPASSWORD or a passfile instead."""
    allowed = "a postgresql://[user@]host[:port]/dbname URL"
    if empty_ok:
        allowed = "empty, or " + allowed

    def check(value: str) -> str:
        if empty_ok and not value:
            return value
        try:
            parts = urllib.parse.urlsplit(value)
            port = parts.port  # raises ValueError when out of range or not a number
        except ValueError:
            raise _refuse(allowed) from None
        if (
            parts.scheme not in ("postgresql", "postgres")
            or not (parts.hostname or "host=" in parts.query)
            or not parts.path.strip("/")
            or any(c.isspace() for c in value)
            or (port is not None and not 1 <= port <= 65535)
        ):
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


def secret_text(*, empty_ok: bool = False, min_length: int = 16) -> Rule:
    """A shared secret: printable, at least ``min_length`` characters. Its value is never shown
    (config/loader.py redacts keys named like secrets in every message)."""
    allowed = f"at least {min_length} printable characters"
    if empty_ok:
        allowed = "empty, or " + allowed

    def check(value: str) -> str:
        if empty_ok and not value:
            return value
        if len(value) < min_length or not value.isprintable() or value != value.strip():
            raise _refuse(allowed)
        return value

    return Rule(allowed, check)


_SHA256_HEX = frozenset("0123456789abcdef")


def sha256_hashes() -> Rule:
    """API keys as their SHA-256 digests (64 hex digits each): config files never hold a key.

    Lower-cased, so a digest pasted from a tool that prints upper case compares equal."""
    allowed = "a list of SHA-256 hex digests of keys (printf %s KEY | sha256sum)"

    def check(value: tuple[str, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for item in value:
            digest = item.strip().lower()
            if len(digest) != 64 or not _SHA256_HEX.issuperset(digest):
                # The item itself is not shown: it may be a key pasted where its digest belongs.
                raise Invalid(
                    f"item {len(out) + 1} is not a SHA-256 hex digest (64 hex digits): store "
                    "the key's digest, printf %s KEY | sha256sum, never the key"
                )
            out.append(digest)
        return tuple(out)

    return Rule(allowed, check)


def ip_networks() -> Rule:
    """Source addresses, each an IP address or a network in CIDR form (``203.0.113.0/24``)."""
    allowed = 'a list of IP addresses or networks such as "203.0.113.0/24" (empty = any source)'

    def check(value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise Invalid(f"{item!r} is not an IP address or network") from None
        return value

    return Rule(allowed, check)
