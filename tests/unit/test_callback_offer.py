"""The callback offer key by key (voicegate/call/callback_offer.py) and the keyed digests it is
matched and checked with (voicegate/call/callback_keys.py)."""

from __future__ import annotations

import stat
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from voicegate.call.callback_keys import (
    CODE_DIGITS,
    KEY_FILE,
    MAX_CODE_ATTEMPTS,
    CallbackKeys,
    caller_number,
    new_code,
)
from voicegate.call.callback_offer import CallbackOffer, Outcome, Stage

CODE = "471902"


def _offer(needs_code: bool = True) -> CallbackOffer:
    return CallbackOffer(needs_code, lambda code: code == CODE)


def _enter(offer: CallbackOffer, keys: str) -> list[Outcome | None]:
    return [offer.key(k).outcome for k in keys]


def test_one_is_enough_without_a_write() -> None:
    offer = _offer(needs_code=False)
    step = offer.key("1")
    assert step.outcome is Outcome.ACCEPTED and step.prompts == ()


def test_any_other_key_or_no_key_starts_a_new_session() -> None:
    for key in "0234#*":
        step = _offer().key(key)
        assert step.outcome is Outcome.DECLINED and step.prompts == ("new_session",)
    assert _offer().timed_out().outcome is Outcome.NO_ANSWER


def test_with_a_write_the_code_is_asked_for_and_checked() -> None:
    offer = _offer()
    assert offer.key("1").prompts == ("enter_resume_code",)
    assert offer.stage is Stage.CODE
    assert _enter(offer, CODE) == [None] * (CODE_DIGITS - 1) + [Outcome.ACCEPTED]


def test_three_wrong_codes_start_a_new_session_each_attempt_counted() -> None:
    offer = _offer()
    offer.key("1")
    attempts = []
    for _ in range(MAX_CODE_ATTEMPTS):
        steps = [offer.key(k) for k in "000000"]
        attempts.append(steps[-1].attempt)
    assert attempts == ["wrong"] * MAX_CODE_ATTEMPTS
    assert steps[-1].outcome is Outcome.CODE_REFUSED and offer.stage is Stage.DONE
    assert offer.key(CODE[0]).outcome is None  # nothing more is taken


def test_a_short_code_ended_by_hash_is_a_wrong_attempt() -> None:
    offer = _offer()
    offer.key("1")
    step = [offer.key(k) for k in "47#"][-1]
    assert step.attempt == "wrong" and step.outcome is None
    assert step.prompts == ("resume_code_wrong", "enter_resume_code")
    assert _enter(offer, CODE)[-1] is Outcome.ACCEPTED


@given(st.lists(st.sampled_from("0123456789#*1"), max_size=40))
def test_any_keys_end_at_most_once_and_only_the_code_continues_a_write(keys: list[str]) -> None:
    offer = _offer()
    outcomes = [o for o in _enter(offer, "".join(keys)) if o is not None]
    assert len(outcomes) <= 1
    assert offer.attempts <= MAX_CODE_ATTEMPTS
    if outcomes == [Outcome.ACCEPTED]:
        assert CODE in "".join(keys)


def test_the_installation_key_is_made_once_private_and_shared(tmp_path: Path) -> None:
    first = CallbackKeys.in_directory(tmp_path)
    second = CallbackKeys.in_directory(tmp_path)
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert first.caller("default", "+15550100123") == second.caller("default", "+15550100123")
    # Keyed and scoped: another tenant, another installation or another session differ.
    assert first.caller("default", "+15550100123") != first.caller("other", "+15550100123")
    (tmp_path / "x").mkdir()
    other = CallbackKeys.in_directory(tmp_path / "x")
    assert other.caller("default", "+15550100123") != first.caller("default", "+15550100123")
    digest = first.code("s1", CODE)
    assert first.code_matches("s1", CODE, digest)
    assert not first.code_matches("s2", CODE, digest) and not first.code_matches("s1", "0", "")
    assert "+15550100123" not in repr(first) and CODE not in digest


def test_the_number_is_the_from_uris_user_part() -> None:
    assert caller_number('"+1 555" <sip:+15550100123@10.0.0.1:5070>;tag=x') == "+15550100123"
    assert caller_number("<tel:+1-555-0100-123>") == "+15550100123"
    assert caller_number("sip:anonymous@anonymous.invalid") == ""
    code = new_code()
    assert len(code) == CODE_DIGITS and code.isdigit()
