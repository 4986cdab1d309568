"""The agent's responses as handles, as the session records them, and the prompts the session says.

An agent opens a response with ``call.respond()`` and writes its audio and marks to the handle
(agents.base.Response). The session records it (ResponseStarted; its BindResponse effect opens it
in the playout, in the current playback generation), and it ends drained (ResponseFinished) or cut
(ResponseInterrupted, with how much the caller heard). Only one is current at a time.

A handle dies when its response is done, cut (barge-in, an interruption the session raises, a
cancel), superseded by the next ``respond()``, or the call ends; from then on its audio is dropped
at admission and counted by that reason. Playback generations guard the same thing inside the
playout, but a handle also catches what generations cannot: a chunk written to a response that was
superseded, or done, in the same generation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from agents.base import MarkOutcome, PlaybackCut
from audio.playout import Interrupted
from session import events as sev
from voicegate.call.acting import SessionSteps
from voicegate.call.call_state import CallPhase, CallState
from voicegate.call.cuts import SessionCut
from voicegate.call.notices import AgentNotice
from voicegate.call.services import CallServices

log = logging.getLogger("voicegate.call")


class ResponseHandle:
    """One agent response (agents.base.Response); made only by :meth:`Responses.respond`."""

    def __init__(self, owner: Responses, response_id: str, ended: str | None = None) -> None:
        self._owner = owner
        self._id = response_id
        self._ended = ended

    @property
    def id(self) -> str:
        return self._id

    @property
    def alive(self) -> bool:
        return self._ended is None

    @property
    def ended(self) -> str | None:
        return self._ended

    def end(self, why: str) -> None:
        if self._ended is None:
            self._ended = why

    def play(self, samples: NDArray[np.int16]) -> bool:
        return self._owner.play(self, samples)

    def play_prompt(self, name: str) -> bool:
        return self._owner.play_prompt(self, name)

    def mark(self, mark_id: str) -> bool:
        return self._owner.mark(self, mark_id)

    def done(self) -> None:
        self._owner.done(self)

    def cancel(self) -> None:
        self._owner.cancel(self)

    def __repr__(self) -> str:
        return f"<Response {self._id} {self._ended or 'alive'}>"


class Responses:
    def __init__(
        self,
        state: CallState,
        services: CallServices,
        steps: SessionSteps,
        may_play: Callable[[], bool],
        post: Callable[[object], None],
    ) -> None:
        self._state = state
        self._services = services
        self._steps = steps
        self._may_play = may_play  # False once the call is hanging up
        self._post = post
        self._responses = 0
        self._says = 0
        # The prompt each of the session's lines in the playout plays, by its say id (a cut of
        # one is recorded by that name); hold audio has none, it is not a line.
        self._lines: dict[str, str] = {}
        # The response the session knows as current, until it drained or was cut; ``open``
        # while it may still take audio (the handle is alive).
        self.response_id: str | None = None
        self.open = False
        self._handle: ResponseHandle | None = None
        # Called after each chunk admitted (the crash-window fault "during_playout").
        self.on_admitted: Callable[[], None] = lambda: None

    # --- the agent's side (ResponseHandle) ----------------------------------------------------

    def respond(self) -> ResponseHandle:
        """Open a new response; the open one, if any, is superseded (it plays out)."""
        self._responses += 1
        response_id = self._state.next_id("r", self._responses)
        channel, state = self._state.channel, self._state
        if channel is None or state.phase is not CallPhase.ANSWERED or not self._may_play():
            return ResponseHandle(self, response_id, ended="refused")
        if self._handle is not None and self._handle.alive:
            self._handle.end("superseded")
            channel.playout.finish(self._handle.id)
            self.open = False
        if self.response_id is not None:
            # A finished response still draining is recorded as finished, heard so far.
            self._close(self.response_id)
        turn_id = state.current_turn()
        # Its BindResponse effect opens the response in the playout, in the current generation.
        if not self._steps.try_apply(sev.ResponseStarted(response_id, turn_id)):
            return ResponseHandle(self, response_id, ended="refused")
        self.response_id, self.open = response_id, True
        self._handle = ResponseHandle(self, response_id)
        return self._handle

    def play(self, handle: ResponseHandle, samples: NDArray[np.int16]) -> bool:
        channel, state = self._state.channel, self._state
        if handle.alive and (
            channel is None
            or state.phase is not CallPhase.ANSWERED
            or state.media_released
            or not self._may_play()
        ):
            self._end_current("ended")
        if not handle.alive or channel is None:
            self._dropped(handle, len(samples))
            return False
        assert self._state.session is not None
        generation = self._state.session.state.playback_generation
        # The playout checks the generation too: a chunk of an older one never enters it.
        if not channel.playout.admit(handle.id, generation, np.asarray(samples, dtype=np.int16)):
            return False
        self.on_admitted()
        return True

    def play_prompt(self, handle: ResponseHandle, name: str) -> bool:
        channel = self._state.channel
        rate = channel.rate if channel is not None else 8000
        return self.play(handle, self._services.prompt(name, rate))

    def mark(self, handle: ResponseHandle, mark_id: str) -> bool:
        channel = self._state.channel
        if handle.alive and channel is not None and channel.playout.mark(handle.id, mark_id):
            return True
        # Never placed, so never played: the agent still hears of it, once.
        self._post(MarkOutcome(handle.id, mark_id, "cleared"))
        return False

    def done(self, handle: ResponseHandle) -> None:
        if not handle.alive:
            return
        handle.end("done")
        channel = self._state.channel
        if channel is not None:
            channel.playout.finish(handle.id)
        if handle.id == self.response_id:
            self.open = False

    def cancel(self, handle: ResponseHandle) -> None:
        if handle.id == self.response_id:
            self.interrupt(why="canceled", reason="canceled")
        else:
            handle.end("canceled")

    # --- the call's side ----------------------------------------------------------------------

    def forget(self) -> None:
        """The session cleared the playout (an interruption): the current response is dead."""
        self._end_current("interrupted")
        self.response_id, self.open = None, False

    def ended(self) -> None:
        """The call is over: no response takes audio any more."""
        self._end_current("ended")
        self.open = False

    def _end_current(self, why: str) -> None:
        if self._handle is not None:
            self._handle.end(why)

    def _dropped(self, handle: ResponseHandle, samples: int) -> None:
        channel = self._state.channel
        rate = channel.rate if channel is not None else 8000
        frames = math.ceil(samples / (rate // 50)) if samples else 0
        reason = handle.ended or "ended"
        self._services.metrics.dead_response_frames.labels(reason).inc(frames)
        log.debug(
            "response.dropped",
            extra={"call_id": self._state.call_id, "response_id": handle.id, "why": reason},
        )

    def _close(self, response_id: str) -> None:
        channel = self._state.channel
        heard = channel.playout.heard_ms(response_id) if channel else 0
        self.response_id, self.open = None, False
        self._steps.try_apply(sev.ResponseFinished(response_id, heard))

    def interrupt(self, why: str = "interrupted", reason: str = "barge_in") -> int | None:
        """Cut the active response at once; the session records how much the caller heard, and
        the agent is told (a :class:`~agents.base.PlaybackCut` with ``reason``)."""
        response_id, channel, session = self.response_id, self._state.channel, self._state.session
        if self._handle is not None and self._handle.id == response_id:
            self._handle.end(why)
        if response_id is None or channel is None or session is None:
            return None
        playout = channel.playout
        generation = playout.generation
        # Stop the audio first (the cut is exact), then make it durable: no frame of the old
        # generation leaves the bridge while the log is written.
        cut = playout.interrupt(max(playout.generation, session.state.playback_generation) + 1)
        self.tell_cut(cut, generation, reason)
        heard = next((c.heard_ms for c in cut if c.response_id == response_id), None)
        if heard is None:
            heard = playout.heard_ms(response_id)
        self.response_id, self.open = None, False
        self._steps.try_apply(sev.ResponseInterrupted(response_id, heard))
        self._lines_cut(cut)
        return heard

    def cut_for_session(self, cut: SessionCut) -> None:
        """The next session step cuts playback itself (an interruption or an ending,
        voicegate/call/cuts.py): cut it here first, record what the caller heard (the
        response's ``response_interrupted``, a line's ``prompt_cut``) and tell the agent (one
        PlaybackCut with ``cut.reason``); the step's own clear then finds nothing left to cut."""
        if cut.response_id is not None and cut.response_id == self.response_id:
            self.interrupt(reason=cut.reason)
            return
        channel, session = self._state.channel, self._state.session
        if channel is None or session is None or channel.playout.playing is None:
            return
        playout = channel.playout
        generation = playout.generation
        cut_now = playout.interrupt(max(generation, session.state.playback_generation) + 1)
        self.tell_cut(cut_now, generation, cut.reason)
        # The session's response, though this call had stopped tracking it: recorded all the
        # same (nothing else would say how much of it was heard).
        heard = next((c.heard_ms for c in cut_now if c.response_id == cut.response_id), None)
        if cut.response_id is not None and heard is not None:
            self._steps.try_apply(sev.ResponseInterrupted(cut.response_id, heard))
        self._lines_cut(cut_now)

    def _lines_cut(self, cut: list[Interrupted]) -> None:
        """Record each of the session's lines a cut ended (the agent is not told: not its)."""
        for one in cut:
            prompt = self._lines.pop(one.response_id, None)
            if prompt is not None:
                self._steps.try_apply(sev.PromptCut(one.response_id, prompt, one.heard_ms))

    def tell_cut(self, cut: list[Interrupted], generation: int, reason: str) -> None:
        """Tell the agent of each of its responses a cut ended (never the session's own lines:
        the agent did not make them)."""
        for one in cut:
            if not one.response_id.startswith("say"):
                self._post(
                    AgentNotice(
                        "PlaybackCut",
                        "",
                        PlaybackCut(
                            one.response_id, generation, one.heard_ms, one.marks_cleared, reason
                        ),
                    )
                )

    def drained(self, response_id: str, heard_ms: int) -> None:
        """The playout sent the last of ``response_id``: the session records it finished."""
        self._lines.pop(response_id, None)  # a line played out: nothing of it is cut any more
        if response_id == self.response_id and not self.open:
            self.response_id = None
            self._steps.try_apply(sev.ResponseFinished(response_id, heard_ms))

    def say(self, prompt: str) -> None:
        """A line the session machine wants the caller to hear (not an agent response)."""
        channel = self._state.channel
        if channel is None or self._state.phase is not CallPhase.ANSWERED:
            return
        self.say_audio(self._services.prompt(prompt, channel.rate), line=prompt)

    def say_audio(self, samples: NDArray[np.int16], line: str | None = None) -> None:
        """Audio of the session's own at the call's rate, queued now: the prompt ``line``, or
        (None) hold audio."""
        channel = self._state.channel
        if channel is None or self._state.phase is not CallPhase.ANSWERED:
            return
        playout = channel.playout
        if self.open and self.response_id is not None:
            # The agent's response in progress ends here: the session speaks now.
            self._end_current("superseded")
            playout.finish(self.response_id)
            self.open = False
        self._says += 1
        say_id = f"say{self._says}"
        if line is not None:
            self._lines[say_id] = line
        playout.begin(say_id, playout.generation)
        playout.admit(say_id, playout.generation, samples)
        playout.finish(say_id)
