"""``RulesLLMService``: a rule-based stand-in for an LLM, a real Pipecat ``LLMService``.

It answers the ``LLMContextFrame`` the user aggregator pushes the way a real one does
(``LLMFullResponseStartFrame``, ``LLMTextFrame``, ``LLMFullResponseEndFrame``) and asks for tools
through ``run_function_calls``, so Pipecat's own function-calling machinery runs: the handlers
registered with ``register_function`` get ``FunctionCallParams``, their ``result_callback``
result is written into the ``LLMContext`` by the assistant aggregator (the call, then its
``tool`` message), and the context comes back to this service for the answer. Swapping this line
for ``OpenAILLMService(...)`` with the same context and :data:`TOOLS` gives the same flow.

The rules read the context's LAST message (:func:`decide`):

- only system messages (the conversation starts, after an ``LLMRunFrame``): the greeting;
- the user said "pay" or pressed 1: call ``charge`` (five euros); the result is said next;
- "balance": call ``account_balance`` (read-only, :func:`account_balance`), then say it;
- "story" or 5: a long answer; "person" or 0: ``transfer_to_person``; "goodbye" or 9:
  ``end_call`` (the bot's wiring says goodbye and hangs up in its handler);
- a ``tool`` message: the outcome of ``charge`` or the balance; nothing for the others;
- anything else: "I heard: <text>. ...".

How a key reaches the rules (Pipecat 1.14): the transport pushes ``InputDTMFFrame``; Pipecat's
``DTMFAggregator`` (``pipecat.processors.aggregators.dtmf_aggregator``, placed before the user
aggregator) collects keys until ``#`` or ``timeout`` seconds without one and pushes a
``TranscriptionFrame`` "DTMF: 1" (keys joined, "DTMF: 12#"); it also broadcasts an interruption
on the first key. The user aggregator treats it like speech, so its turn strategies must open a
turn on a transcription (``TranscriptionUserTurnStartStrategy``: a key comes with no
``UserStartedSpeakingFrame``); :func:`user_turn_strategies` gives the set this bot needs. The
rules take the first key of "DTMF: ..." text, or a bare key, or one spoken digit ("one").
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.adapters.llm.services.open_ai_adapter import OpenAILLMAdapter
from pipecat.frames.frames import (
    Frame,
    FunctionCallFromLLM,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
)
from pipecat.processors.aggregators.llm_context import (
    LLMContext,
    LLMContextMessage,
    LLMSpecificMessage,
    standard_message_text,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.settings import LLMSettings
from pipecat.turns.user_start import (
    ExternalUserTurnStartStrategy,
    TranscriptionUserTurnStartStrategy,
)
from pipecat.turns.user_stop import ExternalUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies

from examples.pipecat_bot.stt import DIGITS

GREETING = (
    "Hello, this is the voicegate Pipecat example. Say pay, or press 1, to pay five euros. "
    "Say balance to hear your balance. Press 9 to hang up."
)
STORY = (
    "Once upon a time, a small voice server answered the phone in a quiet data centre. "
    "Every caller who rang was greeted, heard and answered, even when the network stumbled "
    "and a worker had to be restarted in the middle of the night. "
    "One evening a caller asked for a story, and the server, which knew only a few words, "
    "told the only story it knew: its own. "
    "It spoke of packets that arrived late, of payments that were never charged twice, "
    "and of the engineers who wrote every rule down so nothing would be forgotten. "
    "And when the story ended, the caller said goodbye, and the line went quiet again."
)
MENU = "Say pay, balance, story, or goodbye."
PAID = "The payment of five euros went through."
NOT_PAID = "The payment did not go through."

CHARGE_ARGUMENTS: Mapping[str, Any] = {
    "amount_cents": 500,
    "currency": "EUR",
    "account": "pipecat-example",
}

TOOLS = ToolsSchema(
    standard_tools=[
        FunctionSchema(
            name="charge",
            description="Charge the caller's account. Ask before calling it.",
            properties={
                "amount_cents": {"type": "integer", "description": "Amount in cents, above 0."},
                "currency": {"type": "string", "enum": ["EUR"]},
                "account": {"type": "string", "description": "The account to charge."},
            },
            required=["amount_cents", "currency", "account"],
        ),
        FunctionSchema(
            name="account_balance",
            description="The caller's account balance, in cents. Read-only.",
            properties={},
            required=[],
        ),
        FunctionSchema(
            name="transfer_to_person",
            description="Transfer the call to a person.",
            properties={},
            required=[],
        ),
        FunctionSchema(
            name="end_call",
            description="Say goodbye and hang up.",
            properties={},
            required=[],
        ),
    ]
)

_KEYS = frozenset("0123456789*#")
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True, slots=True)
class Reply:
    """What the rules decided: text to say (may be empty) and function calls to make."""

    text: str = ""
    calls: tuple[tuple[str, Mapping[str, Any]], ...] = field(default=())


async def account_balance(params: FunctionCallParams) -> None:
    """The ``account_balance`` handler: read-only, it stays inside Pipecat (register it with
    ``llm.register_function("account_balance", account_balance)``)."""
    await params.result_callback({"balance_cents": 1250, "currency": "EUR"})


def user_turn_strategies() -> UserTurnStrategies:
    """The user aggregator's turn strategies for this bot: turns are started and stopped by the
    transport's ``UserStarted/StoppedSpeakingFrame`` (no Pipecat VAD), and a transcription with no
    turn open (a DTMF key from ``DTMFAggregator``) opens one, ended once no more text comes."""
    return UserTurnStrategies(
        start=[ExternalUserTurnStartStrategy(), TranscriptionUserTurnStartStrategy()],
        stop=[ExternalUserTurnStopStrategy()],
    )


def decide(messages: Sequence[LLMContextMessage]) -> Reply:
    """The reply to a conversation, from its last message (see the module docstring)."""
    said = [m for m in messages if _role(m) not in ("system", "developer")]
    if not said:
        return Reply(GREETING)
    last = said[-1]
    role = _role(last)
    if role == "tool":
        return _after_tool(last, messages)
    if role != "user":
        return Reply(MENU)
    text = " ".join(standard_message_text(last).split())
    words = _WORD.findall(text.lower())
    key = _key(text, words)
    if "goodbye" in words or key == "9":
        return Reply(calls=(("end_call", {}),))
    if "pay" in words or key == "1":
        return Reply(calls=(("charge", CHARGE_ARGUMENTS),))
    if "balance" in words:
        return Reply(calls=(("account_balance", {}),))
    if "person" in words or key == "0":
        return Reply(calls=(("transfer_to_person", {}),))
    if "story" in words or key == "5":
        return Reply(STORY)
    return Reply(f"I heard: {text}. {MENU}")


def _role(message: LLMContextMessage) -> str:
    return str(_fields(message).get("role", ""))


def _key(text: str, words: list[str]) -> str | None:
    """The key pressed: "DTMF: 1" (DTMFAggregator's text, first key), "1", or one spoken digit."""
    keys = text.strip()
    if keys.upper().startswith("DTMF:"):
        keys = keys[len("DTMF:") :].strip()
    if keys and set(keys) <= _KEYS:
        return keys[0]
    if len(words) == 1 and words[0] in DIGITS:
        return str(DIGITS.index(words[0]))
    return None


def _fields(message: LLMContextMessage) -> Mapping[str, Any]:
    """A standard message's fields (OpenAI's typed dicts, read loosely); none for another LLM's."""
    return {} if isinstance(message, LLMSpecificMessage) else cast(Mapping[str, Any], message)


def _after_tool(message: LLMContextMessage, messages: Sequence[LLMContextMessage]) -> Reply:
    fields = _fields(message)
    name = _function_name(str(fields.get("tool_call_id")), messages)
    content = fields.get("content")
    if content == "IN_PROGRESS":  # the assistant aggregator's placeholder: the result is coming
        return Reply()
    result = _result(content)
    if name == "charge":
        return Reply(PAID if result.get("outcome") == "committed" else NOT_PAID)
    if name == "account_balance":
        cents = result.get("balance_cents")
        if isinstance(cents, int):
            euros, rest = divmod(cents, 100)
            return Reply(f"Your balance is {euros} euros and {rest} cents.")
        return Reply("I could not read your balance.")
    return Reply()  # transfer_to_person, end_call: the bot's wiring speaks for them


def _function_name(call_id: str, messages: Sequence[LLMContextMessage]) -> str:
    for message in reversed(messages):
        calls: Sequence[Mapping[str, Any]] = _fields(message).get("tool_calls") or ()
        for call in calls:
            if call.get("id") == call_id:
                return str(call.get("function", {}).get("name", ""))
    return ""


def _result(content: object) -> dict[str, Any]:
    """A tool result as the aggregator stored it (a JSON string) or as a dict."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except json.JSONDecodeError:
            return {}
    return dict(content) if isinstance(content, dict) else {}


class RulesLLMService(LLMService[OpenAILLMAdapter]):
    """The rules as a Pipecat LLM service: ``LLMService`` keyword arguments only (e.g.
    ``function_call_timeout_secs``). Register handlers as with any LLM service."""

    adapter_class = OpenAILLMAdapter  # the context holds OpenAI-format messages

    def __init__(self, **kwargs: Any) -> None:
        # Every settings field set (None: not applicable), or Pipecat logs an error at start.
        kwargs.setdefault(
            "settings",
            LLMSettings(
                model="rules",
                system_instruction=None,
                temperature=None,
                max_tokens=None,
                top_p=None,
                top_k=None,
                frequency_penalty=None,
                presence_penalty=None,
                seed=None,
                filter_incomplete_user_turns=False,
                user_turn_completion_config=None,
            ),
        )
        super().__init__(**kwargs)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame):
            await self.push_frame(LLMFullResponseStartFrame())
            try:
                await self._respond(frame.context)
            finally:
                await self.push_frame(LLMFullResponseEndFrame())
        else:
            await self.push_frame(frame, direction)

    async def _respond(self, context: LLMContext) -> None:
        reply = decide(context.get_messages())
        if reply.text:
            await self._push_llm_text(reply.text)
        if reply.calls:
            await self.run_function_calls(
                [
                    FunctionCallFromLLM(
                        function_name=name,
                        tool_call_id=uuid.uuid4().hex,
                        arguments=dict(arguments),
                        context=context,
                    )
                    for name, arguments in reply.calls
                ]
            )

    async def run_inference(
        self,
        context: LLMContext,
        max_tokens: int | None = None,
        system_instruction: str | None = None,
        response_schema: dict[str, Any] | None = None,
    ) -> str | None:
        """The text the rules would say (function calls are not made out of band)."""
        return decide(context.get_messages()).text or None
