"""The agent interface: what a call gives an agent, and what an agent may ask of a call.

One agent object serves one call. The call's own task calls it, one event at a time, so an agent
needs no locks; it must return promptly (no long awaits inside a handler: ask the call to do things
and be told when they are done). Agents never see SIP or pjsua2.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from audio.frame import Frame


@dataclass(frozen=True, slots=True)
class CallContext:
    """What the agent knows about its call. ``caller`` is masked (STYLE.md habit 10)."""

    call_id: str
    called_user: str
    caller: str
    codec: str
    rate: int
    tenant: str = "default"  # whose call this is (config/tenants.py)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What became of a tool request.

    ``outcome``: ``committed``, ``failed`` (the provider refused), ``not_started`` (it never
    happened; nothing was done), ``pending`` (the same request is still in flight), ``refused``
    (voicegate did not send it: unknown tool, no confirmation, side effects frozen, or a key reused
    for another request). An unknown outcome never reaches the agent as a result: the session
    goes to ``needs_human`` and the caller is told what is not known.
    ``duplicate``: the agent asked for an intent it had asked for before; this is the original
    outcome and no second request was sent.
    """

    tool: str
    key: str
    outcome: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class MarkOutcome:
    """How a mark ended: ``played`` (the frame carrying the end of the audio before it left the
    media bridge: the caller heard up to it) or ``cleared`` (its response was cut, or had ended,
    first). Every mark gets exactly one outcome."""

    response_id: str
    mark_id: str
    outcome: str


# Why playback was cut (PlaybackCut.reason): the caller or the agent cut it (``barge_in``,
# ``canceled``), or the session did: an interruption of the call (``media``, ``reinvite``,
# ``transfer``, ``agent_link``), a deadline (``timeout``) or the call ending (``ending``).
CUT_BY_CALLER = ("barge_in", "canceled")
CUT_BY_SESSION = ("media", "reinvite", "transfer", "agent_link", "timeout", "ending")


@dataclass(frozen=True, slots=True)
class PlaybackCut:
    """A response cut before it played out: the caller heard its first ``heard_ms``.

    ``generation`` is the playback generation the response played in (dead from now on);
    ``marks_cleared`` the marks of it the caller never reached (each also gets its own
    ``cleared`` :class:`MarkOutcome`); ``reason`` one of :data:`CUT_BY_CALLER` or
    :data:`CUT_BY_SESSION`."""

    response_id: str
    generation: int
    heard_ms: int
    marks_cleared: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class GateChange:
    """The side-effect gate moved (seed 000): ``state`` is ``open``, ``frozen`` (an interruption:
    no tool runs), ``reconciling`` (outstanding tool calls are being settled) or ``closed`` (the
    session is ending). ``reason`` says why, in words fit for a log: the interruptions, or what
    reconciliation found."""

    state: str
    previous: str
    reason: str


# What a transfer did (TransferUpdate.state), in order: ``started`` (the REFER is going out),
# ``trying`` (a provisional NOTIFY), then one final: ``completed`` (the call ends), ``failed``
# (the target did not answer: the caller stays with the agent) or ``refused`` (not sent at all,
# or the REFER was declined; nothing changed).
TRANSFER_STATES = ("started", "trying", "completed", "failed", "refused")


@dataclass(frozen=True, slots=True)
class TransferUpdate:
    """Progress of a transfer the agent (or anyone) asked for. ``status`` is the SIP status of
    the NOTIFY's sipfrag (RFC 3515 section 2.4.5) or of the REFER's answer, 0 when none; the
    target is never included (it is masked in logs and the agent chose it)."""

    state: str
    status: int = 0
    detail: str = ""


# What happened in an attended transfer's consultation (ConsultEvent.kind), docs/transfer.md:
# ``answered`` (the person took the consult call: you may speak to them), ``said`` (something
# you said to them ended: ``outcome`` played, cleared or failed), ``dtmf`` (they pressed
# ``digit``), ``accepted`` / ``declined`` (their key decided, transfer.consult_complete =
# person: the hand-over goes, or the caller comes back to you).
CONSULT_EVENTS = ("answered", "said", "dtmf", "accepted", "declined")
SAY_OUTCOMES = ("played", "cleared", "failed")


