"""What a live call needs from the process around it (voicegate/runtime.py provides it)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from audio.barge_in import BargeInConfig
from audio.vad import VadConfig
from config.settings import TransferSettings
from session import effects as fx
from session.store.reader import StoreReader
from session.store.writer import StoreWriter
from telephony import events as ev
from voicegate.call.callback_keys import CallbackKeys
from voicegate.observe.metrics import Metrics
from voicegate.tools.call_tools import ToolServices


class CallServices(ToolServices, Protocol):
    """What a live call needs from the process around it."""

    # Reads and writes leave the event loop: no store object is used on it.
    reader: StoreReader
    writer: StoreWriter
    metrics: Metrics
    answer_after_s: float
    owner: str
    resume_ttl_s: float
    # The installation's keyed digests for callbacks; None with session.callback_window_s 0.
    callback_keys: CallbackKeys | None

    def transfer_for(self, tenant: str) -> TransferSettings:
        """The transfer settings of ``tenant`` (config/tenants.py)."""
        ...

    def submit(self, command: ev.SipCommand) -> None: ...

    def prompt(self, name: str, rate: int) -> NDArray[np.int16]: ...

    def policy(self, tenant: str) -> dict[str, float]: ...

    def caller_key(self, offer: ev.CallOffered) -> str:
        """The keyed digest a new session keeps of its caller's number ("": none, or off)."""
        ...

    def audio_settings(self) -> tuple[int, VadConfig, BargeInConfig]: ...

    def record_effects(self, effects: list[fx.Effect]) -> None: ...

    def quicken_media_tick(self) -> None:
        """A caller may be starting to talk over a response: take the next frames at
        ``audio.barge_in_tick_ms`` instead of ``audio.tick_ms``."""
        ...

    def free_slots(self) -> int:
        """Call slots of this worker nobody holds (live calls and their bridge legs count)."""
        ...

    def adopt_leg(self, leg_id: str, call_id: str) -> None:
        """Route the SIP events of ``leg_id`` (a bridge's leg) to call ``call_id``."""
        ...
