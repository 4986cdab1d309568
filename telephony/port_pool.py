"""The media ports calls borrow: created on demand, kept a moment after a call ends, then reused.

Every port runs at the conference bridge's rate (``media.clock_rate``), so any free port serves
any call. Used on the SIP thread only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from audio.playout import Playout
from audio.vad import VadConfig
from telephony.c_media_port import (
    BridgeError,
    CMediaPort,
    CPortLibrary,
    CPortUnavailable,
    detector_config,
    self_test,
)
from telephony.frame_copy import Copier
from telephony.media_bridge import MediaBridge, MediaChannel
from telephony.thread_state import ThreadStatePins

log = logging.getLogger("voicegate.sip")

# Media ports of ended calls are kept this long after DISCONNECTED: the media clock thread may
# still call them back during the current tick (notes: "Lifetimes and the GIL").
GRAVEYARD_S = 2.0

# A port on the bridge: pjsua2's Python port, or the C one (telephony.c_media_port).
MediaPort = MediaBridge | CMediaPort


class PortPool:
    """Borrow a port for a call, detach it when the call ends, recycle it once it is quiet."""

    def __init__(
        self,
        rate: int,
        playout_max_ms: int,
        thread_states: ThreadStatePins,
        vad: VadConfig | None = None,
    ) -> None:
        self.rate = rate
        # C ports run the caller's frames through the C evidence detector with this.
        self._vad = vad
        self._playout_max_ms = playout_max_ms
        # Chosen once the library runs (telephony.frame_copy checks it against pjsua2's vectors).
        self.copier: Copier | None = None
        self._thread_states = thread_states
        # Ports of ended calls wait here a moment, then go back to the free pool.
        self.graveyard: list[tuple[float, MediaPort]] = []
        self._free: list[MediaPort] = []
        self._all: list[MediaPort] = []
        # Set when calls get C ports (media.port = "c" and the start-up check passed).
        self._c_ports: tuple[CPortLibrary, int] | None = None

    @property
    def c_ports(self) -> bool:
        return self._c_ports is not None

    @property
    def c_detector(self) -> bool:
        """Whether calls' C ports run the evidence detector on the clock thread."""
        return (
            self._c_ports is not None
            and self._c_ports[0].detects
            and self._vad is not None
            and detector_config(self._vad) is not None
        )

    def start_c_ports(self) -> None:
        """Use C ports if this build has them and two of them pass a frame across the bridge."""
        rate = self.rate
        try:
            lib = CPortLibrary.load()
            pool = lib.pool("voicegate-ports")
            pair = [CMediaPort(lib, pool, f"vg-{i}-{rate}", rate, self._vad) for i in range(2)]
            passed = self_test(lib, pair[0], pair[1])
        except (CPortUnavailable, BridgeError, OSError) as exc:
            log.warning("C media port unavailable, using the Python port: %s", exc)
            return
        if not passed:
            log.warning("C media port failed its bridge check, using the Python port")
            return
        self._c_ports = (lib, pool)
        for port in pair:
            port.attach(MediaChannel(rate, inbound_frames=1))
            self._all.append(port)
            self._free.append(port)

    def borrow(self) -> MediaPort:
        """A port on a fresh channel with its own playout, ready to connect to a call."""
        rate = self.rate
        channel = MediaChannel(rate, playout=Playout(rate, self._playout_max_ms))
        port: MediaPort
        if self._free:
            port = self._free.pop()
            port.attach(channel)
            return port
        name = f"vg-{len(self._all)}-{rate}"
        if self._c_ports is not None:
            port = CMediaPort(*self._c_ports, name, rate, self._vad)
            port.attach(channel)
        else:
            assert self.copier is not None
            port = MediaBridge(name, channel, self.copier, self._thread_states)
            port.create()
        self._all.append(port)
        return port

    def detach(self, port: MediaPort, audio: Any) -> None:
        """Disconnect ``port`` from its call's ``audio`` (if any); reusable after GRAVEYARD_S."""
        if audio is not None:
            port.disconnect(audio)
        self.graveyard.append((time.monotonic() + GRAVEYARD_S, port))

    def next_due(self) -> float | None:
        """When the oldest detached port may be recycled, if one waits."""
        return self.graveyard[0][0] if self.graveyard else None

    def recycle_due(self, now: float) -> None:
        if self.graveyard and self.graveyard[0][0] <= now:
            for _, port in (item for item in self.graveyard if item[0] <= now):
                # Park it on a silent channel of its own until the next call borrows it.
                port.attach(MediaChannel(port.rate, inbound_frames=1))
                self._free.append(port)
            self.graveyard = [item for item in self.graveyard if item[0] > now]

    def release_all(self) -> list[MediaPort]:
        """Forget every port (the library is being destroyed); return them to the caller, who
        must keep them until ``libDestroy`` is done and then disown the Python ones."""
        ports, self._all = self._all, []
        # C ports are not freed (a few kB each): the bridge is gone, but a late ring call
        # from asyncio may still read them, which their epoch makes harmless.
        self._c_ports = None
        self.graveyard.clear()
        self._free.clear()
        return ports
