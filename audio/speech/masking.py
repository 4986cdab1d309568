"""What of an utterance may be stored: digit strings masked (STYLE.md habit 10).

A caller reading out a card number or a resume code says digits one by one ("four one one
one ..."); amounts are said as numbers ("fifty nine cents") and stay readable. So a run of
:data:`MIN_RUN` or more single-digit words (or any written digit) is masked, and in a state
whose grammar is marked sensitive every digit word is.
"""

from __future__ import annotations

from typing import Final

DIGIT_WORDS: Final = frozenset(
    ("zero", "oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
)
MIN_RUN: Final = 3
MASK: Final = "#"


def _is_digit(token: str) -> bool:
    return token in DIGIT_WORDS or token.isdigit()


def mask_digits(text: str, *, sensitive: bool = False) -> str:
    """``text`` with digit runs (all digits if ``sensitive``) replaced by ``#``, one per word."""
    tokens = text.split()
    out = list(tokens)
    run: list[int] = []
    for i, token in enumerate([*tokens, ""]):
        if token and _is_digit(token):
            run.append(i)
            continue
        if sensitive or len(run) >= MIN_RUN:
            for j in run:
                out[j] = MASK
        run = []
    # A written number inside a word ("4111x") is still digits.
    return " ".join(MASK if any(c.isdigit() for c in t) else t for t in out)
