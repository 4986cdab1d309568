"""Frames the voicegate transport adds to Pipecat's, for bots that want more than audio and keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipecat.frames.frames import SystemFrame


@dataclass
class VoicegateMessageFrame(SystemFrame):
    """A voicegate message the pipeline may want to see (``gate``, ``transfer.progress``, ...).

    The transport acts on every message itself; this frame only tells the pipeline. The link
    messages (seq, ack, resume) never appear.
    """

    message: dict[str, Any]


@dataclass
class VoicegateResponseCutFrame(SystemFrame):
    """A bot turn stopped before it played out, and what the caller heard of it.

    ``reason``: ``barge_in`` or ``canceled`` (the caller or the bot cut it), or voicegate's own
    (``media``, ``reinvite``, ``transfer``, ``agent_link``, ``timeout``, ``ending``). The text of
    the turn the assistant context keeps is already what the caller heard (the transport hands
    the words on only as voicegate reports them played); ``heard_ms`` is the exact figure.
    """

    response_id: str
    heard_ms: int
    reason: str
