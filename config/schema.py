"""The flat list of settings keys, read off the dataclasses in ``settings.py``, and the
conversions of TOML values and environment text into each key's type.

Nothing here names a particular key: a key's kind comes from its field annotation, so a new
field of a supported type needs no change in this module.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, get_type_hints

from config.rules import SPEC, Invalid, KeySpec, Rule
from config.settings import NOT_A_SECTION, Settings

ENV_PREFIX = "VOICEGATE_"


class Kind(Enum):
    STR = "string"
    INT = "integer"
    FLOAT = "number"
    BOOL = "boolean"
    STR_LIST = "list of strings"
    PATH = "path"  # Path or Path | None; the rule decides what empty means


_KINDS: dict[object, Kind] = {
    str: Kind.STR,
    int: Kind.INT,
    float: Kind.FLOAT,
    bool: Kind.BOOL,
    tuple[str, ...]: Kind.STR_LIST,
    Path: Kind.PATH,
    Path | None: Kind.PATH,
}


@dataclass(frozen=True, slots=True)
class SchemaKey:
    section: str
    name: str
    kind: Kind
    default: object
    rule: Rule
    doc: str

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def env_var(self) -> str:
        return f"{ENV_PREFIX}{self.section.upper()}_{self.name.upper()}"


def _walk() -> tuple[dict[str, type[Any]], tuple[SchemaKey, ...]]:
    sections: dict[str, type[Any]] = {}
    keys: list[SchemaKey] = []
    section_types = get_type_hints(Settings)
    for sf in dataclasses.fields(Settings):
        if sf.metadata.get(NOT_A_SECTION):
            continue
        cls = section_types[sf.name]
        sections[sf.name] = cls
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(SPEC)
            # Import-time failures: a field without key() or of an unsupported type is a bug in
            # settings.py, and must not load as a setting nobody can set.
            if not isinstance(spec, KeySpec) or f.default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{f.name}: declare it with field(default, key())")
            kind = _KINDS.get(hints[f.name])
            if kind is None:
                raise TypeError(f"{cls.__name__}.{f.name}: unsupported type {hints[f.name]}")
            keys.append(SchemaKey(sf.name, f.name, kind, f.default, spec.rule, spec.doc))
    return sections, tuple(keys)


SECTIONS, KEYS = _walk()
BY_DOTTED = {k.dotted: k for k in KEYS}
BY_ENV = {k.env_var: k for k in KEYS}


def describe_toml(value: object) -> str:
    """A TOML value's type as a user wrote it, for "got ..." in messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date/time"


# Kinds whose TOML value is taken as it is, when of this type.
_AS_IS: dict[Kind, type] = {Kind.STR: str, Kind.PATH: str, Kind.BOOL: bool}


def from_toml(k: SchemaKey, raw: object) -> object:
    """The canonical value of ``raw`` (as tomllib returned it) for key ``k``, or Invalid."""
    value: object
    # bool is a subclass of int in Python but not in TOML: `port = true` is a type error.
    if k.kind is Kind.INT and isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif k.kind is Kind.FLOAT and isinstance(raw, int | float) and not isinstance(raw, bool):
        value = float(raw)  # `shutdown_grace_s = 5` is as good as 5.0
    elif isinstance(raw, _AS_IS.get(k.kind, ())):
        value = raw
    elif (
        k.kind is Kind.STR_LIST
        and isinstance(raw, list)
        and all(isinstance(item, str) for item in raw)
    ):
        value = tuple(raw)
    else:
        got = describe_toml(raw)
        if isinstance(raw, list) and k.kind is Kind.STR_LIST:
            got = "an array holding " + next(
                describe_toml(i) for i in raw if not isinstance(i, str)
            )
        raise Invalid(f"expected {k.rule.allowed}, got {got}")
    return k.rule.check(value)


_INT = re.compile(r"[+-]?[0-9]+")
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def from_env(k: SchemaKey, text: str) -> object:
    """The canonical value of environment text ``text`` for key ``k``, or Invalid."""
    value: object
    if k.kind is Kind.INT:
        if not _INT.fullmatch(text.strip()):
            raise Invalid(f"expected {k.rule.allowed}")
        value = int(text)
    elif k.kind is Kind.FLOAT:
        try:
            value = float(text)
        except ValueError:
            raise Invalid(f"expected {k.rule.allowed}") from None
    elif k.kind is Kind.BOOL:
        try:
            value = _BOOLS[text.strip().lower()]
        except KeyError:
            raise Invalid("expected true/false, 1/0 or yes/no") from None
    elif k.kind is Kind.STR_LIST:
        # Comma-separated; blanks around items and empty items (a trailing comma) are dropped.
        value = tuple(item.strip() for item in text.split(",") if item.strip())
    else:
        value = text
    return k.rule.check(value)
