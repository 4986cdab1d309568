"""What a link reports to: the contract between agents/remote/link.py and its owner (the adapter).

The link calls these from its own task; an owner that acts on the call hands the work to the
call's task (agents/remote/adapter.py, STYLE.md habit 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class LinkOwner(Protocol):
    """What the link reports to (the adapter)."""

    def on_message(self, message: Mapping[str, Any]) -> None:
        """A new, in-order application message (raise ProtocolError to refuse it)."""

    def on_chunk(self, data: bytes) -> None:
        """A binary frame (raise ProtocolError to refuse it)."""

    def check_accept(self, message: Mapping[str, Any]) -> None:
        """Raise ProtocolError("handshake") unless ``session.accept`` is acceptable."""

    def link_up(self, resumed: bool) -> None: ...

    def buffered_ms(self) -> int:
        """Response audio queued ahead of the caller (flow control, in pong)."""
        ...

    def restart_message(self) -> dict[str, Any]:
        """The ``session.start`` of a session started again after a refused resume."""
        ...

    def resume_fields(self) -> dict[str, Any]:
        """Fields ``session.resume`` carries besides the session id and the token."""
        ...

    def link_down(self) -> None: ...

    def link_gone(self, reason: str) -> None: ...
