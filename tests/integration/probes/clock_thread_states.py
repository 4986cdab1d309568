"""Run by tests/integration/test_thread_states.py in a process of its own (pjsua2's Endpoint is a
process singleton): media ports on the null sound device, and what their callbacks saw.

Prints one JSON line: per clock-thread run, how many callbacks kept a thread-local value set by an
earlier callback (which only survives if the thread state does), and the pins' counts.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import pjsua2 as pj

from telephony.thread_state import ThreadStatePins
from tests.integration.probes.endpoint import start_endpoint

PIN = sys.argv[1] == "pin"
RATE = 16000


class Port(pj.AudioMediaPort):  # type: ignore[misc]
    def __init__(self, pins: ThreadStatePins, seen: dict[str, int], local: threading.local) -> None:
        super().__init__()
        self.pins, self.seen, self.local = pins, seen, local

    def onFrameRequested(self, frame: Any) -> None:
        if PIN and not self.pins.here.pinned:
            self.pins.pin()
        self.seen["callbacks"] += 1
        if getattr(self.local, "mark", None) == "set":
            self.seen["kept"] += 1
        self.local.mark = "set"
        self.seen["threads"] = max(self.seen["threads"], threading.get_native_id())

    def onFrameReceived(self, frame: Any) -> None:
        pass


def main() -> None:
    # PJSIP's default: the idle sound device closes after 1 s, ending its clock thread.
    ep = start_endpoint(rate=RATE, snd_auto_close_s=1)
    pins = ThreadStatePins()
    local = threading.local()
    runs = []
    ports = []
    for run in range(3):
        seen = {"callbacks": 0, "kept": 0, "threads": 0}
        a, b = Port(pins, seen, local), Port(pins, seen, local)
        for i, port in enumerate((a, b)):
            fmt = pj.MediaFormatAudio()
            fmt.init(pj.PJMEDIA_FORMAT_PCM, RATE, 1, 20000, 16)
            port.createPort(f"p{run}{i}", fmt)
        # Each port sends to the other; the null device's clock serves both while they do.
        a.startTransmit(b)
        b.startTransmit(a)
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            ep.libHandleEvents(20)
        a.stopTransmit(b)
        b.stopTransmit(a)
        # Let the bridge go idle and close the sound device: its clock thread ends.
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            ep.libHandleEvents(20)
        ports += [a, b]
        runs.append(dict(seen))
    print(json.dumps({"runs": runs, "pinned": pins.pinned, "freed": pins.freed}), flush=True)
    for port in ports:
        port.thisown = False  # ports outlive libDestroy (telephony.media_bridge)
    ep.libDestroy()


if __name__ == "__main__":
    main()
