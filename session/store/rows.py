"""How both stores turn records into rows: columns named as the record's fields, JSON fields
kept as canonical JSON text (equal values are stored as equal text; NaN is refused)."""

from __future__ import annotations

import builtins
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

JSON_FIELDS: Final = frozenset({"payload", "effects", "state", "meta", "arguments", "detail"})


def names(cls: type[DataclassInstance]) -> builtins.list[str]:
    """A table's columns: its record's fields, in order."""
    return [field.name for field in dataclasses.fields(cls)]


def dump(value: object) -> str:
    """Canonical JSON of ``value`` (mappings and sequences of any kind)."""

    def default(obj: object) -> object:
        if isinstance(obj, Mapping):
            return dict(obj)
        if isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
            return builtins.list(obj)
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")

    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=default
    )
