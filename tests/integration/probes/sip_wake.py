"""Run by tests/integration/test_pjsua2_threads.py in a process of its own: does PJSIP's
``libHandleEvents`` return when SipWaker pokes its UDP transport, and does PJSIP stay silent?

Prints one JSON line: how long each blocking ``libHandleEvents(5000)`` took with a wake-up sent
0.3 s in, how long ``libHandleEvents(1500)`` took without one, and whether anything came back to
the waker's socket.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from telephony.sip_wake import SipWaker
from tests.integration.probes.endpoint import start_endpoint


def main() -> None:
    port = int(sys.argv[1])
    # No sound-device timer to end a wait early.
    ep = start_endpoint(snd_auto_close_s=-1, udp_port=port)
    waker = SipWaker("127.0.0.1", port)
    # Drain whatever start-up left pending (timers), so each wait below is a plain block.
    for _ in range(20):
        ep.libHandleEvents(10)

    def poke() -> None:
        time.sleep(0.3)
        waker.wake()

    waits = []
    for _ in range(3):
        threading.Thread(target=poke).start()
        started = time.monotonic()
        ep.libHandleEvents(5000)
        waits.append(time.monotonic() - started)
    # The control: with no wake-up, the same call blocks (here 1.5 s).
    started = time.monotonic()
    ep.libHandleEvents(1500)
    unpoked = time.monotonic() - started
    waker._sock.settimeout(0.5)
    try:
        reply = waker._sock.recv(100).decode(errors="replace")
    except TimeoutError:
        reply = None
    print(json.dumps({"waits": waits, "unpoked": unpoked, "reply": reply}), flush=True)
    ep.libDestroy()


if __name__ == "__main__":
    main()
