"""The agent's responses as the session records them, and the prompts the session says.

A response opens with the agent's first chunk of audio (ResponseStarted; its BindResponse effect
opens it in the playout), and ends drained (ResponseFinished) or cut (ResponseInterrupted, with
how much the caller heard). Only one is open at a time.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from audio.playout import Playout
from session import events as sev
from telephony.media_bridge import MediaChannel
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.services import CallServices


class Responses:
    def __init__(self, state: CallState, services: CallServices, steps: SessionSteps) -> None:
        self._state = state
        self._services = services
        self._steps = steps
        self._responses = 0
        self._says = 0
        # The response the session knows as current; ``open`` while the agent may still add to
        # it (then it is finished in the playout and drains).
        self.response_id: str | None = None
        self.open = False

    def forget(self) -> None:
        """Nothing queued so far may continue: the next chunk opens a new response."""
        self.response_id, self.open = None, False

    def queue(self, channel: MediaChannel, samples: NDArray[np.int16]) -> bool:
        """Queue the agent's audio in the open response, opening one if needed; False when the
        session refused a new response."""
        if not self.open and not self._start():
            return False
        assert self.response_id is not None and self._state.session is not None
        generation = self._state.session.state.playback_generation
        # Admission checks the generation: a chunk of an older one never enters the queue.
        channel.playout.admit(self.response_id, generation, np.asarray(samples, dtype=np.int16))
        return True

    def mark(self, mark_id: str) -> bool:
        """Place a mark after the audio queued so far; ``Agent.on_mark`` says when it was heard."""
        channel = self._state.channel
        if channel is None or not self.open or self.response_id is None:
            return False
        return channel.playout.mark(self.response_id, mark_id)

    def _start(self) -> bool:
        """Open a new response; a finished one still draining is recorded as finished first."""
        if self.response_id is not None:
            self._close(self.response_id)
        self._responses += 1
        response_id = f"r{self._responses}"
        turn_id = self._state.current_turn()
        # Its BindResponse effect opens the response in the playout, in the current generation.
        if not self._steps.try_apply(sev.ResponseStarted(response_id, turn_id)):
            return False
        self.response_id, self.open = response_id, True
        return True

    def _close(self, response_id: str) -> None:
        channel = self._state.channel
        heard = channel.playout.heard_ms(response_id) if channel else 0
        self.response_id, self.open = None, False
        self._steps.try_apply(sev.ResponseFinished(response_id, heard))

    def interrupt(self) -> int | None:
        """Cut the active response at once; the session records how much the caller heard."""
        response_id, channel, session = self.response_id, self._state.channel, self._state.session
        if response_id is None or channel is None or session is None:
            return None
        playout = channel.playout
        # Stop the audio first (the cut is exact), then make it durable: no frame of the old
        # generation leaves the bridge while the log is written.
        cut = playout.interrupt(max(playout.generation, session.state.playback_generation) + 1)
        heard = next((c.heard_ms for c in cut if c.response_id == response_id), None)
        if heard is None:
            heard = playout.heard_ms(response_id)
        self.response_id, self.open = None, False
        self._steps.try_apply(sev.ResponseInterrupted(response_id, heard))
        return heard

    def finish_if_sent(self, playout: Playout) -> None:
        # A response whose audio has all been queued and pulled is done: finish it (the last
        # partial frame is padded) and record it once it has drained.
        if self.open and self.response_id and playout.queued_ms == 0:
            playout.finish(self.response_id)
            self.open = False

    def drained(self, response_id: str, heard_ms: int) -> None:
        """The playout sent the last of ``response_id``: the session records it finished."""
        if response_id == self.response_id and not self.open:
            self.response_id = None
            self._steps.try_apply(sev.ResponseFinished(response_id, heard_ms))

    def say(self, prompt: str) -> None:
        """A line the session machine wants the caller to hear (not an agent response)."""
        channel = self._state.channel
        if channel is None or self._state.phase is not CallPhase.ANSWERED:
            return
        playout = channel.playout
        if self.open and self.response_id is not None:
            playout.finish(self.response_id)
            self.open = False
        self._says += 1
        say_id = f"say{self._says}"
        playout.begin(say_id, playout.generation)
        playout.admit(say_id, playout.generation, self._services.prompt(prompt, channel.rate))
        playout.finish(say_id)
