"""Injected faults: the crash windows of seed 000 ("how to validate"), on demand.

- ``charge_delay_s``: sleep before committing (the provider is slow, past the caller's timeout).
- ``respond_delay_s``: commit, then sleep before answering (committed, but the answer is late).
- ``fail_status`` / ``fail_count``: the next ``fail_count`` charge requests get ``fail_status``
  (a 5xx) and nothing is written.
- ``status_unknown``: the status endpoint answers ``unknown`` for every key.

Set at start-up (CLI flags or ``PAYMENTS_*`` environment variables) and, when the service runs
with ``--admin``, at run time through ``POST /admin/faults``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Final

from providers.payments.contract import RequestError

MAX_DELAY_S: Final = 3600.0


def _delay(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(name, f"{name} must be a number of seconds")
    if not (math.isfinite(value) and 0 <= value <= MAX_DELAY_S):
        raise RequestError(name, f"{name} must be 0..{MAX_DELAY_S:g} seconds")
    return float(value)


def _fail_status(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 500 <= value <= 599:
        raise RequestError(name, f"{name} must be an HTTP status 500..599 or null")
    return value


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(name, f"{name} must be an integer >= 0")
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise RequestError(name, f"{name} must be true or false")
    return value


_CHECKS: Final = {
    "charge_delay_s": _delay,
    "respond_delay_s": _delay,
    "fail_status": _fail_status,
    "fail_count": _count,
    "status_unknown": _flag,
}


@dataclass(slots=True)
class Faults:
    """The faults in force. Mutable: the admin endpoint changes them while requests run."""

    charge_delay_s: float = 0.0
    respond_delay_s: float = 0.0
    fail_status: int | None = None
    fail_count: int = 0
    status_unknown: bool = False

    def __post_init__(self) -> None:
        self.update(asdict(self))  # the same checks for start-up values as for run-time ones

    def update(self, changes: Mapping[str, object]) -> None:
        """Apply some fields; all are checked first, so a RequestError changes nothing."""
        checked: dict[str, object] = {}
        for name, value in changes.items():
            check = _CHECKS.get(name)
            if check is None:
                raise RequestError(name, "unknown fault")
            checked[name] = check(name, value)
        for name, value in checked.items():
            setattr(self, name, value)

    def take_failure(self) -> int | None:
        """The status to fail this charge request with, counting it; None to serve it."""
        if self.fail_status is None or self.fail_count <= 0:
            return None
        self.fail_count -= 1
        return self.fail_status

    def as_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
