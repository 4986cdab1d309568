"""``load_settings``: defaults, then the TOML file, then ``VOICEGATE_*`` variables; later wins.

Every problem found is collected into one :class:`ConfigError` rather than stopping at the
first, so an operator fixes a config in one round. Each problem is one line naming the key (or
file, section or variable), the value, where it came from and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from config.errors import ConfigError
from config.rules import Invalid
from config.schema import BY_DOTTED, BY_ENV, ENV_PREFIX, KEYS, SECTIONS, from_env, from_toml
from config.settings import CrossProblem, Settings, cross_check
from config.tenant_loader import load_tenants, open_api_problems
from config.tools import TOOL_ENV_PREFIX, load_tools

CONFIG_ENV = "VOICEGATE_CONFIG"
# VOICEGATE_* variables that are not settings. Any other one is refused as a probable typo: a
# misspelt override that silently does nothing is worse than a process that will not start.
_NOT_SETTINGS = frozenset({CONFIG_ENV})
# Keys that moved, so that an old config file gets told where its setting went.
RENAMED: Final = {"sip.max_calls": "pool.calls_per_worker"}
_RENAMED_ENV: Final = {
    f"{ENV_PREFIX}{old.replace('.', '_').upper()}": f"{ENV_PREFIX}{new.replace('.', '_').upper()}"
    for old, new in RENAMED.items()
}


def load_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Load and validate the settings.

    ``path`` is a TOML file; when None, the file named by ``VOICEGATE_CONFIG`` is used if that is
    set and not empty, else no file. ``environ`` defaults to ``os.environ``; only it is read
    for variables. Relative directories resolve against the current directory, now. Raises
    :class:`ConfigError` (a ValueError) listing every problem.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    values: dict[str, object] = {}  # dotted key -> canonical value
    sources: dict[str, str] = {}  # dotted key -> " (from ...)"
    problems: list[str] = []
    file_tools: list[tuple[object, str]] = []
    file_tenants: list[tuple[object, str]] = []

    if path is not None:
        problems += _apply_file(Path(path), "", values, sources, file_tools, file_tenants)
    elif env.get(CONFIG_ENV):
        problems += _apply_file(
            Path(env[CONFIG_ENV]),
            f" (from {CONFIG_ENV})",
            values,
            sources,
            file_tools,
            file_tenants,
        )
    problems += _apply_env(env, values, sources)
    tools_table, tools_src = file_tools[0] if file_tools else (None, "")
    tools, tool_problems = load_tools(tools_table, tools_src, env)
    problems += tool_problems
    for k in KEYS:
        if k.dotted not in values and k.dotted not in sources:
            # Defaults pass the same checks, which also makes relative default paths absolute.
            try:
                values[k.dotted] = k.rule.check(k.default)
            except Invalid as e:
                problems.append(f"{k.dotted} = {k.default!r} (default): {e}")
    if problems:
        raise ConfigError(*problems)

    settings = dataclasses.replace(_build(values), tools=tools)
    cross = [_describe(p, settings, sources) for p in cross_check(settings)]
    if cross:
        raise ConfigError(*cross)
    tenants_table, tenants_src = file_tenants[0] if file_tenants else (None, "")
    tenants, tenant_problems = load_tenants(tenants_table, tenants_src, settings)
    if tenant_problems:
        raise ConfigError(*tenant_problems)
    settings = dataclasses.replace(settings, tenants=tenants)
    if problems := open_api_problems(settings):
        raise ConfigError(*problems)
    return settings


def _apply_file(
    file: Path,
    origin: str,
    values: dict[str, object],
    sources: dict[str, str],
    file_tools: list[tuple[object, str]],
    file_tenants: list[tuple[object, str]],
) -> list[str]:
    try:
        with file.open("rb") as fp:
            data = tomllib.load(fp)
    except FileNotFoundError:
        return [f"config file {file}{origin}: not found"]
    except OSError as e:
        return [f"config file {file}{origin}: cannot be read ({e.strerror})"]
    except UnicodeDecodeError:
        return [f"config file {file}{origin}: not UTF-8 text, which TOML requires"]
    except tomllib.TOMLDecodeError as e:
        # tomllib's message ends with "(at line N, column M)".
        return [f"config file {file}{origin}: invalid TOML: {e}"]

    src = f" (from {file})"
    problems: list[str] = []
    for section, table in data.items():
        if section == "tools":
            file_tools.append((table, src))
        elif section == "tenants":
            file_tenants.append((table, src))
        elif section not in SECTIONS:
            problems.append(_unknown_section(section, table, src))
        elif not isinstance(table, dict):
            problems.append(f"{section} = {table!r}{src}: expected a table [{section}]")
        else:
            for name, raw in table.items():
                dotted = f"{section}.{name}"
                k = BY_DOTTED.get(dotted)
                if k is None:
                    problems.append(f"{dotted} = {raw!r}{src}: unknown key{_hint(dotted, name)}")
                    continue
                sources[dotted] = src
                try:
                    values[dotted] = from_toml(k, raw)
                except Invalid as e:
                    problems.append(f"{dotted} = {_shown(dotted, raw)}{src}: {e}")
    return problems


def _apply_env(
    env: Mapping[str, str], values: dict[str, object], sources: dict[str, str]
) -> list[str]:
    problems: list[str] = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var in _NOT_SETTINGS:
            continue
        if var.startswith(TOOL_ENV_PREFIX):
            continue  # tool declarations: config.tools reads them
        k = BY_ENV.get(var)
        if k is None:
            # The value is left out: an unknown variable may well hold a secret.
            known = [*BY_ENV, *_NOT_SETTINGS]
            near = difflib.get_close_matches(var, known, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else f"; see {CONFIG_ENV} and the reference"
            if renamed := _RENAMED_ENV.get(var):
                hint = f"; it was renamed {renamed}"
            problems.append(f"{var}: unknown voicegate environment variable{hint}")
            continue
        text = env[var]
        sources[k.dotted] = f" (from {var})"
        values.pop(k.dotted, None)  # a bad override must not let the file's value through
        try:
            values[k.dotted] = from_env(k, text)
        except Invalid as e:
            problems.append(f"{k.dotted} = {_shown(k.dotted, text)} (from {var}): {e}")
    return problems


def _unknown_section(section: str, table: object, src: str) -> str:
    if not isinstance(table, dict):
        # A key written above every [section] header.
        return f"{section} = {table!r}{src}: keys belong in a [section]{_hint(section, section)}"
    near = difflib.get_close_matches(section, list(SECTIONS), n=1, cutoff=0.6)
    hint = f"did you mean [{near[0]}]? " if near else ""
    known = ", ".join([*SECTIONS, "tools.<name>", "tenants.<name>"])
    return f"[{section}]{src}: unknown section; {hint}known sections: {known}"


def _hint(dotted: str, name: str) -> str:
    """The hint "; did you mean x.y?" for the likeliest intended key, or "" if none is near."""
    # Right key in the wrong section first (`[sip] rtp_port_min`), then the nearest spelling.
    moved = [k.dotted for k in KEYS if k.name == name and k.dotted != dotted]
    if dotted in RENAMED:
        return f"; it was renamed {RENAMED[dotted]}"
    near = moved or difflib.get_close_matches(dotted, list(BY_DOTTED), n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else ""


def _shown(dotted: str, value: object) -> str:
    """How a value appears in a message: a secret's never does (STYLE.md habit 10)."""
    if dotted.rsplit(".", 1)[-1] in _SECRET_KEYS and value:
        return "<redacted>"
    if isinstance(value, str) and "://" in value:
        return repr(_without_password(value))
    return repr(value)


def _without_password(url: str) -> str:
    # A URL's password (storage.url) is a secret: "scheme://user:***@host", "?password=***".
    url = re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo.split("/")[0]:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"


# api_keys and metrics_keys hold digests, not keys; redacted all the same, as what is mistyped
# there is often the key itself.
_SECRET_KEYS = frozenset({"secret", "api_key", "password", "token", "api_keys", "metrics_keys"})


def _build(values: dict[str, object]) -> Settings:
    parts: dict[str, Any] = {
        section: cls(**{k.name: values[k.dotted] for k in KEYS if k.section == section})
        for section, cls in SECTIONS.items()
    }
    return Settings(**parts)


def _describe(p: CrossProblem, settings: Settings, sources: dict[str, str]) -> str:
    def show(dotted: str) -> str:
        k = BY_DOTTED[dotted]
        value = getattr(getattr(settings, k.section), k.name)
        return f"{dotted} = {_shown(dotted, value)}{sources.get(dotted, '')}"

    return f"{', '.join(show(d) for d in p.keys)}: {p.reason}"
