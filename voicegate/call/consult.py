"""An attended transfer's consultation (RFC 5589 section 7): what the person on the consult leg
hears before the caller is handed over, what they answer, and who says when to hand over.

Once the consult leg has answered (``consult_answered`` durable), the person hears
``transfer.consult_brief`` and whatever the agent or the API says to them
(:meth:`Consultation.say`: a prompt, or text synthesised by audio/espeak.py), in the order
asked, on the leg's own media port: the caller, on hold, hears nothing of it. Then the REFER
with Replaces goes (voicegate/call/bridge.py sends it):

- ``transfer.consult_complete = "after_brief"``: as soon as the brief and every say queued
  meanwhile have played (at once without a brief and a say);
- ``"api"``: when ``POST /v1/calls/{id}/transfer/complete`` (or the agent's
  ``consult_complete()``) says so; ``.../transfer/cancel`` instead hangs the consult leg up and
  takes the caller back to the agent;
- ``"person"``: when the person presses ``transfer.consult_accept_key``;
  ``consult_decline_key`` declines (as a cancel, status 603). The agent and the API may still
  decide first.

A completion cuts whatever the person is still hearing. Every key the person presses is told
to the agent (``dtmf``), in every mode. The whole transfer stays under its guard
(``transfer.notify_timeout_s`` from the start): a consultation nobody completes ends like any
transfer that timed out.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from agents.base import ConsultEvent
from audio.playout import ResponseDrained
from config.settings import TransferSettings
from telephony.media_bridge import MediaChannel

log = logging.getLogger("voicegate.call")

BRIEF = "consult-brief"  # the brief's id in the consult leg's playout
MAX_SAYS = 16  # queued or being synthesised at once: a consultation is a sentence or two

# Starts synthesising ``text`` at ``rate`` and calls back on the call's task with the samples,
# or None and why not; returns a function that stops it (voicegate/call/consult_speech.py).
Synthesized = Callable[[NDArray[np.int16] | None, str], None]
Synthesize = Callable[[str, int, Synthesized], Callable[[], None]]


class Stage(enum.Enum):
    RINGING = "ringing"  # the consult leg is not answered yet (or not durably)
    BRIEFING = "briefing"  # the person hears the brief (or a say queued before the go-ahead)
    WAITING = "waiting"  # consult_complete = api or person: for the go-ahead
    HANDING_OVER = "handing_over"  # the REFER with Replaces is on its way
    OVER = "over"  # declined, called off, or the leg ended: nothing more to decide


@dataclass(slots=True, eq=False)  # compared by identity: one say, one entry
class _Say:
    say_id: str  # the asker's
    playout_id: str  # ours, unique in the leg's playout
    samples: NDArray[np.int16] | None = None  # None while synthesising
    cancel: Callable[[], None] | None = field(default=None, repr=False)


class Consultation:
    """One consult leg's consultation; ``hand_over`` sends the REFER with Replaces, ``decline``
    calls the transfer off (the person's decline key) and returns why it could not, if so."""

    def __init__(
        self,
        call_id: str,
        settings: TransferSettings,
        prompt: Callable[[str, int], NDArray[np.int16]],
        hand_over: Callable[[], None],
        tell: Callable[[str], None] = lambda detail: None,
        *,
        notify: Callable[[ConsultEvent], None] = lambda event: None,
        decline: Callable[[], str | None] = lambda: None,
        synthesize: Synthesize | None = None,
    ) -> None:
        self._call_id = call_id
        self._settings = settings
        self._prompt = prompt
        self._hand_over = hand_over
        # The agent hears each step (a transfer update "trying" 200 with this detail).
        self._tell = tell
        self._notify = notify  # ... and each consultation event (agents.base.ConsultEvent)
        self._decline = decline
        self._synthesize = synthesize
        self.stage = Stage.RINGING
        self._channel: MediaChannel | None = None
        self._brief_queued = False
        self._brief_done = False
        self._says: list[_Say] = []  # asked, not yet in the playout (in order)
        self._playing: dict[str, str] = {}  # playout id -> say id, queued in the playout
        self._count = 0

    @property
    def rate(self) -> int | None:
        return self._channel.rate if self._channel is not None else None

    def media(self, channel: MediaChannel) -> None:
        """The consult leg's media is up (again, after a re-INVITE): the brief can play."""
        old = self._channel
        self._channel = channel
        if old is not None and old is not channel:
            # A new port: what the old one still held will never drain there. It is cut (and
            # told so); the consultation goes on, without waiting for it.
            cut = list(self._playing.values())
            self._playing.clear()
            self._brief_done = self._brief_done or self._brief_queued
            for say_id in cut:
                self._notify(ConsultEvent("said", say_id=say_id, outcome="cleared"))
            if self.stage is Stage.BRIEFING and self._quiet():
                self._briefed()
                return
        if self.stage is Stage.BRIEFING and not self._brief_queued:
            self._queue_brief()

    def answered(self) -> None:
        """``consult_answered`` is durable: brief the person, or go on at once."""
        if self.stage is not Stage.RINGING:
            return
        self._tell("consult answered")
        self._notify(ConsultEvent("answered"))
        self.stage = Stage.BRIEFING
        if not self._settings.consult_brief:
            self._brief_done = True
            self._briefed()
            return
        if self._channel is not None:
            self._queue_brief()

    def tick(self) -> None:
        """Each media tick: the person's audio is not listened to (nobody of ours hears them),
        and the end of the brief and of each say moves the consultation on."""
        channel = self._channel
        if channel is None:
            return
        channel.collect()
        channel.discard_inbound()
        for event in channel.playout.poll():
            if not isinstance(event, ResponseDrained):
                continue
            if event.response_id == BRIEF:
                self._brief_done = True
            elif (say_id := self._playing.pop(event.response_id, None)) is not None:
                self._notify(ConsultEvent("said", say_id=say_id, outcome="played"))
        if self.stage is Stage.BRIEFING and self._quiet():
            self._briefed()

    # --- what the person hears -----------------------------------------------------------------

    def say(self, *, text: str | None = None, prompt: str | None = None, say_id: str = "") -> str:
        """Queue ``text`` (synthesised) or ``prompt`` for the person, behind what they hear;
        returns the say's id. Raises :class:`ConsultRefused` (nothing changed) when the consult
        leg has not answered or the hand-over is under way, or too much is queued; an unknown
        prompt raises audio.prompts.UnknownPrompt."""
        if self.stage is Stage.OVER:
            raise ConsultRefused("the consultation is over")
        if self.stage is Stage.RINGING or self._channel is None:
            raise ConsultRefused("the consult leg has not answered yet")
        if self.stage is Stage.HANDING_OVER:
            raise ConsultRefused("the caller is already being handed over")
        if len(self._says) + len(self._playing) >= MAX_SAYS:
            raise ConsultRefused(f"{MAX_SAYS} says are already queued for the person")
        rate = self._channel.rate
        self._count += 1
        item = _Say(say_id or f"say-{self._count}", f"consult-say-{self._count}")
        if prompt is not None:
            item.samples = self._prompt(prompt, rate)  # UnknownPrompt: nothing queued
            self._says.append(item)
        elif text is not None and self._synthesize is not None:
            self._says.append(item)
            item.cancel = self._synthesize(
                text, rate, lambda samples, why: self._synthesised(item, samples, why)
            )
        else:
            raise ConsultRefused("text cannot be spoken here (no synthesis)")
        # Lengths only: what is said to the person may name the caller (STYLE.md habit 10).
        log.info(
            "transfer.consult_say",
            extra={
                "call_id": self._call_id,
                "prompt": prompt,
                "text_chars": len(text) if text is not None else None,
            },
        )
        self._flush()
        return item.say_id

    def _synthesised(self, item: _Say, samples: NDArray[np.int16] | None, why: str) -> None:
        if item not in self._says:
            return  # cut meanwhile: the hand-over, or the consultation is over
        item.cancel = None
        if samples is None:
            self._says.remove(item)
            log.warning(
                "transfer.consult_say_failed", extra={"call_id": self._call_id, "why": why}
            )
            self._notify(ConsultEvent("said", say_id=item.say_id, outcome="failed", detail=why))
        else:
            item.samples = samples
        self._flush()
        if self.stage is Stage.BRIEFING and self._quiet():
            self._briefed()

    def _flush(self) -> None:
        """Into the playout, in the order asked, every say whose audio is ready."""
        channel = self._channel
        if channel is None or (self.stage is Stage.BRIEFING and not self._brief_queued):
            return  # the brief goes first
        playout = channel.playout
        while self._says and self._says[0].samples is not None:
            item = self._says.pop(0)
            assert item.samples is not None
            playout.begin(item.playout_id, playout.generation)
            playout.admit(item.playout_id, playout.generation, item.samples)
            playout.finish(item.playout_id)
            self._playing[item.playout_id] = item.say_id

    def _quiet(self) -> bool:
        """Nothing more for the person: the brief has played, and every say."""
        return self._brief_done and not self._says and not self._playing

    # --- the go-ahead ---------------------------------------------------------------------------

    def key(self, digit: str) -> None:
        """The person pressed ``digit`` (RFC 2833 or SIP INFO on the consult leg): told to the
        agent; with consult_complete = person, the accept and decline keys decide."""
        if self.stage in (Stage.RINGING, Stage.OVER):
            return
        self._notify(ConsultEvent("dtmf", digit=digit))
        settings = self._settings
        if settings.consult_complete != "person" or self.stage is Stage.HANDING_OVER:
            return
        if digit == settings.consult_accept_key:
            self._notify(ConsultEvent("accepted"))
            self._go("person")
        elif digit == settings.consult_decline_key:
            why = self._decline()
            if why is None:
                self._notify(ConsultEvent("declined"))
                self.close()
                log.info("transfer.consult_declined", extra={"call_id": self._call_id})

    def complete(self, by: str = "api") -> str | None:
        """The go-ahead (the API's, the agent's): None once the REFER is on its way, else why
        not (409)."""
        if self.stage is Stage.OVER:
            return "the consultation is over"
        if self.stage is Stage.HANDING_OVER:
            return "the caller is already being handed over"
        if self.stage is Stage.RINGING:
            return "the consult leg has not answered yet"
        self._go(by)
        return None

    def close(self) -> None:
        """The consultation is over (the leg ended, or was called off): stop synthesising, and
        tell the agent what it asked to say that never played. A hand-over under way stays
        under way (its NOTIFYs tell the outcome)."""
        self._cut()
        if self.stage is not Stage.HANDING_OVER:
            self.stage = Stage.OVER

    def _cut(self) -> None:
        channel = self._channel
        cut = list(self._playing.values())
        self._playing.clear()
        if channel is not None and (cut or not self._brief_done):
            channel.playout.interrupt(channel.playout.generation + 1)
        for item in self._says:
            if item.cancel is not None:
                item.cancel()
            cut.append(item.say_id)
        self._says.clear()
        for say_id in cut:
            self._notify(ConsultEvent("said", say_id=say_id, outcome="cleared"))

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
        self._flush()  # says asked before the leg's media was up

    def _briefed(self) -> None:
        if self._settings.consult_complete in ("api", "person"):
            self.stage = Stage.WAITING
            log.info("transfer.consult_waiting", extra={"call_id": self._call_id})
            self._tell("consult waiting for the go-ahead")
            return
        self._go("after_brief")

    def _go(self, by: str) -> None:
        if by != "after_brief":
            log.info("transfer.consult_completed", extra={"call_id": self._call_id, "by": by})
        self._cut()  # what the person still hears of the brief and the says
        self.stage = Stage.HANDING_OVER
        self._hand_over()


class ConsultRefused(Exception):
    """A say the consultation cannot take now; the message says why (the API's 409)."""
