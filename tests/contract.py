"""Every answer of voicegate's control API that a test receives is the one docs/openapi.yaml allows.

``check_answer`` matches a concrete request (``GET /v1/sessions/abc``) to the document's path
template and operation, then checks the status (documented for that operation, else ``default``),
the content type (one the response lists) and, for JSON, the body against the response's schema
(OpenAPI 3.1, so JSON Schema 2020-12 with OpenAPI's vocabulary: ``OAS31Validator``). A mismatch
raises :class:`ContractError` naming the request, the status and each offending field, e.g.
``GET /v1/sessions/x -> 200: $.dimensions.signaling: 'away' is not one of [...]``.

The test harness calls it on every answer it gets from a voicegate process or pool supervisor
(tests/integration/harness.py's ``Server``); answers of other servers (the payment provider,
Prometheus, a remote agent) never come here. ``VOICEGATE_TEST_OPENAPI`` points it at another copy
of the document, to see a failure by hand (docs/development.md).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from jsonschema.exceptions import ValidationError
from openapi_schema_validator import OAS31Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DOCUMENT = Path(__file__).resolve().parents[1] / "docs" / "openapi.yaml"
DOCUMENT_ENV = "VOICEGATE_TEST_OPENAPI"
# The document's own URI inside the registry, so that every "#/components/..." $ref resolves.
_URI = "urn:voicegate:openapi"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# How many offending fields one failure lists; the first few say what drifted.
_SHOWN = 5


class ContractError(AssertionError):
    """An answer docs/openapi.yaml does not allow; the message names request, status and field."""


@dataclass(frozen=True)
class _Route:
    template: str
    pattern: re.Pattern[str]
    pointer: str  # JSON pointer of the path item in the document


def _escape(token: str) -> str:
    """One JSON-pointer token (RFC 6901 section 3)."""
    return token.replace("~", "~0").replace("/", "~1")


def _route(template: str) -> _Route:
    parts = re.split(r"(\{[^}/]+\})", template)
    regex = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
    return _Route(template, re.compile(f"^{regex}$"), f"/paths/{_escape(template)}")


class Contract:
    """One OpenAPI document, loaded once, that answers can be checked against."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self._registry: Registry[Any] = Registry().with_resource(
            _URI, Resource.from_contents(document, default_specification=DRAFT202012)
        )
        # A literal segment beats a template one (/v1/calls/x/hangup is not /v1/calls/{id}), so
        # the routes with more literal characters are tried first.
        self._routes = sorted(
            (_route(t) for t in document["paths"]),
            key=lambda r: -len(re.sub(r"\{[^}]+\}", "", r.template)),
        )

    @classmethod
    def load(cls, path: Path) -> Contract:
        loaded = yaml.safe_load(path.read_text())
        if not isinstance(loaded, dict) or not str(loaded.get("openapi", "")).startswith("3.1"):
            raise ValueError(f"{path} is not an OpenAPI 3.1 document")
        return cls(loaded)

    def _resolve(self, node: Any, pointer: str) -> tuple[Any, str]:
        """``node`` (at ``pointer``) with any $ref followed: the target and its pointer."""
        while isinstance(node, dict) and "$ref" in node:
            ref = str(node["$ref"])
            if not ref.startswith("#"):
                raise ValueError(f"only local $refs are supported, not {ref!r}")
            pointer = ref[1:]
            node = self._registry.resolver(_URI).lookup(f"{_URI}#{pointer}").contents
        return node, pointer

    def problems(
        self, method: str, target: str, status: int, content_type: str, body: bytes
    ) -> list[str]:
        """What in this answer the document does not allow; empty if it is all allowed.

        ``target`` is the request's path, with or without its query or a scheme and host.
        """
        path = urlsplit(target).path
        route = next((r for r in self._routes if r.pattern.match(path)), None)
        item: dict[str, Any] = {}
        if route is not None:
            item = self.document["paths"][route.template]
        operation = item.get(method.lower()) if method.lower() in _METHODS else None
        if operation is None:
            # Unknown path (404) or a method the path does not take (405): the doc's rules say
            # both are the Error body (its description, http_rules.py), and nothing else is.
            if status not in (404, 405):
                what = "no path" if route is None else f"no {method.upper()} on {route.template}"
                return [f"the document has {what}, yet the answer is {status}, not 404 or 405"]
            if method.upper() == "HEAD":
                return []  # an answer to HEAD has no body (RFC 9110 section 9.3.2)
            return self._body_problems(
                {"$ref": "#/components/schemas/Error"},
                "/components/schemas/Error",
                content_type,
                body,
            )
        assert route is not None
        op_pointer = f"{route.pointer}/{method.lower()}"
        responses = operation.get("responses", {})
        key = next(
            (k for k in (str(status), f"{str(status)[0]}XX") if k in responses),
            "default" if "default" in responses else None,
        )
        if key is None:
            return [f"status {status} is not documented (only {', '.join(responses)})"]
        response, pointer = self._resolve(responses[key], f"{op_pointer}/responses/{key}")
        content: dict[str, Any] = response.get("content", {})
        if not content:
            return [f"a body of {len(body)} bytes where the document has none"] if body else []
        media = content_type.split(";", 1)[0].strip().lower()
        chosen = next((m for m in content if _matches(m, media)), None)
        if chosen is None:
            return [f"content type {content_type!r} is not one of {sorted(content)}"]
        if "schema" not in content[chosen] or "json" not in media:
            return []
        schema_pointer = f"{pointer}/content/{_escape(chosen)}/schema"
        return self._body_problems(content[chosen]["schema"], schema_pointer, media, body)

    def _body_problems(
        self, schema: Any, pointer: str, content_type: str, body: bytes
    ) -> list[str]:
        if "json" not in content_type.split(";", 1)[0]:
            return [f"content type {content_type!r} where the document has application/json"]
        try:
            decoded = json.loads(body)
        except ValueError as exc:
            return [f"the body is not JSON ({exc}): {body[:200]!r}"]
        validator = OAS31Validator(
            {"$ref": f"{_URI}#{pointer}"},
            registry=self._registry,
            format_checker=OAS31Validator.FORMAT_CHECKER,
        )
        # A path through a $ref is reported relative to the schema the $ref names, so the
        # message names the response's own schema (its $ref target) as the starting point.
        name = schema["$ref"] if isinstance(schema, dict) and "$ref" in schema else f"#{pointer}"
        errors = [d for e in validator.iter_errors(decoded) for d in _describe(e)]
        errors.sort(key=lambda e: [str(p) for p in e.absolute_path])
        return [_render(e, name) for e in errors]

    def check(self, method: str, target: str, status: int, content_type: str, body: bytes) -> None:
        """Raise :class:`ContractError` unless the document allows this answer."""
        found = self.problems(method, target, status, content_type, body)
        if found:
            raise ContractError(_message(method, target, status, found))


