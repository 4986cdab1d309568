"""Caller turns and barge-in decide the same whether the detector runs in Python or in C.

``CallerTurns.drain_inbound`` takes one of two paths: the per-frame loop over the Python
detector (the Python media port, the ``verdicts`` detector), or, when the C media port ran the
evidence detector on the clock thread, steps on only the frames its records name. The same call
goes through both here: a response playing, the caller's line (fixture clips of speech over
noise, spliced by hypothesis), key presses at drawn frames, drained a few frames a tick as the
media tick does. After every tick both must have logged the same session events (barge-ins,
their judgement, caller turns) and told the agent the same things, so a step that the record
path takes later than the per-frame loop shows as a difference at that tick.
"""

from __future__ import annotations

import asyncio
import ctypes
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from audio.barge_in import BargeInConfig
from audio.vad import VadConfig
from session import events as sev
from session.store.sqlite import SqliteSessionStore
from session.store.writer import StoreWriter
from telephony.c_media_port import CPortLibrary, CRing
from tests.unit.test_audio_evidence_vad import INDEX, clip
from tests.unit.test_c_evidence_vad import spliced
from tests.unit.test_cut_recorded import RATE, Call
from voicegate.call.turns import CallerTurns

LIB = CPortLibrary.load()
SPEECH = {name: clip(name) for name in sorted(INDEX) if INDEX[name]["onset_ms"] is not None}
STEP = RATE // 50


class Services:
    def __init__(self, call: Call, barge: BargeInConfig) -> None:
        self.metrics = call.responses._services.metrics
        self.faults = SimpleNamespace(reached=lambda name: None)
        self._barge = barge

    def audio_settings(self) -> tuple[int, VadConfig, BargeInConfig]:
        return RATE, VadConfig(), self._barge


class Agent:
    """What the agent was told, in order."""

    def __init__(self) -> None:
        self.told: list[tuple[str, Any]] = []

    async def on_speech_started(self) -> None:
        self.told.append(("speech_started", None))

    async def on_speech_turn(self, duration_ms: int) -> None:
        self.told.append(("speech_turn", duration_ms))

    async def on_false_interruption(self, heard_ms: int) -> None:
        self.told.append(("false_interruption", heard_ms))

    async def on_dtmf(self, digit: str) -> None:
        self.told.append(("dtmf", digit))


async def run(
    line: NDArray[np.int16], keys: set[int], barge: BargeInConfig, c: bool, tick: int
) -> list[tuple[list[str], list[tuple[str, Any]]]]:
    """The session events the turns applied and what the agent was told, after each tick."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSessionStore(Path(tmp) / "s.sqlite3")
        writer = StoreWriter(lambda: SqliteSessionStore(store.path))
        try:
            call = Call(store, writer)
            agent = Agent()
            call.state.agent = agent  # type: ignore[assignment]
            channel = call.state.channel
            assert channel is not None
            port = 0
            if c:
                port = LIB.new_port("turns", RATE)
                ring = CRing(LIB, port, LIB.vg.vg_port_attach(port), STEP * 2)
                assert ring.detect(VadConfig())
                # The ring only for the caller's frames: the test pulls the playout itself.
                channel.ring, channel.detecting = ring, True
            # The session events the turns apply, as they apply them (the store's writer thread
            # lands them later).
            applied: list[str] = []
            steps = call.steps
            try_apply, apply = steps.try_apply, steps.apply

            def logged_try(event: sev.Event) -> bool:
                ok = try_apply(event)
                applied.append(f"{type(event).__name__}{'' if ok else ' refused'}")
                return ok

            def logged(event: sev.Event) -> None:
                apply(event)
                applied.append(type(event).__name__)

            steps.try_apply, steps.apply = logged_try, logged  # type: ignore[method-assign]
            turns = CallerTurns(
                call.state,
                Services(call, barge),  # type: ignore[arg-type]
                call.steps,
                call.responses,
                SimpleNamespace(plan=None),  # type: ignore[arg-type]
            )
            handle = call.responses.respond()
            assert handle.play(np.full(RATE * 30, 500, dtype=np.int16))
            sink = ctypes.create_string_buffer(STEP * 2)
            after: list[tuple[list[str], list[tuple[str, Any]]]] = []
            frames = range(0, len(line) - STEP + 1, STEP)
            for index, at in enumerate(frames):
                call.playout.pull()
                pcm = line[at : at + STEP].tobytes()
                if c:
                    LIB.vg.vg_port_tick(port, sink, pcm)
                else:
                    channel.push_inbound(pcm)
                if index % tick == tick - 1 or index == len(frames) - 1:
                    channel.collect()
                    await turns.drain_inbound(channel)
                    after.append((list(applied), list(agent.told)))
                if index in keys:
                    await turns.on_dtmf("5")
            return after
        finally:
            await asyncio.to_thread(writer.close)
            store.close()


def lines() -> st.SearchStrategy[NDArray[np.int16]]:
    """Speech over noise, whole or in pieces (a cough's worth up to a sentence), with gaps up to
    3 s, then a second of silence: the rest of a false barge-in's window, for its judgement."""
    quiet = np.zeros(8000, dtype=np.int16)
    return spliced(SPEECH, 3, (1.0,), 24000).map(lambda line: np.concatenate([line, quiet]))


@settings(max_examples=80, deadline=None)
@given(
    line=lines(),
    keys=st.sets(st.integers(0, 400), max_size=2),
    turn_min=st.sampled_from([0, 200, 600]),
    min_speech=st.sampled_from([20, 60, 200]),
    window=st.sampled_from([200, 500]),
    tick=st.sampled_from([1, 3]),
)
def test_both_paths_take_every_step_on_the_same_tick(
    line: NDArray[np.int16],
    keys: set[int],
    turn_min: int,
    min_speech: int,
    window: int,
    tick: int,
) -> None:
    barge = BargeInConfig(
        min_speech_ms=min_speech, turn_min_speech_ms=turn_min, false_window_ms=window
    )
    python = asyncio.run(run(line, keys, barge, c=False, tick=tick))
    c = asyncio.run(run(line, keys, barge, c=True, tick=tick))
    assert c == python
    final = python[-1][0]
    event(f"barge-in judged: {'BargeInJudged' in final}")
    event(f"caller turn: {'TurnCommitted' in final}")


def test_a_cut_a_key_press_commits_is_judged_on_the_next_frame_on_both_paths() -> None:
    # The case the record path once missed: the key commits the cut between frames, and the
    # next frames bring no record; the per-frame loop judged it on the first of them.
    name = sorted(SPEECH)[0]
    line = np.concatenate([SPEECH[name], np.zeros(24000, dtype=np.int16)])
    onset = int(INDEX[name]["onset_ms"]) // 20  # type: ignore[call-overload]
    barge = BargeInConfig(turn_min_speech_ms=600, false_window_ms=2500)
    key = {onset + 8}
    python = asyncio.run(run(line, key, barge, c=False, tick=1))
    c = asyncio.run(run(line, key, barge, c=True, tick=1))
    judged = [i for i, (types, _) in enumerate(python) if "BargeInJudged" in types]
    assert judged and judged[0] <= onset + 10, "the cut was not judged right after the key"
    assert c == python
