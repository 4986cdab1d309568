"""The Pipecat bot's offline services in real Pipecat 1.14 pipelines (no mocks of Pipecat):
espeak-ng TTS (and its pace), pocketsphinx STT on segments delimited by the transport's turn
frames, and the rules LLM with Pipecat's context aggregators and function calling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest
from pipecat.audio.dtmf.types import KeypadEntry
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    FunctionCallResultFrame,
    InputAudioRawFrame,
    InputDTMFFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.dtmf_aggregator import DTMFAggregator
from pipecat.processors.aggregators.llm_context import LLMContext, LLMContextMessage
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.utils.time import time_now_iso8601
from pipecat.workers.runner import WorkerRunner

from examples.pipecat_bot.services import (
    CHARGE_ARGUMENTS,
    GREETING,
    STORY,
    TOOLS,
    EspeakTTSService,
    PocketsphinxSTTService,
    Reply,
    RulesLLMService,
    account_balance,
    decide,
    speech,
    user_turn_strategies,
)

WAIT_S = 20.0  # bound on any wait for the pipeline: generous for a loaded 2-core machine


@dataclass
class Seen:
    """Frames that reached the end of the pipeline (downstream), with the loop time of each."""

    frames: list[tuple[float, Frame]] = field(default_factory=list)

    def of(self, kind: type[Frame]) -> list[Frame]:
        return [f for _, f in self.frames if isinstance(f, kind)]


class Recorder(FrameProcessor):
    def __init__(self, seen: Seen) -> None:
        super().__init__()
        self._seen = seen

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.DOWNSTREAM:
            self._seen.frames.append((asyncio.get_running_loop().time(), frame))
        await self.push_frame(frame, direction)


@asynccontextmanager
async def running(
    processors: Sequence[FrameProcessor], rate: int = 8000
) -> AsyncIterator[tuple[PipelineWorker, Seen]]:
    """A pipeline of ``processors`` then a recorder, started; ended (EndFrame) on exit."""
    seen = Seen()
    worker = PipelineWorker(
        Pipeline([*processors, Recorder(seen)]),
        params=PipelineParams(audio_in_sample_rate=rate, audio_out_sample_rate=rate),
        cancel_on_idle_timeout=False,
        enable_rtvi=False,
    )
    started = asyncio.Event()

    async def _started(_worker: PipelineWorker, _frame: Frame) -> None:
        started.set()

    worker.add_event_handler("on_pipeline_started", _started)

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(started.wait(), WAIT_S)
        yield worker, seen
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(run, WAIT_S)
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.02)


# --- TTS ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [8000, 16000])
async def test_a_speak_frame_is_one_turn_of_audio_at_the_pipeline_rate(rate: int) -> None:
    async with running([EspeakTTSService()], rate) as (worker, seen):
        await worker.queue_frame(TTSSpeakFrame("Say pay, balance, story, or goodbye."))
        await until(lambda: bool(seen.of(TTSStoppedFrame)), "TTSStoppedFrame")
    kinds = [type(f) for _, f in seen.frames if isinstance(f, (TTSStartedFrame, TTSStoppedFrame))]
    assert kinds == [TTSStartedFrame, TTSStoppedFrame]
    audio = [f for f in seen.of(TTSAudioRawFrame) if isinstance(f, TTSAudioRawFrame)]
    assert audio and {f.sample_rate for f in audio} == {rate}
    seconds = sum(len(f.audio) // 2 for f in audio) / rate
    assert 1.5 < seconds < 5.0, seconds  # eight words at 160 a minute
    order = [f for _, f in seen.frames]
    started = order.index(seen.of(TTSStartedFrame)[0])
    stopped = order.index(seen.of(TTSStoppedFrame)[0])
    assert all(started < order.index(f) < stopped for f in audio)
    assert [f.text for f in seen.of(TTSTextFrame) if isinstance(f, TTSTextFrame)] == [
        "Say pay, balance, story, or goodbye."
    ]


async def test_a_paced_tts_streams_its_audio_no_faster_than_its_pace() -> None:
    async with running([EspeakTTSService(pace=0.5)]) as (worker, seen):
        await worker.queue_frame(TTSSpeakFrame("Say pay, balance, story, or goodbye."))
        await until(lambda: bool(seen.of(TTSStoppedFrame)), "TTSStoppedFrame")
    arrivals = [t for t, f in seen.frames if isinstance(f, TTSAudioRawFrame)]
    audio = [f for f in seen.of(TTSAudioRawFrame) if isinstance(f, TTSAudioRawFrame)]
    seconds = sum(len(f.audio) // 2 for f in audio) / 8000
    assert len(audio) > 25  # small chunks, so a cut can land between them
    # Half real time: the last chunk is due at 0.5 x (duration - one chunk). Only a lower
    # bound: a loaded machine makes it slower, never faster.
    assert arrivals[-1] - arrivals[0] >= 0.45 * seconds - 0.1


# --- STT ------------------------------------------------------------------------------------


def _caller_turn(text: str, rate: int = 8000) -> list[Frame]:
    """``text`` said by espeak-ng, as the transport would push it: 20 ms frames between the
    user's started/stopped speaking frames, a little silence either side of the speech."""
    silence = np.zeros(rate // 5, dtype=np.int16)
    audio = np.concatenate((silence, speech(text, rate), silence))
    size = rate // 50
    frames: list[Frame] = [UserStartedSpeakingFrame()]
    for start in range(0, len(audio) - size + 1, size):
        chunk = audio[start : start + size].tobytes()
        frames.append(InputAudioRawFrame(audio=chunk, sample_rate=rate, num_channels=1))
    frames.append(UserStoppedSpeakingFrame())
    return frames


async def test_speech_between_the_turn_frames_is_transcribed() -> None:
    async with running([PocketsphinxSTTService()]) as (worker, seen):
        await worker.queue_frames(_caller_turn("pay five euros"))
        await until(lambda: bool(seen.of(TranscriptionFrame)), "a transcription")
    (heard,) = seen.of(TranscriptionFrame)
    assert isinstance(heard, TranscriptionFrame)
    assert "pay" in heard.text.split()
    assert heard.user_id == "caller" and heard.finalized
    # The audio went on down the pipeline too (a recorder or the LLM may want it).
    assert len(seen.of(InputAudioRawFrame)) > 50


async def test_audio_outside_a_turn_is_not_transcribed() -> None:
    # Speech with no turn frames around it, then more than the second of audio the service
    # keeps from before a turn starts (Pipecat's pre-roll, for a late start), then a turn.
    untold = _caller_turn("goodbye")[1:-1]
    gap = np.zeros(8000 * 3 // 2, dtype=np.int16).tobytes()
    quiet = [
        InputAudioRawFrame(audio=gap[i : i + 320], sample_rate=8000, num_channels=1)
        for i in range(0, len(gap), 320)
    ]
    async with running([PocketsphinxSTTService()]) as (worker, seen):
        await worker.queue_frames([*untold, *quiet])
        await worker.queue_frames(_caller_turn("balance"))
        await until(lambda: bool(seen.of(TranscriptionFrame)), "a transcription")
    assert [f.text for f in seen.of(TranscriptionFrame) if isinstance(f, TranscriptionFrame)] == [
        "balance"
    ]


# --- rules LLM ------------------------------------------------------------------------------


Handler = Callable[[FunctionCallParams], Awaitable[None]]


@asynccontextmanager
async def conversation(
    handlers: dict[str, Handler], *, dtmf: bool = False
) -> AsyncIterator[tuple[PipelineWorker, Seen, LLMContext]]:
    """user aggregator -> rules LLM -> assistant aggregator, on one context with TOOLS."""
    system: LLMContextMessage = {"role": "system", "content": "You are a phone bot."}
    context = LLMContext([system], tools=TOOLS)
    pair = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(user_turn_strategies=user_turn_strategies())
    )
    llm = RulesLLMService()
    for name, handler in handlers.items():
        llm.register_function(name, handler)
    first: list[FrameProcessor] = [DTMFAggregator(timeout=0.2)] if dtmf else []
    # The assistant aggregator consumes the LLM's text: what the LLM said is seen before it.
    said = Seen()
    async with running([*first, pair.user(), llm, Recorder(said), pair.assistant()]) as (
        worker,
        _,
    ):
        yield worker, said, context


def _plain(context: LLMContext) -> list[dict[str, Any]]:
    """The context's messages as the plain dicts they are at run time."""
    return [cast(dict[str, Any], m) for m in context.get_messages() if isinstance(m, dict)]


def _said(seen: Seen) -> str:
    return "".join(f.text for f in seen.of(LLMTextFrame) if isinstance(f, LLMTextFrame))


def _user_says(text: str) -> list[Frame]:
    return [
        UserStartedSpeakingFrame(),
        UserStoppedSpeakingFrame(),
        TranscriptionFrame(text=text, user_id="caller", timestamp=time_now_iso8601()),
    ]


async def test_the_conversation_starts_with_the_greeting() -> None:
    async with conversation({}) as (worker, seen, _):
        await worker.queue_frame(LLMRunFrame())
        await until(lambda: bool(seen.of(LLMFullResponseEndFrame)), "a response")
    assert _said(seen) == GREETING
    assert not seen.of(FunctionCallResultFrame)


async def test_pay_charges_once_and_the_result_is_in_the_context_once_then_said() -> None:
    calls: list[FunctionCallParams] = []
    result = {"outcome": "committed", "detail": {"payment_id": "p-1"}}

    async def charge(params: FunctionCallParams) -> None:
        calls.append(params)
        await params.result_callback(result)

    async with conversation({"charge": charge}) as (worker, seen, context):
        await worker.queue_frames(_user_says("pay"))
        await until(lambda: "went through" in _said(seen), "the payment's outcome said")
        await asyncio.sleep(0.3)  # a second charge or answer would show up by now
    assert len(calls) == 1
    assert calls[0].arguments == CHARGE_ARGUMENTS
    assert len(calls[0].tool_call_id) == 32  # uuid4().hex
    messages = _plain(context)
    tool = [m for m in messages if m.get("role") == "tool"]
    assert len(tool) == 1
    assert tool[0]["tool_call_id"] == calls[0].tool_call_id
    assert json.loads(tool[0]["content"]) == result
    assert _said(seen) == "The payment of five euros went through."
    roles = [m.get("role") for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]


async def test_balance_calls_the_read_only_tool_and_says_it() -> None:
    async with conversation({"account_balance": account_balance}) as (worker, seen, context):
        await worker.queue_frames(_user_says("what is my balance"))
        await until(lambda: "balance is" in _said(seen), "the balance said")
    assert _said(seen) == "Your balance is 12 euros and 50 cents."
    calls = [c["function"]["name"] for m in _plain(context) for c in m.get("tool_calls") or ()]
    assert calls == ["account_balance"]


async def test_a_key_reaches_the_rules_through_pipecats_dtmf_aggregator() -> None:
    names: list[str] = []

    async def record(params: FunctionCallParams) -> None:
        names.append(params.function_name)
        await params.result_callback({"outcome": "declined"})

    async with conversation({"charge": record}, dtmf=True) as (worker, seen, context):
        await worker.queue_frame(InputDTMFFrame(button=KeypadEntry.ONE))
        await until(lambda: "did not go through" in _said(seen), "the refusal said")
    assert names == ["charge"]
    users = [m.get("content") for m in _plain(context)]
    assert "DTMF: 1" in users


@pytest.mark.parametrize(
    ("said", "call"),
    [
        ("goodbye", "end_call"),
        ("DTMF: 9", "end_call"),
        ("talk to a person", "transfer_to_person"),
        ("0", "transfer_to_person"),
        ("pay five euros", "charge"),
        ("one", "charge"),
    ],
)
def test_the_rules_call_the_function_the_caller_asked_for(said: str, call: str) -> None:
    reply = decide([{"role": "system", "content": "x"}, {"role": "user", "content": said}])
    assert [name for name, _ in reply.calls] == [call]


def test_a_story_is_long_and_anything_else_is_echoed() -> None:
    story = decide([{"role": "user", "content": "tell me a story"}])
    assert story.text == STORY and not story.calls
    assert len(speech(GREETING, 8000)) > 2 * 8000
    story_s = sum(len(speech(part, 8000)) for part in STORY.split(". ")) / 8000
    assert story_s > 15.0, story_s
    other = decide([{"role": "user", "content": "yes"}])
    assert other.text == "I heard: yes. Say pay, balance, story, or goodbye."


def test_a_tool_result_given_as_a_dict_is_read_too() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "pay"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "charge", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": {"outcome": "committed"}},
    ]
    assert decide(messages).text == "The payment of five euros went through."
    messages[-1]["content"] = json.dumps({"outcome": "failed"})
    assert decide(messages).text == "The payment did not go through."
    messages[-1]["content"] = "IN_PROGRESS"  # the rules ran before the result came: wait for it
    assert decide(messages) == Reply()
