"""The settings reference for docs/configuration.md, made from the schema so it cannot drift."""

from __future__ import annotations

import json
from pathlib import Path

from config.schema import KEYS
from config.tools import DEFAULT_TOOLS, KEY_ALLOWED, KEY_DOCS, TOOL_ENV_PREFIX


def toml_literal(value: object) -> str:
    """A default as it would be written in the TOML file."""
    if value is None:
        return '""'  # an optional path left empty
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a JSON string is a valid TOML basic string
    raise TypeError(f"no TOML form for {value!r}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_reference() -> str:
    """A Markdown table with one row per key: key, env var, default, allowed, description."""
    rows = [
        "| key | env var | default | allowed | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for k in KEYS:
        cells = (
            f"`{k.dotted}`",
            f"`{k.env_var}`",
            f"`{toml_literal(k.default)}`",
            k.rule.allowed,
            k.doc,
        )
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n\n" + render_tools_reference()


def render_tools_reference() -> str:
    """The keys of a ``[tools.<name>]`` table (config/tools.py), one row each; the default is
    a table's when it leaves the key out, then the built-in charge tool's."""
    charge = DEFAULT_TOOLS["charge"]
    rows = [
        "Tools: one `[tools.<name>]` table per tool (`<name>`: a lower-case letter, then letters "
        "or digits), or `VOICEGATE_TOOL_<NAME>_<KEY>` variables, which win over the file and "
        "may declare a tool of their own.",
        "",
        "| key | env var | default | charge | allowed | description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, doc in KEY_DOCS.items():
        allowed, default = KEY_ALLOWED[key]
        cells = (
            f"`tools.<name>.{key}`",
            f"`{TOOL_ENV_PREFIX}<NAME>_{key.upper()}`",
            "(required)" if default is None else f"`{toml_literal(default)}`",
            f"`{toml_literal(charge[key])}`" if key in charge else "",
            allowed,
            doc,
        )
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"
