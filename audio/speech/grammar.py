"""Recognition grammars: one JSGF grammar per dialog state, and the dictionary trimmed to them.

A grammar is what the caller may say in one state ("yes", "no", "repeat that"); a small grammar
is what makes pocketsphinx accurate here (notes: 10/10 intents at 16 kHz against about 4/10 with
the full language model). We only ever hand pocketsphinx grammars we wrote (its JSGF parser is
C code that fuzzing has found bugs in), and every word must be in the model's dictionary, so a
typo fails at start-up with the word named, not as a silent never-recognised phrase.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pocketsphinx

_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Rule references (<amount>), weights (/0.5/), and JSGF's own punctuation are not words.
_NOT_WORDS = re.compile(r"<[^>]*>|/[^/]*/|[|()\[\]*+;=]")
_WORD = re.compile(r"[a-z']+")


class GrammarError(ValueError):
    """A grammar we wrote is unusable; the message names the grammar and what is wrong."""


def model_dir() -> Path:
    """The US English model shipped inside the pocketsphinx wheel (nothing is downloaded)."""
    return Path(pocketsphinx.get_model_path()) / "en-us"


@dataclass(frozen=True, slots=True)
class Grammar:
    """``rules``: JSGF rule definitions, one of them ``public <name> = ...;``.

    ``sensitive``: what is said in this state is digits that must never be stored as said (a
    card number): the session log gets them masked.
    """

    name: str
    rules: str
    sensitive: bool = False

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise GrammarError(f"grammar name {self.name!r}: lower-case letters, digits, _")
        if f"public <{self.name}>" not in self.rules:
            raise GrammarError(f"grammar {self.name}: needs a rule 'public <{self.name}> = ...;'")

    @property
    def jsgf(self) -> str:
        return f"#JSGF V1.0;\ngrammar {self.name};\n{self.rules.strip()}\n"

    def words(self) -> frozenset[str]:
        """Every word the caller may say in this grammar."""
        body = "\n".join(line.split("=", 1)[1] for line in self.rules.split(";") if "=" in line)
        return frozenset(_WORD.findall(_NOT_WORDS.sub(" ", body.lower())))


@functools.cache
def _full_dictionary() -> dict[str, tuple[str, ...]]:
    entries: dict[str, list[str]] = {}
    with open(model_dir() / "cmudict-en-us.dict", encoding="utf-8") as lines:
        for line in lines:
            head, _, _ = line.partition(" ")
            entries.setdefault(head.split("(", 1)[0], []).append(line.rstrip("\n"))
    return {word: tuple(found) for word, found in entries.items()}


@functools.cache
def trimmed_dictionary(words: frozenset[str]) -> Path:
    """A dictionary file holding only ``words`` (every pronunciation of each), written once per
    process: a decoder then loads in milliseconds and takes about 9 MB instead of 29 MB."""
    full = _full_dictionary()
    missing = sorted(w for w in words if w not in full)
    if missing:
        raise GrammarError(f"not in the pronunciation dictionary: {', '.join(missing)}")
    lines = [line for word in sorted(words) for line in full[word]]
    with tempfile.NamedTemporaryFile(
        "w", prefix="voicegate-dict-", suffix=".dict", delete=False, encoding="utf-8"
    ) as out:
        out.write("\n".join(lines) + "\n")
    atexit.register(os.unlink, out.name)
    return Path(out.name)


def vocabulary(grammars: Iterable[Grammar]) -> frozenset[str]:
    """The union of the grammars' words, each checked against the dictionary."""
    words = frozenset().union(*(g.words() for g in grammars))
    trimmed_dictionary(words)
    return words
