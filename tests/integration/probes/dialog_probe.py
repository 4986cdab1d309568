"""Run by tests/integration/test_dialog_probe.py in a process of its own: voicegate's SIP thread
(telephony.endpoint.SipEndpoint) alone, with no session or agent, answering one SIPp call and
probing its dialog with in-dialog OPTIONS (telephony.events.ProbeDialog).

    python -m tests.integration.probes.dialog_probe PORT RTP_MIN RTP_MAX FIRST_S EVERY_S COUNT

Answers the first call with 200; FIRST_S after it is confirmed sends probe attempt 0, then one
more every EVERY_S until COUNT were submitted (the SIP thread drops those it cannot send: the call
has ended). Prints one JSON line per SIP event (the media channel left out), each with ``at``
seconds since the call was answered, and exits 2 s after the call ended (or after 60 s).
Set DIALOG_PROBE_PJSIP_LEVEL=5 to see PJSIP's messages (on stderr).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys

from telephony import events as ev
from telephony.endpoint import EndpointConfig, SipEndpoint


async def main(
    port: int, rtp_min: int, rtp_max: int, first_s: float, every_s: float, count: int
) -> None:
    level = int(os.environ.get("DIALOG_PROBE_PJSIP_LEVEL", "1"))
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if level >= 4 else logging.WARNING)
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    answered_at: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def probe(call_id: str) -> None:
        await asyncio.sleep(first_s)
        for attempt in range(count):
            sip.submit(ev.ProbeDialog(call_id, generation=1, attempt=attempt))
            await asyncio.sleep(every_s)

    def on_event(event: ev.SipEvent) -> None:
        fields = {
            f.name: getattr(event, f.name)
            for f in dataclasses.fields(event)  # type: ignore[arg-type]
            if f.name != "channel"
        }
        at = loop.time() - answered_at[0] if answered_at else None
        print(json.dumps({"type": type(event).__name__, "at": at, **fields}), flush=True)
        if isinstance(event, ev.CallOffered):
            sip.submit(ev.Answer(event.call_id))
        elif isinstance(event, ev.CallAnswered):
            answered_at.append(loop.time())
            task = loop.create_task(probe(event.call_id))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elif isinstance(event, ev.CallEnded):
            ended.set()

    config = EndpointConfig(
        sip_address="127.0.0.1",
        sip_port=port,
        media_address="127.0.0.1",
        media_advertised_address="127.0.0.1",
        rtp_port_min=rtp_min,
        rtp_port_max=rtp_max,
        codecs=("PCMA", "PCMU"),
        clock_rate=8000,
        max_calls=4,
        max_setup_rate=10.0,
        numbers=frozenset(),
        user_agent="voicegate-dialog-probe",
        pjsip_log_level=level,
    )
    sip = SipEndpoint(config, loop, on_event)
    await sip.start()
    try:
        await asyncio.wait_for(ended.wait(), 60)
        await asyncio.sleep(2)
    except TimeoutError:
        print(json.dumps({"type": "Timeout"}), flush=True)
    finally:
        for task in tasks:
            task.cancel()
        await sip.stop()


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(int(a[0]), int(a[1]), int(a[2]), float(a[3]), float(a[4]), int(a[5])))
