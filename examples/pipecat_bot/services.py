"""The bot's offline Pipecat services, in one place for the bot's wiring to import.

- :class:`PocketsphinxSTTService` (``stt.py``): pocketsphinx on a small grammar, per segment.
- :class:`EspeakTTSService` (``tts.py``): espeak-ng in process, optionally paced.
- :class:`RulesLLMService` (``rules_llm.py``): rules instead of a model, with Pipecat's real
  function calling; :data:`TOOLS` are the function schemas (the same context works with
  ``OpenAILLMService``), :func:`account_balance` the read-only tool's handler, and
  :func:`user_turn_strategies` the user aggregator's turn strategies (how a DTMF key becomes a
  user turn is told in ``rules_llm.py``).

Nothing here downloads anything: pocketsphinx's model ships in its wheel and espeak-ng is a
system library.
"""

from examples.pipecat_bot.rules_llm import (
    CHARGE_ARGUMENTS,
    GREETING,
    STORY,
    TOOLS,
    Reply,
    RulesLLMService,
    account_balance,
    decide,
    user_turn_strategies,
)
from examples.pipecat_bot.stt import GRAMMAR, PocketsphinxSTTService, Recognition, recognise
from examples.pipecat_bot.tts import EspeakTTSService, speech

__all__ = [
    "CHARGE_ARGUMENTS",
    "GRAMMAR",
    "GREETING",
    "STORY",
    "TOOLS",
    "EspeakTTSService",
    "PocketsphinxSTTService",
    "Recognition",
    "Reply",
    "RulesLLMService",
    "account_balance",
    "decide",
    "recognise",
    "speech",
    "user_turn_strategies",
]
