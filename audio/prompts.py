"""Recorded prompts: WAV files read once, mixed to mono, converted to a call's rate and cached.

A prompt is named by its file name without ``.wav``. The library lists its directory when it is
built and only ever opens names from that list, so a name can never reach outside the directory.

The converted audio is cached for the whole process, by file (its path, size and modification
time) and rate, not only per library: the pool's fork server loads every prompt once before it
forks the workers, and each worker's library then finds them loaded, in pages all the workers
share (about 6.6 MB a worker for the demo's prompts at 8 and 16 kHz).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import numpy as np
import soundfile
from numpy.typing import NDArray

from audio.frame import Frame, FrameError, samples_per_frame
from audio.resample import RATES, resample


class UnknownPrompt(KeyError):
    """No prompt of this name in the library's directory."""

    def __init__(self, name: str, directory: Path) -> None:
        super().__init__(name)
        self.name = name
        self.directory = directory

    def __str__(self) -> str:
        # KeyError's own __str__ would show only the quoted name.
        return f"no prompt {self.name!r} in {self.directory} (no file {self.name}.wav)"


def default_prompts_dir() -> Path:
    """The ``agents/prompts`` directory shipped inside the installed package."""
    directory = files("agents") / "prompts"
    if not isinstance(directory, Path):
        # Only a zipped install gives something else; we ship as a plain package.
        raise RuntimeError(f"prompts are not on the file system: {directory}")
    return directory


# (path, size, mtime_ns, rate) -> the read-only converted audio; a changed file is a new key.
_LOADED: dict[tuple[str, int, int, int], NDArray[np.int16]] = {}


def _load_cached(path: Path, rate: int) -> NDArray[np.int16]:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, rate)
    found = _LOADED.get(key)
    if found is None:
        found = load_prompt(path, rate)
        found.flags.writeable = False
        _LOADED[key] = found
    return found


def load_prompt(path: str | os.PathLike[str], rate: int) -> NDArray[np.int16]:
    """The audio of one sound file as mono int16 at ``rate`` Hz.

    Channels are averaged; float files are scaled so 1.0 is full scale and saturated beyond it.
    """
    # soundfile scales every subtype to float64 with integer full scale at 1.0 (int16 divided by
    # 32768), so multiplying by 32768 restores 16-bit files exactly and maps the rest onto int16.
    data, file_rate = soundfile.read(os.fspath(path), dtype="float64", always_2d=True)
    if file_rate not in RATES:
        raise ValueError(f"{path}: sample rate {file_rate} Hz is not one of {sorted(RATES)}")
    mono = data.mean(axis=1) * 32768.0
    samples = np.clip(np.rint(mono), -32768, 32767).astype(np.int16)
    return resample(samples, int(file_rate), rate)


class PromptLibrary:
    """Every ``*.wav`` of ``directory``, loaded on first use and kept per rate.

    ``library[name]`` is the prompt at the library's default ``rate``; :meth:`get` takes any rate.
    The arrays returned are shared and read-only.
    """

    def __init__(self, directory: str | os.PathLike[str], rate: int = 16000) -> None:
        self.directory = Path(directory)
        self.rate = rate
        if not self.directory.is_dir():
            raise FileNotFoundError(f"prompt directory {self.directory} does not exist")
        self._paths = {p.stem: p for p in sorted(self.directory.glob("*.wav"))}
        self._cache: dict[tuple[str, int], NDArray[np.int16]] = {}

    def names(self) -> list[str]:
        """The prompt names, sorted."""
        return sorted(self._paths)

    def __contains__(self, name: object) -> bool:
        return name in self._paths

    def __getitem__(self, name: str) -> NDArray[np.int16]:
        return self.get(name)

    def load_all(self, rate: int | None = None) -> None:
        """Load every prompt at ``rate`` now, so a broken file fails start-up rather than a call."""
        for name in self._paths:
            self.get(name, rate)

    def get(self, name: str, rate: int | None = None) -> NDArray[np.int16]:
        """Prompt ``name`` at ``rate`` Hz (default: the library's), or :class:`UnknownPrompt`."""
        rate = self.rate if rate is None else rate
        key = (name, rate)
        cached = self._cache.get(key)
        if cached is None:
            path = self._paths.get(name)
            if path is None:
                raise UnknownPrompt(name, self.directory)
            cached = _load_cached(path, rate)
            self._cache[key] = cached
        return cached


def frames(samples: NDArray[np.int16], rate: int, timestamp: int = 0) -> Iterator[Frame]:
    """``samples`` as consecutive 20 ms frames from ``timestamp``, the last one padded with silence.

    Frames view ``samples`` (no copy) except the padded last one.
    """
    # Checked here, not on the first next(): a bad prompt should fail where it was queued.
    if samples.dtype != np.int16 or samples.ndim != 1:
        raise FrameError(f"expected 1-D int16 samples, got {samples.dtype} {samples.shape}")
    return _frames(samples, rate, timestamp, samples_per_frame(rate))


def _frames(samples: NDArray[np.int16], rate: int, timestamp: int, size: int) -> Iterator[Frame]:
    whole, rest = divmod(len(samples), size)
    for i in range(whole):
        yield Frame(samples[i * size : (i + 1) * size], rate, timestamp + i * size)
    if rest:
        last = np.zeros(size, dtype=np.int16)
        last[:rest] = samples[whole * size :]
        yield Frame(last, rate, timestamp + whole * size)
