"""Prompts: the shipped set loads at both call rates, files are read faithfully, names checked."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import soundfile

from audio.frame import FrameError
from audio.prompts import PromptLibrary, UnknownPrompt, default_prompts_dir, frames, load_prompt

REPO = Path(__file__).resolve().parents[2]


def make_prompts_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_prompts", REPO / "scripts/make_prompts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHIPPED = make_prompts_script().PROMPTS


def test_the_shipped_prompts_are_exactly_those_the_script_makes() -> None:
    assert PromptLibrary(default_prompts_dir()).names() == sorted(SHIPPED)


def test_every_prompt_the_demo_agent_plays_ships() -> None:
    from agents import demo

    tree = ast.parse((REPO / "agents" / "demo.py").read_text())
    # Every string literal handed to _say() or play_prompt(), and the prompt tables.
    played = {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("_say", "play_prompt")
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }
    played |= set(demo._DIGIT_PROMPTS.values()) | set(demo._OUTCOME_PROMPTS.values())
    assert {"greeting", "menu", "goodbye"} <= played, "found no prompts to check"
    assert played <= SHIPPED.keys()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_files_are_16_khz_mono_16_bit(name: str) -> None:
    info = soundfile.info(str(default_prompts_dir() / f"{name}.wav"))
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")


@pytest.mark.parametrize("rate", [8000, 16000])
def test_every_shipped_prompt_loads_at_the_call_rates(rate: int) -> None:
    library = PromptLibrary(default_prompts_dir(), rate)
    at_16k = PromptLibrary(default_prompts_dir(), 16000)
    for name in SHIPPED:
        samples = library[name]
        assert samples.dtype == np.int16 and samples.ndim == 1
        assert 0.2 < len(samples) / rate < 20, name
        assert np.abs(samples.astype(np.int32)).max() > 32768 // 4, f"{name} is nearly silent"
        # Trimmed: speech within 100 ms of each end.
        edge = rate // 10
        assert np.abs(samples[:edge].astype(np.int32)).max() > 300, f"{name} starts silent"
        assert np.abs(samples[-edge:].astype(np.int32)).max() > 300, f"{name} ends silent"
        assert len(samples) == round(len(at_16k[name]) * rate / 16000)


def test_prompts_are_cached_per_rate_and_read_only() -> None:
    library = PromptLibrary(default_prompts_dir(), 16000)
    greeting = library["greeting"]
    assert library.get("greeting") is greeting
    assert library.get("greeting", 16000) is greeting
    narrow = library.get("greeting", 8000)
    assert narrow is library.get("greeting", 8000)
    assert len(narrow) == round(len(greeting) / 2)
    with pytest.raises(ValueError, match="read-only"):
        greeting[0] = 0


def test_a_new_library_shares_the_loaded_audio_until_the_file_changes(tmp_path: Path) -> None:
    """Loaded audio is kept for the process (the fork server loads it for every worker), by
    file and rate: a second library gets the same array, and a rewritten file is read again."""
    path = tmp_path / "hello.wav"
    soundfile.write(str(path), np.full(800, 1000, np.int16), 8000)
    first = PromptLibrary(tmp_path).get("hello", 8000)
    assert PromptLibrary(tmp_path).get("hello", 8000) is first
    soundfile.write(str(path), np.full(1600, -1000, np.int16), 8000)
    again = PromptLibrary(tmp_path).get("hello", 8000)
    assert len(again) == 1600 and int(again[0]) == -1000


def test_load_all_fails_on_a_broken_file(tmp_path: Path) -> None:
    soundfile.write(str(tmp_path / "good.wav"), np.zeros(800, np.int16), 8000)
    (tmp_path / "broken.wav").write_bytes(b"RIFF not really")
    library = PromptLibrary(tmp_path, 8000)
    assert library["good"].tolist() == [0] * 800
    with pytest.raises(soundfile.LibsndfileError):
        library.load_all(16000)


def test_unknown_prompt_names_itself_and_the_directory(tmp_path: Path) -> None:
    soundfile.write(str(tmp_path / "known.wav"), np.zeros(800, np.int16), 8000)
    library = PromptLibrary(tmp_path, 8000)
    with pytest.raises(UnknownPrompt) as caught:
        library["missing"]
    assert isinstance(caught.value, KeyError)
    assert caught.value.name == "missing" and caught.value.directory == tmp_path
    assert "'missing'" in str(caught.value) and str(tmp_path) in str(caught.value)
    assert "known" in library and "missing" not in library


def test_names_cannot_reach_outside_the_directory(tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    soundfile.write(str(tmp_path / "outside.wav"), np.zeros(800, np.int16), 8000)
    library = PromptLibrary(tmp_path / "inner", 8000)
    with pytest.raises(UnknownPrompt):
        library.get("../outside")


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        PromptLibrary(tmp_path / "nowhere")


def test_int16_files_load_exactly(tmp_path: Path) -> None:
    samples = np.array([0, 1, -1, 32767, -32768, 1234], np.int16)
    soundfile.write(str(tmp_path / "p.wav"), samples, 16000, subtype="PCM_16")
    assert np.array_equal(load_prompt(tmp_path / "p.wav", 16000), samples)


def test_24_bit_and_float_files_map_to_int16_full_scale(tmp_path: Path) -> None:
    values = np.array([0.0, 0.5, -0.5, -1.0, 0.25])
    soundfile.write(str(tmp_path / "p24.wav"), values, 16000, subtype="PCM_24")
    assert load_prompt(tmp_path / "p24.wav", 16000).tolist() == [0, 16384, -16384, -32768, 8192]
    soundfile.write(
        str(tmp_path / "f.wav"), np.array([1.0, 1.5, -2.0, 0.5]), 16000, subtype="FLOAT"
    )
    # Beyond full scale saturates rather than wrapping around.
    assert load_prompt(tmp_path / "f.wav", 16000).tolist() == [32767, 32767, -32768, 16384]


def test_channels_are_mixed_to_mono(tmp_path: Path) -> None:
    stereo = np.array([[1000, 3000], [-2000, 0], [32767, 32767]], np.int16)
    soundfile.write(str(tmp_path / "s.wav"), stereo, 16000)
    assert load_prompt(tmp_path / "s.wav", 16000).tolist() == [2000, -1000, 32767]


def test_files_are_resampled_to_the_requested_rate(tmp_path: Path) -> None:
    t = np.arange(44100) / 44100
    soundfile.write(str(tmp_path / "cd.wav"), 0.5 * np.sin(2 * np.pi * 440 * t), 44100)
    samples = load_prompt(tmp_path / "cd.wav", 8000)
    assert len(samples) == 8000
    expected = 16384 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)
    assert np.abs(samples[100:-100] - expected[100:-100]).max() < 20


def test_files_at_other_rates_are_refused_by_name(tmp_path: Path) -> None:
    soundfile.write(str(tmp_path / "odd.wav"), np.zeros(100, np.int16), 11025)
    with pytest.raises(ValueError, match=r"odd\.wav: sample rate 11025 Hz"):
        load_prompt(tmp_path / "odd.wav", 8000)


def test_frames_split_into_20_ms_and_pad_the_last() -> None:
    samples = np.arange(1, 401, dtype=np.int16)
    out = list(frames(samples, 8000, timestamp=1600))
    assert [len(f) for f in out] == [160, 160, 160]
    assert [f.timestamp for f in out] == [1600, 1760, 1920]
    assert all(f.rate == 8000 for f in out)
    assert np.array_equal(np.concatenate([f.samples for f in out])[:400], samples)
    assert not out[-1].samples[80:].any()
    assert list(frames(samples[:320], 16000)) == list(frames(samples[:320], 16000))
    assert len(list(frames(samples[:320], 16000))) == 1
    assert list(frames(np.zeros(0, np.int16), 8000)) == []


def test_frames_refuse_non_int16_at_once() -> None:
    with pytest.raises(FrameError, match="int16"):
        frames(np.zeros(10, np.float64), 8000)


def test_every_prompt_the_session_machine_can_say_is_shipped() -> None:
    from pathlib import Path

    import session.machine

    source = Path(session.machine.__file__).read_text()
    said = (
        set(re.findall(r'Say\("([a-z_]+)"\)', source))
        | set(re.findall(r'say="([a-z_]+)"', source))
        | set(re.findall(r'"(outcome_unknown|timed_out)"', source))
    )
    assert {"reconnecting", "timed_out", "outcome_unknown"} <= said
    library = PromptLibrary(default_prompts_dir())
    missing = [name for name in said if name not in library]
    assert not missing