@dataclass(frozen=True, slots=True)
class ConsultEvent:
    """Something of the consultation before an attended transfer's hand-over: ``kind`` one of
    :data:`CONSULT_EVENTS`; ``digit`` with ``dtmf``; ``say_id`` and ``outcome`` (one of
    :data:`SAY_OUTCOMES`) with ``said``; ``detail`` why a say failed."""

    kind: str
    digit: str = ""
    say_id: str = ""
    outcome: str = ""
    detail: str = ""


# Why a response handle is no longer alive (Response.ended): a closed vocabulary, a metric label.
RESPONSE_ENDINGS = ("done", "interrupted", "canceled", "superseded", "ended", "refused")


class Response(Protocol):
    """One response of the agent: a handle to write its audio and marks to.

    A response is alive from :meth:`CallControl.respond` until it is done, cut (the caller barged
    in, the call lost media, :meth:`cancel`), superseded (the agent opened another) or the call
    ends. Audio written to a response that is no longer alive is dropped at admission and counted
    (``voicegate_dead_response_frames_dropped_total{reason}``), never played: a task still
    streaming after a barge-in cannot reach the caller.
    """

    @property
    def id(self) -> str:
        """The response's id, as the session log and the API name it."""
        ...

    @property
    def alive(self) -> bool:
        """Whether audio written now may still be played."""
        ...

    @property
    def ended(self) -> str | None:
        """None while alive, else why not: ``done``, ``interrupted``, ``canceled``,
        ``superseded``, ``ended`` (the call is over) or ``refused`` (the session opened none)."""
        ...

    def play(self, samples: NDArray[np.int16]) -> bool:
        """Queue audio at the call's rate behind what this response has queued; False when the
        response is no longer alive (the audio is dropped)."""
        ...

    def play_prompt(self, name: str) -> bool:
        """Queue a named prompt of the agent's prompt library, resampled to the call's rate."""
        ...

    def mark(self, mark_id: str) -> bool:
        """Place a mark after the audio queued so far; :meth:`Agent.on_mark` reports its outcome.
        On a response no longer alive the mark is reported ``cleared`` at once, and False is
        returned."""
        ...

    def done(self) -> None:
        """No more audio: what is queued plays out, then the response has ended."""

    def cancel(self) -> None:
        """Cut this response now: nothing more of it reaches the caller, and the session records
        how many milliseconds were heard."""


