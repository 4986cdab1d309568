"""A Pipecat transport and serializer for voicegate's remote-agent protocol (docs/pipecat.md).

A bot built for Pipecat answers voicegate's calls by taking its transport from
``VoicegateServer``; the pipeline (STT, LLM, TTS, context aggregators) stays as it is.
"""

from integrations.pipecat.frames import VoicegateMessageFrame, VoicegateResponseCutFrame
from integrations.pipecat.link import verify_token
from integrations.pipecat.serializer import VoicegateFrameSerializer
from integrations.pipecat.server import VoicegateServer
from integrations.pipecat.tools import register_tool
from integrations.pipecat.transport import CallInfo, VoicegateParams, VoicegateTransport

__all__ = [
    "CallInfo",
    "VoicegateFrameSerializer",
    "VoicegateMessageFrame",
    "VoicegateParams",
    "VoicegateResponseCutFrame",
    "VoicegateServer",
    "VoicegateTransport",
    "register_tool",
    "verify_token",
]
