"""What the demo agent understands, per dialog state: one JSGF grammar each, and the meaning of
what was recognised (an intent, an amount in cents).

The grammars are small on purpose (audio/speech/grammar.py says why); README.md has the short
table of what to say. Amounts are whole euros and cents below a thousand euros.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from audio.speech.grammar import Grammar

_NUMBERS: Final = """
<ones> = one | two | three | four | five | six | seven | eight | nine;
<teens> = ten | eleven | twelve | thirteen | fourteen | fifteen | sixteen | seventeen | eighteen
  | nineteen;
<tens> = twenty | thirty | forty | fifty | sixty | seventy | eighty | ninety;
<below100> = <ones> | <teens> | <tens> [<ones>];
<number> = <below100> | <ones> hundred [[and] <below100>];
"""

MENU = Grammar(
    "menu",
    """
<pay> = [i want to | i would like to] (make a payment | pay) | payment;
<person> = [i want to] (talk | speak) to a person | operator;
<bye> = goodbye | bye | hang up;
<again> = repeat [that] | say that again;
<digits> = read back [my] digits;
public <menu> = <pay> | <person> | <bye> | <again> | <digits>;
""",
)
AMOUNT = Grammar(
    "amount",
    _NUMBERS
    + """
<cents> = <number> (cent | cents);
<euros> = <number> (euro | euros) [and <number> (cent | cents)];
public <amount> = <cents> | <euros> | cancel | repeat [that];
""",
)
CONFIRM = Grammar(
    "confirm",
    """
<yes> = yes [please] | yeah | correct | that is right;
<no> = no [thanks | thank you] | cancel;
public <confirm> = <yes> | <no> | repeat [that];
""",
)
DIGITS = Grammar(
    "digits",
    """
<digit> = zero | oh | one | two | three | four | five | six | seven | eight | nine;
public <digits> = <digit>+ | cancel;
""",
    sensitive=True,
)
GRAMMARS: Final = (MENU, AMOUNT, CONFIRM, DIGITS)

_ONES: Final = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_TEENS: Final = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                 "seventeen", "eighteen", "nineteen")  # fmt: skip
_TENS: Final = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_VALUES: Final = {
    **{w: i for i, w in enumerate(_ONES)},
    "oh": 0,
    **{w: 10 + i for i, w in enumerate(_TEENS)},
    **{w: 20 + 10 * i for i, w in enumerate(_TENS)},
}


@dataclass(frozen=True, slots=True)
class Intent:
    """``kind``: pay, person, goodbye, repeat, digits (menu); amount, cancel (amount); yes, no
    (confirm); said_digits (digits). ``value``: cents for amount, the digits for said_digits."""

    kind: str
    value: str = ""


def _number(words: list[str]) -> int:
    total = current = 0
    for word in words:
        if word == "hundred":
            current *= 100
        elif word != "and":
            current += _VALUES[word]
    total += current
    return total


def amount_cents(text: str) -> int:
    """Cents in an utterance of the amount grammar ("two euros and fifty cents" -> 250)."""
    words = text.split()
    for unit in ("euro", "euros"):
        if unit in words:
            at = words.index(unit)
            euros = _number(words[:at])
            rest = [w for w in words[at + 1 :] if w not in ("cent", "cents")]
            return euros * 100 + (_number(rest) if rest else 0)
    return _number([w for w in words if w not in ("cent", "cents")])


def intent(grammar: str, text: str) -> Intent:
    """The meaning of ``text``, which ``grammar`` accepted."""
    words = text.split()
    if "repeat" in words or "again" in words:
        return Intent("repeat")
    if "cancel" in words:
        return Intent("cancel" if grammar != "confirm" else "no")
    match grammar:
        case "menu":
            if "pay" in words or "payment" in words:
                return Intent("pay")
            if "person" in words or "operator" in words:
                return Intent("person")
            if "digits" in words:
                return Intent("digits")
            return Intent("goodbye")
        case "amount":
            return Intent("amount", str(amount_cents(text)))
        case "confirm":
            return Intent("no" if "no" in words else "yes")
        case "digits":
            return Intent("said_digits", "".join(str(_VALUES[w]) for w in words))
    raise ValueError(f"no grammar {grammar!r}")


def say_cents(cents: int) -> str:
    """An amount as espeak-ng should say it: "59 cents", "2 euros and 50 cents"."""
    euros, rest = divmod(cents, 100)
    if not euros:
        return f"{rest} cent" + ("s" if rest != 1 else "")
    said = f"{euros} euro" + ("s" if euros != 1 else "")
    return said + (f" and {rest} cent" + ("s" if rest != 1 else "") if rest else "")