class CallControl(Protocol):
    """What an agent may ask of its call."""

    @property
    def rate(self) -> int:
        """The call's audio rate in Hz (8000 for G.711, 16000 for G.722)."""
        ...

    def respond(self) -> Response:
        """Open a new response, in the current playback generation. A response still open is
        superseded: what it has queued plays out, and it takes no more audio. If the session
        cannot open one now (side effects frozen, the call ending), the handle returned is
        already dead (``ended == "refused"``)."""
        ...

    def hangup(self, reason: str, *, after_playout: bool = True) -> None:
        """End the call (BYE), by default once the queued audio has been heard."""

    def prompt(self, name: str) -> NDArray[np.int16]:
        """The audio :meth:`Response.play_prompt` would queue for ``name``, at the call's rate
        (to play part of a prompt, e.g. from the sentence a false interruption cut)."""
        ...

    def request_tool(
        self, tool: str, arguments: Mapping[str, Any], *, key: str | None = None
    ) -> str:
        """Ask for a tool call; returns its idempotency key at once, the result comes later in
        :meth:`Agent.on_tool_result`. Without ``key`` one is derived from the intent (tool,
        arguments, session, turn), so asking twice for the same thing is answered with the
        original outcome. A tool that needs approval runs only from a caller's key press
        (call this from :meth:`Agent.on_dtmf`)."""
        ...

    def caller_said(
        self,
        text: str,
        grammar: str,
        confidence: float,
        decision: str,
        *,
        reason: str = "",
        sensitive: bool = False,
    ) -> None:
        """Log an utterance your recogniser heard as a ``caller_said`` event: its words, the
        grammar, the recogniser's confidence and your ``decision`` (``accepted``,
        ``confirmed``, ``rejected``, ``reprompted``, ``keypad_offered``; else ValueError).
        Digit runs are masked (all digits with ``sensitive``). ``confirmed`` is the caller's
        spoken yes to a write: the next :meth:`request_tool` counts as approved for a tool with
        ``approval = "caller"``."""

    def transfer(
        self, target: str | None = None, *, mode: str | None = None, complete: str | None = None
    ) -> str | None:
        """Transfer the caller to ``target``, a SIP URI that
        ``transfer.allowed_targets`` allows, or to ``transfer.default_target``. Returns None once
        it is under way, else why it was refused (nothing changed). While it runs, side effects
        are frozen and your response is cut (:meth:`Agent.on_interrupted` with ``transfer``).
        If it succeeds the call ends (:meth:`Agent.on_end` with ``transferred``); if it fails,
        the caller hears "I could not reach a colleague" and stays with you
        (:meth:`Agent.on_resumed` with ``transfer``). ``mode``: ``blind`` (REFER, RFC 3515),
        ``bridge`` (voicegate calls the target and stays in the media path) or ``attended`` (a
        consult leg, then REFER with Replaces); None: ``transfer.default_mode``
        (docs/transfer.md). ``complete`` (attended only): when the caller is handed over,
        overriding ``transfer.consult_complete`` for this transfer: ``after_brief``, ``api``
        (when you, or the control API, call :meth:`consult_complete`) or ``person`` (the
        person's key decides)."""
        ...

    # --- an attended transfer's consultation (docs/transfer.md, "attended") -------------------

    def consult_say(
        self, text: str | None = None, *, prompt: str | None = None, say_id: str = ""
    ) -> str | None:
        """Say ``text`` (synthesised) or play the named ``prompt`` to the person on the consult
        leg, after what they are hearing; the caller on hold hears none of it. Returns None once
        queued, else why not (nothing changed): the consult leg has not answered, the hand-over
        is under way, a bad text or an unknown prompt. Its end comes as
        :meth:`Agent.on_consultation` ``said`` with ``say_id``. With ``consult_complete =
        after_brief`` the hand-over waits until what you said has played."""
        ...

    def consult_complete(self) -> str | None:
        """Hand the caller over to the person now (the REFER with Replaces); None once it goes,
        else why not."""
        ...

    def consult_cancel(self) -> str | None:
        """Call the consultation off: the consult leg is hung up and the caller is back with
        you (:meth:`Agent.on_resumed` with ``transfer``); None once done, else why not."""
        ...

    # --- for an agent that reaches its brain over a link (agents/remote/) ----------------------

    def link_lost(self) -> None:
        """The agent's own link to its brain dropped: the session freezes side effects and cuts
        the response at once, exactly as for lost media, until :meth:`link_restored`."""

    def link_restored(self) -> None:
        """The link is back (resumed): the session reconciles, then opens the gate."""

    def link_failed(self, reason: str) -> None:
        """The link will not come back: the call ends ``failed`` at stage ``agent_link``
        (``needs_human`` with a tool outcome unknown), the caller told first. ``reason`` is
        logged: never put a token or the agent's data in it."""

    @property
    def queued_ms(self) -> int:
        """Milliseconds of response audio waiting to be played (flow control)."""
        ...

    def call_soon(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the call's own task, after what is queued there: how a task of the
        agent's own (a socket reader) asks things of the call. ``work`` must not raise."""


class Agent:
    """Base class for agents; override what you need."""

    def __init__(self, context: CallContext, call: CallControl) -> None:
        self.context = context
        self.call = call

    async def on_start(self) -> None:
        """The call is answered and media flows."""

    async def on_dtmf(self, digit: str) -> None:
        """The caller pressed a key (RFC 2833 or SIP INFO): one of 0-9, *, #, A-D."""

    async def on_audio(self, frame: Frame) -> None:
        """20 ms of caller audio at the agent's rate (``audio.agent_rate``).

        An agent that does not override this gets no frames built for it at all."""

    async def on_interrupted(self, interruption: str) -> None:
        """The call lost something (``media``, ``reinvite``, ``transfer``, ``agent_link``): your
        response was cut and side effects are frozen until the session recovers."""

    async def on_resumed(self, interruptions: str) -> None:
        """The session recovered; continue with a short line, not by replaying the response."""

    async def on_resume_code(self, code: str) -> None:
        """A write of this call started: ``code`` (digits) lets the caller continue the session
        if the call drops and they call back within ``session.callback_window_s``
        (docs/tenants.md, Coming back). Read it out to the caller ("If we get cut off, call
        back and enter ..."); never log it or send it anywhere. By default: nothing (the caller
        who calls back then starts a new session)."""

    async def on_rejoined(self, heard_last: str, results: Sequence[ToolResult]) -> None:
        """Instead of :meth:`on_start`: the caller came back to this session on a new call (a
        call centre sent them back with the session's resume handle, or they called back
        after the call dropped, docs/tenants.md), and the session has reconciled.
        ``heard_last`` is what the caller heard last before they left (``prompt NAME`` or
        ``response ID``); ``results`` are the session's tool calls that have a receipt, read
        back (``duplicate`` True): tell the caller what became of them, never ask for them
        again. A tool call still being reconciled comes later, to :meth:`on_tool_result`. By
        default: :meth:`on_resumed` with ``rejoin``, then :meth:`on_tool_result` for each
        result."""
        await self.on_resumed("rejoin")
        for result in results:
            await self.on_tool_result(result)

    async def on_response_interrupted(self, heard_ms: int) -> None:
        """Your response was cut, whoever cut it (the caller barged in, :meth:`Response.cancel`,
        or the session: lost media, a transfer, a dropped link, the end of the call; the reason
        comes with :meth:`on_playback_cut`): the caller heard its first ``heard_ms``
        milliseconds; truncate what you remember of it to that."""

    async def on_false_interruption(self, heard_ms: int) -> None:
        """Your response was cut by caller audio that did not become a caller turn within
        ``audio.barge_in_false_window_ms`` (noise, a cough, a word to someone else): the caller
        heard its first ``heard_ms`` milliseconds and said nothing to you. Pick up where you were
        (the demo agent repeats the cut sentence from its start) or stay silent."""

    async def on_stop(self) -> None:
        """Stop producing output now: the response in progress was cancelled (an interruption,
        or the call is ending). Audio still sent for it is dropped, never played."""

    async def on_speech_started(self) -> None:
        """The caller started speaking (VAD onset). A response playing may be cut by barge-in."""

    async def on_speech_turn(self, duration_ms: int) -> None:
        """The caller spoke for ``duration_ms`` and stopped: a committed caller turn."""

    async def on_mark(self, mark: MarkOutcome) -> None:
        """A mark has its outcome: played (the caller heard up to it) or cleared."""

    async def on_playback_cut(self, cut: PlaybackCut) -> None:
        """One of your responses was cut, by whatever cut it: barge-in and cancel, and every
        cut the session makes itself (lost media, a transfer, a dropped link, a timeout, the end
        of the call); the current response's cut is also told through
        :meth:`on_response_interrupted`."""

    async def on_gate(self, change: GateChange) -> None:
        """The side-effect gate moved: while it is not ``open`` a tool request is refused."""

    async def on_transfer(self, update: TransferUpdate) -> None:
        """Progress of a transfer of this call (:meth:`CallControl.transfer`)."""

    async def on_consultation(self, event: ConsultEvent) -> None:
        """Something happened in an attended transfer's consultation: the person answered,
        something you said to them ended, they pressed a key, or their key decided."""

    async def on_tool_result(self, result: ToolResult) -> None:
        """A tool request finished, was refused, or was a duplicate."""

    async def on_end(self, reason: str) -> None:
        """The call is over; the control object no longer works."""


AgentFactory = Callable[[CallContext, CallControl], Agent]

# What of an agent voicegate calls: the factory and each handler (a metric label when one fails).
AGENT_CALLS = ("factory", *sorted(n for n in vars(Agent) if n.startswith("on_")))


def takes_audio(agent: Agent) -> bool:
    """Whether ``agent`` overrides :meth:`Agent.on_audio` (else caller frames are not built)."""
    return type(agent).on_audio is not Agent.on_audio