def _matches(documented: str, media: str) -> bool:
    """``text/*`` and ``*/*`` as OpenAPI 3.1's media type ranges mean them."""
    kind, _, sub = documented.lower().partition("/")
    got_kind, _, got_sub = media.partition("/")
    return (kind in ("*", got_kind)) and (sub in ("*", got_sub))


def _describe(error: ValidationError) -> list[ValidationError]:
    """The errors that name what is off: for a oneOf/anyOf that failed as a whole ("is not valid
    under any of the given schemas"), those of the branch that came closest, recursively."""
    if not error.context:
        return [error]
    branches: dict[Any, list[ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)

    # The closest branch is the one whose errors are not about the answer's very shape (a
    # wrong type or const at the branch's root means the answer is not meant to be that branch),
    # then the one with the fewest errors.
    def distance(errors: list[ValidationError]) -> tuple[bool, int]:
        wrong_shape = any(
            not e.relative_path and e.validator in ("type", "const", "enum") for e in errors
        )
        return wrong_shape, len(errors)

    closest = min(branches.values(), key=distance)
    return [deeper for sub in closest for deeper in _describe(sub)]


def _render(error: ValidationError, schema: str) -> str:
    where = "/".join(str(p) for p in error.absolute_schema_path)
    return f"{error.json_path}: {_short(error.message)} (schema: {schema}/{where})"


def _short(message: str, limit: int = 300) -> str:
    return message if len(message) <= limit else f"{message[:limit]}..."


def _message(method: str, target: str, status: int, found: Iterable[str]) -> str:
    found = list(found)
    shown = "\n  ".join(found[:_SHOWN])
    more = f"\n  ... and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    return (
        f"{method.upper()} {target} -> {status}: the answer is not what docs/openapi.yaml says "
        f"(tests/contract.py):\n  {shown}{more}"
    )


@functools.cache
def contract() -> Contract:
    """The document this run checks against: docs/openapi.yaml unless ``VOICEGATE_TEST_OPENAPI``."""
    return Contract.load(Path(os.environ.get(DOCUMENT_ENV) or DOCUMENT))


def check_answer(method: str, target: str, status: int, content_type: str, body: bytes) -> None:
    """Fail the calling test unless docs/openapi.yaml allows this answer of voicegate's API."""
    contract().check(method, target, status, content_type, body)
