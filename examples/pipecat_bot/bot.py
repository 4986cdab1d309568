"""The example bot's pipeline: what a Pipecat user writes, with voicegate as the transport.

Everything but the transport line and the turn strategy is ordinary Pipecat: an STT, a context
with tools, an LLM, a TTS and the context aggregators. Here they are offline stand-ins
(services.py); with keys, the same pipeline runs with a real LLM and TTS (README.md).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    FunctionCallResultProperties,
    LLMRunFrame,
    TTSSpeakFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.dtmf_aggregator import DTMFAggregator
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.services.llm_service import FunctionCallParams
from pipecat.workers.runner import WorkerRunner

from examples.pipecat_bot.services import (
    TOOLS,
    EspeakTTSService,
    PocketsphinxSTTService,
    RulesLLMService,
    account_balance,
    user_turn_strategies,
)
from integrations.pipecat import CallInfo, VoicegateTransport, register_tool

log = logging.getLogger("pipecat_bot")

SYSTEM = (
    "You are the voice of a small shop on the phone. Keep answers short. To take a payment "
    "call charge; to read the balance call account_balance; for a person call "
    "transfer_to_person; when the caller says goodbye call end_call."
)


async def run_bot(transport: VoicegateTransport, *, tts_pace: float | None = None) -> None:
    """One call: the pipeline runs until the call ends (voicegate says so, or the bot hangs up)."""
    stt = PocketsphinxSTTService()
    llm = RulesLLMService()
    tts = EspeakTTSService(pace=tts_pace)
    context = LLMContext(messages=[{"role": "system", "content": SYSTEM}], tools=TOOLS)
    # voicegate decides when the caller speaks (its detector at the media edge, measured on real
    # lines): the aggregators take its turns rather than running a VAD of their own; a key
    # (DTMFAggregator's transcription) opens a turn too.
    aggregators = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(user_turn_strategies=user_turn_strategies())
    )
    pipeline = Pipeline(
        [
            transport.input(),
            DTMFAggregator(timeout=0.3),  # a one-key menu: no need to wait for #
            stt,
            aggregators.user(),
            llm,
            tts,
            transport.output(),
            aggregators.assistant(),
        ]
    )
    task = PipelineWorker(
        pipeline,
        params=PipelineParams(
            audio_in_sample_rate=transport.rate, audio_out_sample_rate=transport.rate
        ),
        # voicegate owns the call's deadlines (session.max_duration_s, the caller's silence).
        cancel_on_idle_timeout=False,
        enable_rtvi=False,
    )

    # A side effect: voicegate runs it, once, by idempotency key, and answers once.
    register_tool(llm, transport, "charge")
    # Read-only: stays in the bot.
    llm.register_function("account_balance", account_balance)

    async def transfer_to_person(params: FunctionCallParams) -> None:
        await params.result_callback(
            {"status": "transferring"}, properties=FunctionCallResultProperties(run_llm=False)
        )
        await transport.transfer()

    async def end_call(params: FunctionCallParams) -> None:
        await params.result_callback(
            {"status": "ending"}, properties=FunctionCallResultProperties(run_llm=False)
        )
        # The goodbye plays out, then voicegate hangs up (the EndFrame is the bot's hang-up).
        await task.queue_frames([TTSSpeakFrame("Goodbye, and thank you for calling."), EndFrame()])

    llm.register_function("transfer_to_person", transfer_to_person)
    llm.register_function("end_call", end_call)

    @transport.event_handler("on_client_connected")  # type: ignore[untyped-decorator]
    async def greet(_: VoicegateTransport, info: CallInfo) -> None:
        if info.rejoined is not None:
            # Sent back by the call centre this bot transferred them to (a new call).
            await task.queue_frames([TTSSpeakFrame("Welcome back. How can I help?")])
        elif info.resumed:
            # The call was under way when this bot lost it (voicegate says what was heard
            # last): pick it up, do not greet again.
            await task.queue_frames([TTSSpeakFrame("Sorry, I lost you for a moment. Go on.")])
        else:
            await task.queue_frames([LLMRunFrame()])

    @transport.event_handler("on_client_disconnected")  # type: ignore[untyped-decorator]
    async def gone(_: VoicegateTransport, reason: str) -> None:
        await task.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)
    await runner.run()
    # What the LLM was left with: the tests read it (one charge result, what was heard).
    log.info(
        "pipecat_bot.context %s",
        json.dumps({"session_id": transport.info.session_id, "messages": _plain(context)}),
    )


def _plain(context: LLMContext) -> list[Any]:
    return [m for m in context.get_messages() if isinstance(m, dict)]
