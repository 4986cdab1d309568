"""The published JSON Schemas (docs/schemas/, draft 2020-12) as the one check of every message.

Messages are validated against the schema of their ``type`` for their direction; there are no
hand-written field checks. A type with no schema is ``unknown_type``, never ignored. The error's
detail names the field and the rule broken, never the value (it could be a token).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Final

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

SCHEMA_DIR: Final = Path(__file__).resolve().parents[2] / "docs" / "schemas"
DIRECTIONS: Final = ("to_agent", "from_agent")


class SchemaError(ValueError):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@cache
def validators(direction: str) -> dict[str, Draft202012Validator]:
    """The validator of every message type of ``direction``, by type."""
    found: dict[str, Draft202012Validator] = {}
    for path in sorted((SCHEMA_DIR / direction).glob("*.json")):
        schema = json.loads(path.read_text())
        Draft202012Validator.check_schema(schema)
        found[path.stem] = Draft202012Validator(schema)
    return found


def validate(direction: str, message: dict[str, Any]) -> None:
    """Raise :class:`SchemaError` unless ``message`` matches the schema of its type."""
    kind = message.get("type")
    if not isinstance(kind, str):
        raise SchemaError("schema", "type: required, a string")
    validator = validators(direction).get(kind)
    if validator is None:
        raise SchemaError("unknown_type", f"no message type {kind[:40]!r} in this direction")
    error = best_match(validator.iter_errors(message))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(message)"
        if error.validator == "additionalProperties":
            detail = f"{where}: a property not in the schema"
        elif error.validator == "required":
            detail = f"{where}: {error.message}"  # names the property, holds no value
        else:
            detail = f"{where}: breaks {error.validator}"
        raise SchemaError("schema", f"{kind}: {detail}")
