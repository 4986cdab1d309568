"""Hold audio while the agent's link is down: the last rung of seed 004's ladder for a phone.

The session decides what is said (session/machine.py): nothing under ``session.honesty_after_s``
of trouble (the retry runs underneath), then once "one moment, I am reconnecting". What the caller
hears after that line, until the link is back or the deadline ends the call, is this module's
job: a quiet, regular pulse, so the line is never dead air (a caller who hears nothing for ten
seconds hangs up) and never sounds like the agent talking.

It holds only for a recovery that includes the agent's link and whose honest line was said (a
media gap has nobody listening; a transfer has its own ringback). The pulse is fed a little at a
time (at most :data:`AHEAD_MS` queued), so it stops within that once the recovery ends and the
agent's next response follows at once. It plays as one of the session's own lines: never reported
to the agent, never subject to barge-in.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from session.vocabulary import Interruption
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.responses import Responses

HOLD_HZ = 440.0
HOLD_PEAK = 600  # about -35 dBFS: clearly there, clearly not speech
TONE_MS = 300
CYCLE_MS = 2000  # a 300 ms pulse every 2 s
AHEAD_MS = 200
_FADE_MS = 20


def hold_pattern(rate: int) -> NDArray[np.int16]:
    """One cycle of the hold pulse at ``rate``: a soft tone with faded edges, then silence."""
    tone_n, cycle_n, fade_n = (rate * ms // 1000 for ms in (TONE_MS, CYCLE_MS, _FADE_MS))
    t = np.arange(tone_n) / rate
    envelope = np.minimum(1.0, np.minimum(np.arange(tone_n), np.arange(tone_n)[::-1]) / fade_n)
    pulse = HOLD_PEAK * envelope * np.sin(2 * np.pi * HOLD_HZ * t)
    cycle = np.zeros(cycle_n, dtype=np.int16)
    cycle[:tone_n] = pulse.astype(np.int16)
    return cycle


class HoldAudio:
    def __init__(self, state: CallState, responses: Responses) -> None:
        self._state = state
        self._responses = responses
        self._generation: int | None = None  # the recovery whose honest line was said
        self._pattern: NDArray[np.int16] | None = None
        self._at = 0  # samples into the pattern

    def said(self, prompt: str) -> None:
        """The session said ``prompt``; the honest line of a link loss starts the hold."""
        state = self._state.session_state
        recovery = state.recovery if state is not None else None
        if (
            prompt == "reconnecting"
            and recovery is not None
            and Interruption.AGENT_LINK in recovery.interruptions
        ):
            self._generation, self._at = recovery.generation, 0

    @property
    def holding(self) -> bool:
        return self._generation is not None

    def on_tick(self) -> None:
        """A media tick: top up the pulse while the recovery lasts; stop once it is over."""
        if self._generation is None:
            return
        state, channel = self._state.session_state, self._state.channel
        recovery = state.recovery if state is not None else None
        if (
            recovery is None
            or recovery.generation != self._generation
            or Interruption.AGENT_LINK not in recovery.interruptions
            or channel is None
            or self._state.phase is not CallPhase.ANSWERED
            or self._state.media_released
        ):
            self._generation = None
            return
        if channel.playout.queued_ms >= AHEAD_MS:
            return  # the honest line is still playing, or enough of the pulse is queued
        if self._pattern is None or len(self._pattern) != channel.rate * CYCLE_MS // 1000:
            self._pattern = hold_pattern(channel.rate)
        step = channel.rate * AHEAD_MS // 1000
        piece = np.take(self._pattern, np.arange(self._at, self._at + step), mode="wrap")
        self._at = (self._at + step) % len(self._pattern)
        self._responses.say_audio(piece)
