"""Tool declarations: ``[tools.<name>]`` tables in the TOML file, ``VOICEGATE_TOOL_<NAME>_<KEY>``
variables in the environment (which win, and may declare a tool of their own).

A tool is an HTTP endpoint an agent may ask the call to use. ``write`` tools change the world
(payments, bookings): they need a status endpoint, because after a crash or a lost response the
only safe way to learn what happened is to ask the provider about the idempotency key (seed 000).
Names are lower-case letters and digits only, so ``VOICEGATE_TOOL_<NAME>_<KEY>`` reads one way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

TOOL_ENV_PREFIX = "VOICEGATE_TOOL_"
_NAME = re.compile(r"[a-z][a-z0-9]{0,31}")
KINDS = ("read", "write")
APPROVALS = ("none", "dtmf", "caller")


@dataclass(frozen=True, slots=True)
class ToolSettings:
    name: str
    kind: str
    endpoint: str
    status_endpoint: str
    timeout_s: float
    approval: str
    # How long a caller's approval holds for a write held by an interruption (session/ledger.py).
    approval_valid_s: float = 300.0

    def status_url(self, key: str) -> str:
        return self.status_endpoint.replace("{key}", quote(key, safe=""))


# The reference payment provider (providers/payments) on its default address.
DEFAULT_TOOLS: dict[str, dict[str, Any]] = {
    "charge": {
        "kind": "write",
        "endpoint": "http://127.0.0.1:8090/v1/charges",
        "status_endpoint": "http://127.0.0.1:8090/v1/charges/{key}",
        "timeout_s": 5.0,
        "approval": "caller",
        "approval_valid_s": 300.0,
        "enabled": True,
    }
}

KEY_DOCS = {
    "kind": "read or write; a write needs a status_endpoint",
    "endpoint": "http(s) URL the request is POSTed to, with an Idempotency-Key header",
    "status_endpoint": "URL with {key}, GET to learn a request's outcome (write tools)",
    "timeout_s": "seconds to wait for the response before the outcome counts as unknown",
    "approval": "none; dtmf: the caller confirms by key press before a write runs; caller: by "
    "key press or by voice (a spoken yes the session logs as caller_said, the demo agent)",
    "approval_valid_s": "seconds a write's approval (the caller's yes, or the agent's ask when "
    "approval is none) holds: a write held by an interruption is sent after the call recovers "
    "only within them, else it ends not_started and the agent gets that result with the reason",
    "enabled": "false removes the tool (also the built-in charge tool)",
}


# What each key takes, and its value when a table leaves it out (None: it must be given; the
# built-in charge tool's own values are DEFAULT_TOOLS["charge"]), for the reference table.
KEY_ALLOWED = {
    "kind": ("one of read, write", None),
    "endpoint": ("an http:// or https:// URL with a host", None),
    "status_endpoint": ("an http(s) URL containing {key} (required for a write)", ""),
    "timeout_s": ("a number from 0.1 to 120", 5.0),
    "approval": ("one of none, dtmf, caller", "none"),
    "approval_valid_s": ("a number from 1 to 86400", 300.0),
    "enabled": ("true or false", True),
}


def _url(value: object, *, key_placeholder: bool) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a URL string")
    parts = urlsplit(value.replace("{key}", "k"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http:// or https:// URL with a host")
    if key_placeholder and "{key}" not in value:
        raise ValueError("expected a URL containing {key}")
    return value


def _coerce(key: str, raw: object, from_env: bool) -> object:
    if key in ("kind", "approval"):
        allowed = KINDS if key == "kind" else APPROVALS
        if not isinstance(raw, str) or raw.lower() not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return raw.lower()
    if key == "approval_valid_s":
        try:
            number = float(raw) if from_env or isinstance(raw, int | float) else None  # type: ignore[arg-type]
        except ValueError:
            number = None
        if number is None or isinstance(raw, bool) or not 1 <= number <= 86400:
            raise ValueError("expected a number from 1 to 86400")
        return number
    if key == "timeout_s":
        try:
            value = float(raw) if from_env or isinstance(raw, int | float) else None  # type: ignore[arg-type]
        except ValueError:
            value = None
        if value is None or isinstance(raw, bool) or not 0.1 <= value <= 120:
            raise ValueError("expected a number from 0.1 to 120")
        return value
    if key == "enabled":
        if isinstance(raw, bool):
            return raw
        if from_env and isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0"):
            return raw.lower() in ("true", "1")
        raise ValueError("expected true or false")
    return _url(raw, key_placeholder=key == "status_endpoint")


def load_tools(
    file_tools: object, file_src: str, environ: Mapping[str, str]
) -> tuple[tuple[ToolSettings, ...], list[str]]:
    """Merge defaults, the file's ``[tools.*]`` tables and the environment; validate each tool."""
    merged: dict[str, dict[str, Any]] = {name: dict(v) for name, v in DEFAULT_TOOLS.items()}
    problems: list[str] = []
    if file_tools is not None:
        if not isinstance(file_tools, dict):
            problems.append(f"tools = {file_tools!r}{file_src}: expected tables [tools.<name>]")
            file_tools = {}
        for name, table in file_tools.items():
            if not _NAME.fullmatch(name):
                problems.append(
                    f"[tools.{name}]{file_src}: a tool name is a lower-case letter, then "
                    "letters or digits (at most 32)"
                )
                continue
            if not isinstance(table, dict):
                problems.append(f"tools.{name} = {table!r}{file_src}: expected a table")
                continue
            tool = merged.setdefault(name, {})
            for key, raw in table.items():
                if key not in KEY_DOCS:
                    problems.append(
                        f"tools.{name}.{key} = {raw!r}{file_src}: unknown key; known: "
                        + ", ".join(KEY_DOCS)
                    )
                    continue
                try:
                    tool[key] = _coerce(key, raw, from_env=False)
                except ValueError as exc:
                    problems.append(f"tools.{name}.{key} = {raw!r}{file_src}: {exc}")
    for var in sorted(environ):
        if not var.startswith(TOOL_ENV_PREFIX):
            continue
        rest = var[len(TOOL_ENV_PREFIX) :]
        name, _, key = rest.partition("_")
        key = key.lower()
        name = name.lower()
        if not _NAME.fullmatch(name) or key not in KEY_DOCS:
            problems.append(
                f"{var}: expected {TOOL_ENV_PREFIX}<NAME>_<KEY> with KEY one of "
                + ", ".join(k.upper() for k in KEY_DOCS)
            )
            continue
        try:
            merged.setdefault(name, {})[key] = _coerce(key, environ[var], from_env=True)
        except ValueError as exc:
            problems.append(f"tools.{name}.{key} = {environ[var]!r} (from {var}): {exc}")
    tools = []
    for name, values in sorted(merged.items()):
        if not values.get("enabled", True):
            continue
        missing = [k for k in ("kind", "endpoint") if k not in values]
        if values.get("kind") == "write" and "status_endpoint" not in values:
            missing.append("status_endpoint")
        if missing:
            problems.append(
                f"[tools.{name}]: missing {', '.join(missing)} "
                "(a write tool needs a status endpoint to reconcile unknown outcomes)"
            )
            continue
        tools.append(
            ToolSettings(
                name=name,
                kind=values["kind"],
                endpoint=values["endpoint"],
                status_endpoint=values.get("status_endpoint", ""),
                timeout_s=values.get("timeout_s", 5.0),
                approval=values.get("approval", "none"),
                approval_valid_s=values.get("approval_valid_s", 300.0),
            )
        )
    return tuple(tools), problems
