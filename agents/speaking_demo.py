"""The demo agent with speech: everything the keypad menu does, by voice as well (agent.speech).

What the caller says goes to the process's recognition thread (audio/speech/worker.py), never
decoded on the media clock thread or the event loop; each utterance comes back to the call's own
task (``call.call_soon``), is logged as a ``caller_said`` event, and is acted on only if the
grammar of the current dialog state accepted it and the session heard a caller turn where it was
said (the recogniser's own endpointer hears words in line noise the session rightly ignores); the
agent answers once the caller's turn has ended, not in a pause mid-sentence. A rejection
re-prompts (unless a prompt is already playing), never guesses; on a G.711 call a rejected amount
offers the keypad (spoken amounts through an 8 kHz codec are unreliable: docs/speech.md). A
payment is charged only after the caller confirms it (a spoken yes or key 1), and the
confirmation is in the log before the intent. Dynamic sentences ("You said 59 cents. Shall I
charge it?") are synthesised by espeak-ng and cached; the rest are the recorded prompts. Keys
keep working in every state.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

import numpy as np
from numpy.typing import NDArray

from agents.base import Agent, CallContext, CallControl
from agents.demo import PAYMENT_CURRENCY, PAYMENT_TOOL, DemoAgent, _Mode
from agents.demo_grammars import GRAMMARS, Intent, intent, say_cents
from audio.frame import Frame
from audio.speech.recognizer import Heard
from audio.speech.synth import SynthesisError, Synthesizer
from audio.speech.worker import SpeechStream, shared_thread

log = logging.getLogger("voicegate.agent.demo")

_GRAMMAR_OF = {
    _Mode.MENU: "menu",
    _Mode.AMOUNT: "amount",
    _Mode.CONFIRM: "confirm",
    _Mode.CONFIRM_END: "confirm",
    _Mode.COLLECTING: "digits",
}
_REPROMPT = {
    _Mode.MENU: ("menu", "speech_hint"),
    _Mode.AMOUNT: ("say_amount",),
    _Mode.CONFIRM: ("say_yes_or_no",),
    _Mode.CONFIRM_END: ("confirm_goodbye",),
    _Mode.COLLECTING: ("say_digits",),
}
TURN_SLACK_MS: Final = 500
"""How far an utterance may lie outside the session's caller turn and still be of it: the turn
starts once ``audio.turn_min_speech_ms`` is heard and ends a hangover after the speech, and the
recogniser dates an utterance's end to about 100 ms (audio/speech/recognizer.py)."""
KEPT_TURNS: Final = 4
NO_TURN: Final = "no caller turn: the line's noise, not speech"
_synthesizer = Synthesizer()
# One thread: espeak-ng synthesises one sentence at a time anyway (audio/speech/synth.py).
_synthesis = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voicegate-synth")


