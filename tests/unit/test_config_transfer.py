"""The [transfer] section: targets are SIP URIs, allowed_targets is the only way out, and a
configured target the patterns refuse is caught at load time, not on the first transfer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, load_settings
from config.settings import target_allowed
from voicegate.runtime import prompt_problems


def _error(**env: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_settings(environ=env)
    return str(err.value)


def test_defaults_allow_no_target_and_refuse_inbound_refer() -> None:
    t = load_settings(environ={}).transfer
    assert t.allowed_targets == ()
    assert not t.allows("sip:desk@callcentre.example.com")
    assert t.accept_inbound_refer is False
    assert t.default_mode == "blind"


def test_targets_and_patterns_load_from_the_environment() -> None:
    t = load_settings(
        environ={
            "VOICEGATE_TRANSFER_ALLOWED_TARGETS": "sip:*@cc.example.com,sip:+4930*@carrier.example",
            "VOICEGATE_TRANSFER_DEFAULT_TARGET": "sip:desk@cc.example.com",
            "VOICEGATE_TRANSFER_HUMAN_TARGET": "sip:supervisor@CC.example.com",
        }
    ).transfer
    assert t.allows("sip:desk@cc.example.com")
    assert t.allows("SIP:Desk@CC.Example.com")  # case-insensitive
    assert t.allows("sip:+4930123@carrier.example")
    assert not t.allows("sip:+1900555@carrier.example")
    assert not t.allows("sip:desk@cc.example.com.evil.example")


@pytest.mark.parametrize(
    "value",
    [
        "desk@cc.example.com",
        "<sip:desk@cc.example.com>",
        "sip:desk@cc?X-A=1",
        "sip:a b@c",
        "tel:+1",
    ],
)
def test_a_target_that_is_not_a_bare_sip_uri_is_refused(value: str) -> None:
    message = _error(VOICEGATE_TRANSFER_DEFAULT_TARGET=value)
    assert "transfer.default_target" in message
    assert "a SIP URI" in message


def test_a_pattern_that_is_not_a_sip_uri_is_refused() -> None:
    message = _error(VOICEGATE_TRANSFER_ALLOWED_TARGETS="*")
    assert "transfer.allowed_targets" in message
    assert "not a SIP URI pattern" in message


def test_only_the_built_transfer_modes_are_accepted() -> None:
    message = _error(VOICEGATE_TRANSFER_DEFAULT_MODE="consultative")
    assert "transfer.default_mode" in message
    assert "blind" in message and "bridge" in message and "attended" in message


def test_a_configured_target_outside_allowed_targets_is_refused_at_load_time() -> None:
    message = _error(
        VOICEGATE_TRANSFER_ALLOWED_TARGETS="sip:*@cc.example.com",
        VOICEGATE_TRANSFER_HUMAN_TARGET="sip:boss@elsewhere.example",
    )
    assert "transfer.human_target" in message
    assert "matches no pattern of allowed_targets" in message


def test_matching_ignores_surrounding_space_only() -> None:
    assert target_allowed(" sip:a@b ", ("sip:*@b",))
    assert not target_allowed("sip:a@b;x=1", ("sip:a@b",))


@pytest.mark.parametrize(
    "value",
    [
        "sip:+4930555000@trunk.example.com",
        '"Acme Support" <sip:+4930555000@trunk.example.com>',
        '"Acme" <sip:+4930555000@trunk.example.com;user=phone>',
    ],
)
def test_a_caller_id_is_a_sip_uri_or_a_quoted_name_and_one(value: str) -> None:
    settings = load_settings(
        environ={"VOICEGATE_TRANSFER_CALLER_ID": value, "VOICEGATE_OUTBOUND_CALLER_ID": value}
    )
    assert settings.transfer.caller_id == value
    assert settings.outbound.caller_id == value


@pytest.mark.parametrize(
    "value",
    [
        "+4930555000",  # a number alone: the From needs a URI
        "<sip:a@b>",  # brackets without a display name
        '"Acme" sip:a@b',  # a display name needs the URI in <>
        '"Ac"me" <sip:a@b>',  # a quote inside the name
        '"Acme" <sip:a@b>;tag=1',  # the tag is pjsua's, per dialog
        "sip:a@b;tag=1",  # bare, its ;params are the From's own (RFC 3261 20.10): the same tag
        "sip:a@b;user=phone",  # bare: header parameters, not the URI's; write it in <>
        "sip:a@b,sip:c@d",  # bare, a comma would make two values of a single-valued header
        "sip:a@b\r\nX-Injected: 1",
        '"  " <sip:a@b>',
    ],
)
def test_a_caller_id_that_could_break_the_from_header_is_refused(value: str) -> None:
    for name in ("TRANSFER", "OUTBOUND"):
        message = _error(**{f"VOICEGATE_{name}_CALLER_ID": value})
        assert f"{name.lower()}.caller_id" in message
        assert "a SIP URI" in message


def test_a_consult_brief_names_a_prompt_file_that_exists() -> None:
    assert prompt_problems(load_settings(environ={})) == []  # consult_brief.wav is shipped
    assert prompt_problems(load_settings(environ={"VOICEGATE_TRANSFER_CONSULT_BRIEF": ""})) == []
    (problem,) = prompt_problems(
        load_settings(environ={"VOICEGATE_TRANSFER_CONSULT_BRIEF": "no_such_prompt"})
    )
    assert problem.startswith("transfer.consult_brief = 'no_such_prompt': no no_such_prompt.wav")
    assert "set it empty for no brief" in problem
    message = _error(VOICEGATE_TRANSFER_CONSULT_BRIEF="../etc/passwd")
    assert "transfer.consult_brief" in message
    message = _error(VOICEGATE_TRANSFER_CONSULT_COMPLETE="whenever")
    assert "transfer.consult_complete" in message and "after_brief" in message


def test_check_config_stops_on_a_consult_brief_without_its_prompt_file() -> None:
    root = Path(__file__).resolve().parents[2]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")}
    env = {"VOICEGATE_TRANSFER_CONSULT_BRIEF": "no_such_prompt", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "voicegate", "check-config"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "transfer.consult_brief = 'no_such_prompt'" in done.stderr
    assert done.stderr.count("\n") == 1  # one line an operator can read


def test_the_persons_keys_are_one_key_each_and_never_the_same() -> None:
    t = load_settings(environ={}).transfer
    assert (t.consult_accept_key, t.consult_decline_key) == ("1", "2")
    t = load_settings(
        environ={
            "VOICEGATE_TRANSFER_CONSULT_COMPLETE": "person",
            "VOICEGATE_TRANSFER_CONSULT_ACCEPT_KEY": "#",
            "VOICEGATE_TRANSFER_CONSULT_DECLINE_KEY": "",
        }
    ).transfer
    assert (t.consult_complete, t.consult_accept_key, t.consult_decline_key) == ("person", "#", "")
    for bad in ("11", "E", "x"):
        message = _error(VOICEGATE_TRANSFER_CONSULT_ACCEPT_KEY=bad)
        assert "transfer.consult_accept_key" in message and "0, 1, 2" in message
    message = _error(
        VOICEGATE_TRANSFER_CONSULT_ACCEPT_KEY="5", VOICEGATE_TRANSFER_CONSULT_DECLINE_KEY="5"
    )
    assert "transfer.consult_accept_key" in message and "transfer.consult_decline_key" in message
    assert "two different keys" in message
