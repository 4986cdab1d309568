"""The runtime's media tick (voicegate/runtime.py): every audio.tick_ms, and barge_in_tick_ms
after the last one when a call, having drained its caller audio, says a barge-in may be starting
(quicken_media_tick).

An unstarted Runtime (no SIP) on the real event loop. Its calls are stand-ins that only count the
ticks queued for them; whether a real call asks for the quick pace is CallerTurns' business,
tested with real audio in test_audio_evidence_vad.py and test_audio_barge_in.py, and end to end
in test_calls.py (a silent caller never does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from config import load_settings
from voicegate.call.live_call import LiveCall
from voicegate.runtime import Runtime


class _Call:
    def __init__(self) -> None:
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1


@pytest.fixture
def runtime(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Runtime]:
    # Built here, not in the test: opening the store blocks, and the tests run on the loop.
    env = getattr(request, "param", {})
    runtime = Runtime(load_settings(environ={"VOICEGATE_STORAGE_DATA_DIR": str(tmp_path), **env}))
    yield runtime
    runtime.writer.close()
    runtime.reader.close()


def _gaps_ms(runtime: Runtime, quickened: list[int]) -> list[int]:
    """Run one tick per item, then ask for the quick pace that many times (as that many calls'
    drains would); the gap in ms from each tick to the one it leaves armed."""
    call = _Call()
    runtime.calls = {"c": cast(LiveCall, call)}
    runtime._arm_ticker()
    gaps = []
    for asks in quickened:
        armed = runtime._ticker
        assert armed is not None
        armed.cancel()
        runtime._tick()
        due = runtime._next_tick - runtime._tick_s
        for _ in range(asks):
            runtime.quicken_media_tick()
        gaps.append(round((runtime._next_tick - due) * 1000))
    assert call.ticks == len(quickened)
    assert runtime._ticker is not None
    runtime._ticker.cancel()
    return gaps


async def test_a_call_near_a_barge_in_brings_the_next_tick_forward(runtime: Runtime) -> None:
    assert _gaps_ms(runtime, [0, 1, 2, 1, 0, 0]) == [60, 20, 20, 20, 60, 60]
    ticks = runtime.metrics.media_ticks
    # A tick brought forward is counted at the barge-in pace when it runs: the last one armed
    # (steady) has not run yet.
    assert ticks.labels("barge_in")._value.get() == 3
    assert ticks.labels("steady")._value.get() == 3


@pytest.mark.parametrize(
    "runtime",
    [{"VOICEGATE_AUDIO_TICK_MS": "40", "VOICEGATE_AUDIO_BARGE_IN_TICK_MS": "40"}],
    indirect=True,
)
async def test_one_pace_when_the_barge_in_tick_is_the_steady_one(runtime: Runtime) -> None:
    assert _gaps_ms(runtime, [0, 1, 0]) == [40, 40, 40]
    assert runtime.metrics.media_ticks.labels("barge_in")._value.get() == 0