class SpeakingDemoAgent(DemoAgent):
    _stream: SpeechStream | None = None
    _mode = _Mode.MENU

    def __init__(self, context: CallContext, call: CallControl) -> None:
        super().__init__(context, call)
        self._loop: asyncio.AbstractEventLoop | None = None
        # Between the caller's speech onset and the end of their turn (VAD), utterances wait:
        # the agent answers when the caller has finished, not in a pause mid-sentence.
        self._speaking = False
        self._pending: list[Heard] = []
        self._dropping = False
        # Where the session's caller turns lie in the audio given to the recogniser (ms of it):
        # pocketsphinx's own endpointer hears "utterances" in line noise that the session's
        # detector rightly ignores (brown noise 10 dB under speech was heard as "hang up", and
        # the call ended), so an utterance counts only if a caller turn was heard where it was.
        self._fed_ms = 0
        self._turn_from: int | None = None
        self._turns: deque[tuple[int, int]] = deque(maxlen=KEPT_TURNS)

    # The dialog state: switching it switches the grammar the caller is heard with.
    @property
    def mode(self) -> _Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: _Mode) -> None:
        self._mode = mode
        grammar = _GRAMMAR_OF.get(mode)
        if self._stream is not None and grammar is not None:
            self._stream.use(grammar)

    async def on_start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._digits: list[str] = []
        self._amount = ""
        self._say("greeting", "menu", "speech_hint")

    async def on_audio(self, frame: Frame) -> None:
        stream = self._stream
        if stream is None:
            stream = self._stream = shared_thread().open(GRAMMARS, frame.rate, self._deliver)
            stream.use(_GRAMMAR_OF.get(self.mode, "menu"))
        if stream.feed(frame.samples):
            # Only audio the recogniser got moves its clock: a dropped frame never reaches it.
            self._fed_ms += len(frame.samples) * 1000 // frame.rate
        elif not self._dropping:
            # The recognition thread is that far behind: recognition loses audio, the call none.
            self._dropping = True
            log.warning("demo.speech_frames_dropped", extra={"call_id": self.context.call_id})

    def _deliver(self, heard: Heard) -> None:
        # On the recognition thread: hand the utterance to the call's own task.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.call.call_soon, lambda: self._on_heard(heard))

    async def on_speech_started(self) -> None:
        # A turn that never ended (a key press cut it, or the session took no turn): what it
        # left waiting is superseded by this one.
        self._drop_pending("superseded")
        self._speaking = True
        self._turn_from = self._fed_ms

    async def on_speech_turn(self, duration_ms: int) -> None:
        # The recogniser's answer, not DemoAgent's menu: act on what was heard in the turn.
        self._speaking = False
        self._end_turn()
        pending = []
        waiting, self._pending = self._pending, []
        for heard in waiting:
            if self._in_a_turn(heard):
                pending.append(heard)
            else:
                self._log(heard, "rejected", NO_TURN)
        if not pending:
            return
        accepted = [h for h in pending if h.accepted]
        chosen = accepted[-1] if accepted else pending[-1]
        for heard in pending:
            if heard is not chosen:
                self._log(heard, "rejected", "superseded")
        self._heard(chosen)

    async def on_dtmf(self, digit: str) -> None:
        # A key answers the prompt: speech still waiting for the end of its turn is superseded.
        self._speaking = False
        self._drop_pending("superseded by a key")
        if self.mode is _Mode.CONFIRM_END:
            # Asked whether to end, the caller is still at the menu: 9 ends, star repeats it.
            self.mode = _Mode.MENU
        await super().on_dtmf(digit)

    async def on_resumed(self, interruptions: str) -> None:
        self._speaking = False
        self._end_turn()
        self._drop_pending("the call was interrupted")
        await super().on_resumed(interruptions)

    def _end_turn(self) -> None:
        if self._turn_from is not None:
            self._turns.append((self._turn_from, self._fed_ms))
            self._turn_from = None

    def _in_a_turn(self, heard: Heard) -> bool:
        """Whether the session heard a caller turn about where ``heard`` was said."""
        start, end = heard.ended_ms - heard.speech_ms, heard.ended_ms
        turns = list(self._turns)
        if self._turn_from is not None:
            turns.append((self._turn_from, self._fed_ms))
        return any(
            start <= t_end + TURN_SLACK_MS and end >= t_start - TURN_SLACK_MS
            for t_start, t_end in turns
        )

    def _drop_pending(self, why: str) -> None:
        pending, self._pending = self._pending, []
        for heard in pending:
            self._log(heard, "rejected", why)

    async def on_end(self, reason: str) -> None:
        if self._stream is not None:
            self._stream.close()

    def _log(self, heard: Heard, decision: str, reason: str = "") -> None:
        self.call.caller_said(
            heard.text, heard.grammar, heard.confidence, decision,
            reason=reason or heard.reason, sensitive=heard.grammar == "digits",
        )  # fmt: skip

    def _on_heard(self, heard: Heard) -> None:
        # On the call's task. While the caller is still talking, wait for the end of the turn.
        if self._speaking:
            self._pending.append(heard)
        elif not self._in_a_turn(heard):
            self._log(heard, "rejected", NO_TURN)
        else:
            self._heard(heard)

    def _heard(self, heard: Heard) -> None:
        try:
            self._act(heard)
        except Exception:  # call_soon work must not raise; the call goes on with keys
            log.exception("demo.speech_failed", extra={"call_id": self.context.call_id})

    def _act(self, heard: Heard) -> None:
        mode = self.mode
        listening = _GRAMMAR_OF.get(mode)
        if listening is None or heard.grammar != listening:
            # Paying, transferring, ending, or an utterance begun under the previous prompt.
            why = "not listening" if listening is None else "said under the previous prompt"
            self._log(heard, "rejected", why)
            return
        if not heard.accepted:
            if self.call.queued_ms > 0:
                # Something is being said to the caller (the re-prompt of a moment ago, as the
                # tail of a long turn comes in): talking over it helps nobody.
                self._log(heard, "rejected", f"{heard.reason}; a prompt is playing")
                return
            if mode is _Mode.AMOUNT and self._narrowband:
                self._log(heard, "keypad_offered")
                self._interrupt_and_say("not_understood", "keypad_amount")
                return
            self._log(heard, "rejected")
            self._interrupt_and_say("not_understood", *_REPROMPT[mode])
            return
        meaning = intent(heard.grammar, heard.text)
        if meaning.kind == "yes":
            self._log(heard, "confirmed")
        else:
            self._log(heard, "accepted")
        if self._response is not None:
            self._response.cancel()
        self._on_intent(mode, meaning)

    @property
    def _narrowband(self) -> bool:
        # The bridge may run at 16 kHz on a G.711 call: what limits recognition is the codec.
        codec = self.context.codec.upper()
        return self.context.rate == 8000 or codec.startswith(("PCMA", "PCMU", "G729", "GSM"))

    def _interrupt_and_say(self, *prompts: str) -> None:
        if self._response is not None:
            self._response.cancel()
        self._say(*prompts)

    def _on_intent(self, mode: _Mode, meaning: Intent) -> None:
        kind = meaning.kind
        if kind == "repeat":
            if mode is _Mode.CONFIRM:
                self._say_confirmation()
            else:
                self._say(*_REPROMPT[mode])
            return
        match mode, kind:
            case _Mode.MENU, "pay":
                self.mode = _Mode.AMOUNT
                self._amount = ""
                self._say("say_amount")
            case _Mode.MENU, "person":
                self._menu("0")
            case _Mode.MENU, "goodbye":
                # Asked first: speech outside the grammar is forced into it, and "Sorry, can I
                # talk to someone?" was heard as "hang up" (score 0.61) inside a real turn.
                self.mode = _Mode.CONFIRM_END
                self._say("confirm_goodbye")
            case _Mode.CONFIRM_END, "yes":
                self._menu("9")
            case _Mode.CONFIRM_END, "no":
                self.mode = _Mode.MENU
                self._say("menu")
            case _Mode.MENU, "digits":
                self.mode = _Mode.COLLECTING
                self._digits = []
                self._say("say_digits")
            case _Mode.AMOUNT, "amount":
                self._amount = meaning.value
                self.mode = _Mode.CONFIRM
                self._say_confirmation()
            case _Mode.CONFIRM, "yes":
                # The caller_said "confirmed" just logged is this request's approval.
                self.mode = _Mode.PAYING
                self._say("payment_processing")
                self.call.request_tool(
                    PAYMENT_TOOL,
                    {
                        "amount_cents": int(self._amount),
                        "currency": PAYMENT_CURRENCY,
                        "account": f"demo-{self.context.call_id[:8]}",
                    },
                )
            case _Mode.AMOUNT | _Mode.CONFIRM | _Mode.COLLECTING, "cancel" | "no":
                if mode is _Mode.COLLECTING:
                    self.mode = _Mode.MENU
                    self._say("menu")
                else:
                    self._cancel_payment()
            case _Mode.COLLECTING, "said_digits":
                self.mode = _Mode.MENU
                self._say("you_entered", *self._digit_prompts(meaning.value))

    def _say_confirmation(self) -> None:
        sentence = f"You said {say_cents(int(self._amount))}. Shall I charge it?"
        response = self._response = self.call.respond()
        rate, amount = self.call.rate, self._amount
        # A new sentence takes 12 to 17 ms to synthesise and resample: on the synthesis thread,
        # not on the event loop that carries every call's frames. The response is open (and can
        # be cut) meanwhile; its audio follows when ready, on the call's own task.
        future = _synthesis.submit(_synthesizer.say, sentence, rate)
        loop = self._loop

        def spoken(done: Future[NDArray[np.int16]]) -> None:
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self.call.call_soon, lambda: finish(done))

        def finish(done: Future[NDArray[np.int16]]) -> None:
            try:
                response.play(done.result())
            except Exception:  # espeak-ng missing or refusing: the recorded prompts instead
                log.warning("demo.synthesis_unavailable", extra={"call_id": self.context.call_id})
                response.play_prompt("you_entered")
                for prompt in self._digit_prompts(amount):
                    response.play_prompt(prompt)
            response.play_prompt("say_yes_or_no")
            response.done()

        future.add_done_callback(spoken)


def speaking_demo(context: CallContext, call: CallControl) -> Agent:
    return SpeakingDemoAgent(context, call)


def build_speech_before_fork(calls: int) -> None:
    """The decoders of ``calls`` calls, built in the pool's fork server (no thread started, no
    subprocess): each worker forked from it shares their models; ``prepare_speech`` then finds
    them built."""
    shared_thread().build_spares(GRAMMARS, calls)


def prepare_speech(calls: int) -> None:
    """Build the decoders of ``calls`` calls and load espeak-ng now, before calls arrive."""
    shared_thread().prepare(GRAMMARS, calls)
    try:
        _synthesizer.say("Hello.", 16000)
    except SynthesisError:
        log.warning("demo.synthesis_unavailable")
