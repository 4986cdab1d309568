"""An attended transfer's consultation (RFC 5589 section 7): what the person on the consult leg
hears before the caller is handed over, and who says when to hand over.

Once the consult leg has answered (``consult_answered`` durable), the person hears
``transfer.consult_brief`` on the leg's own media port (the caller, on hold, hears nothing of
it), and then the REFER with Replaces goes (voicegate/call/bridge.py sends it):

- ``transfer.consult_complete = "after_brief"``: as soon as the brief has played (at once without
  a brief);
- ``"api"``: when ``POST /v1/calls/{id}/transfer/complete`` says so (a call-centre integration
  that lets its agent accept first); ``.../transfer/cancel`` instead hangs the consult leg up and
  takes the caller back to the agent. A completion during the brief cuts the brief.

Either way the whole transfer stays under its guard (``transfer.notify_timeout_s`` from the start):
a consultation nobody completes ends like any transfer that timed out.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from audio.playout import ResponseDrained
from config.settings import TransferSettings
from telephony.media_bridge import MediaChannel

log = logging.getLogger("voicegate.call")

BRIEF = "consult-brief"  # the brief's id in the consult leg's playout


class Stage(enum.Enum):
    RINGING = "ringing"  # the consult leg is not answered yet (or not durably)
    BRIEFING = "briefing"  # the person hears the brief
    WAITING = "waiting"  # consult_complete = api: for POST .../transfer/complete
    HANDING_OVER = "handing_over"  # the REFER with Replaces is on its way


class Consultation:
    """One consult leg's consultation; ``hand_over`` sends the REFER with Replaces."""

    def __init__(
        self,
        call_id: str,
        settings: TransferSettings,
        prompt: Callable[[str, int], NDArray[np.int16]],
        hand_over: Callable[[], None],
        tell: Callable[[str], None] = lambda detail: None,
    ) -> None:
        self._call_id = call_id
        self._settings = settings
        self._prompt = prompt
        self._hand_over = hand_over
        # The agent hears each step (a transfer update "trying" 200 with this detail).
        self._tell = tell
        self.stage = Stage.RINGING
        self._channel: MediaChannel | None = None
        self._brief_queued = False

    def media(self, channel: MediaChannel) -> None:
        """The consult leg's media is up (again, after a re-INVITE): the brief can play."""
        self._channel = channel
        if self.stage is Stage.BRIEFING and not self._brief_queued:
            self._queue_brief()

    def answered(self) -> None:
        """``consult_answered`` is durable: brief the person, or go on at once."""
        if self.stage is not Stage.RINGING:
            return
        self._tell("consult answered")
        if not self._settings.consult_brief:
            self._briefed()
            return
        self.stage = Stage.BRIEFING
        if self._channel is not None:
            self._queue_brief()

    def tick(self) -> None:
        """Each media tick: the person's audio is not listened to (nobody of ours talks with
        them yet), and the brief's end moves the consultation on."""
        channel = self._channel
        if channel is None:
            return
        channel.collect()
        channel.inbound.clear()
        for event in channel.playout.poll():
            drained = isinstance(event, ResponseDrained) and event.response_id == BRIEF
            if drained and self.stage is Stage.BRIEFING:
                self._briefed()

    def complete(self) -> str | None:
        """The API's go-ahead: None once the REFER is on its way, else why not (409)."""
        if self.stage is Stage.HANDING_OVER:
            return "the caller is already being handed over"
        if self.stage is Stage.RINGING:
            return "the consult leg has not answered yet"
        if self.stage is Stage.BRIEFING and self._channel is not None:
            self._channel.playout.interrupt(self._channel.playout.generation + 1)
        log.info("transfer.consult_completed", extra={"call_id": self._call_id, "by": "api"})
        self._go()
        return None

    def _queue_brief(self) -> None:
        channel = self._channel
        assert channel is not None
        samples = self._prompt(self._settings.consult_brief, channel.rate)
        playout = channel.playout
        playout.begin(BRIEF, playout.generation)
        playout.admit(BRIEF, playout.generation, samples)
        playout.finish(BRIEF)
        self._brief_queued = True
        log.info(
            "transfer.consult_briefing",
            extra={"call_id": self._call_id, "prompt": self._settings.consult_brief},
        )

    def _briefed(self) -> None:
        if self._settings.consult_complete == "api":
            self.stage = Stage.WAITING
            log.info("transfer.consult_waiting", extra={"call_id": self._call_id})
            self._tell("consult waiting for the go-ahead")
            return
        self._go()

    def _go(self) -> None:
        self.stage = Stage.HANDING_OVER
        self._hand_over()
