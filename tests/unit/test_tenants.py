"""Tenants (config/tenants.py, config/tenant_loader.py): who owns a call, whose key a request
carries, and the config that declares them, checked key by key with messages naming the fix."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config import ConfigError, load_settings
from config.tenant_loader import tenants_of
from config.tenants import Tenants, key_digest
from telephony.admission import Admission
from telephony.sip_message import arrived_over_tls, source_address

ACME_KEY = "acme-key-0123456789abcdef"
BETA_KEY = "beta-key-0123456789abcdef"
ACME = hashlib.sha256(ACME_KEY.encode()).hexdigest()
BETA = hashlib.sha256(BETA_KEY.encode()).hexdigest()

TWO_TENANTS = f"""
[transfer]
allowed_targets = ["sip:*@centre.example"]
notify_timeout_s = 30

[tenants.acme]
numbers = ["100", "101"]
api_keys = ["{ACME.upper()}"]
[tenants.acme.agent]
kind = "python"
factory = "tests.fixtures.agents:FailingAgent"
[tenants.acme.transfer]
default_target = "sip:queue@centre.example"
caller_id = '"Acme" <sip:+4930100@trunk.acme.example>'
[tenants.acme.outbound]
allowed_targets = ["sip:*@customers.acme.example"]
caller_id = "sip:+4930100@trunk.acme.example"

[tenants.beta]
trunks = ["203.0.113.0/24"]
api_keys = ["{BETA}"]
"""


def load(tmp_path: Path, text: str) -> Tenants:
    path = tmp_path / "voicegate.toml"
    path.write_text(text)
    return tenants_of(load_settings(path, environ={}))


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "voicegate.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    return [p.replace(f" (from {path})", "") for p in caught.value.problems]


def test_without_tables_one_default_tenant_is_the_top_level_settings() -> None:
    settings = load_settings(
        environ={"VOICEGATE_SIP_NUMBERS": "100", "VOICEGATE_HTTP_API_KEYS": ACME}
    )
    assert settings.tenants == ()  # nothing stored: derived, so a replace() of [agent] is seen
    (tenant,) = tenants_of(settings)
    assert (tenant.name, tenant.numbers, tenant.api_keys) == ("default", ("100",), (ACME,))
    assert tenant.agent == settings.agent and tenant.transfer == settings.transfer


def test_tenants_inherit_the_top_level_agent_and_transfer_key_by_key(tmp_path: Path) -> None:
    tenants = load(tmp_path, TWO_TENANTS)
    assert tenants.names == ("acme", "beta")
    acme, beta = tenants["acme"], tenants["beta"]
    assert acme.api_keys == (ACME,)  # the upper-case digest, lower-cased
    assert (acme.agent.kind, acme.agent.factory) == ("python", "tests.fixtures.agents:FailingAgent")
    assert acme.transfer.default_target == "sip:queue@centre.example"
    assert acme.transfer.notify_timeout_s == 30  # inherited from [transfer]
    assert acme.transfer.allowed_targets == ("sip:*@centre.example",)
    assert beta.agent.kind == "demo" and beta.transfer.default_target == ""
    # A tenant's caller id and outbound calls are its own; the top level's otherwise.
    assert acme.transfer.caller_id == '"Acme" <sip:+4930100@trunk.acme.example>'
    assert beta.transfer.caller_id == ""
    assert acme.outbound.allows("sip:bob@customers.acme.example")
    assert acme.outbound.caller_id == "sip:+4930100@trunk.acme.example"
    assert beta.outbound.allowed_targets == () and beta.outbound.caller_id == ""
    assert acme.outbound.ring_timeout_s == beta.outbound.ring_timeout_s == 30  # inherited


def test_a_call_goes_to_the_tenant_that_claims_it_most_specifically(tmp_path: Path) -> None:
    tenants = load(tmp_path, TWO_TENANTS)
    assert tenants.route("100", "198.51.100.7") == "acme"
    # beta owns every number its trunk sends, but acme's own numbers stay acme's.
    assert tenants.route("555", "203.0.113.9") == "beta"
    assert tenants.route("101", "203.0.113.9") == "acme"
    # Nobody owns 555 from elsewhere, nor a call whose source is unknown: 404.
    assert tenants.route("555", "198.51.100.7") is None
    assert tenants.route("555", "") is None


def test_an_api_key_acts_for_its_own_tenant_only(tmp_path: Path) -> None:
    tenants = load(tmp_path, TWO_TENANTS)
    found = tenants.by_key(ACME_KEY)
    assert found is not None and found.name == "acme"
    found = tenants.by_key(BETA_KEY)
    assert found is not None and found.name == "beta"
    assert tenants.by_key("") is None
    assert tenants.by_key(ACME) is None  # the digest is not the key
    assert tenants.by_key(ACME_KEY + " ") is None


@given(st.text(min_size=1, max_size=64))
def test_only_the_key_itself_matches_its_digest(key: str) -> None:
    tenants = load_tenants_with_key(key)
    found = tenants.by_key(key)
    assert found is not None and found.name == "default"
    assert tenants.by_key(key + "x") is None


def load_tenants_with_key(key: str) -> Tenants:
    return tenants_of(load_settings(environ={"VOICEGATE_HTTP_API_KEYS": key_digest(key)}))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[tenants.Acme]\nnumbers = ["1"]',
            "[tenants.Acme]: a tenant name is a lower-case letter, then letters, digits, - or _ "
            "(at most 32)",
        ),
        (
            '[tenants.acme]\nnumber = ["1"]',
            "tenants.acme.number: unknown key; known: numbers, trunks, api_keys, require_tls, "
            "[acme.agent], [acme.transfer], [acme.outbound]",
        ),
        (
            '[tenants.acme.outbound]\ncaller_id = "+4930100"',
            "tenants.acme.outbound.caller_id = '+4930100': expected empty, or a SIP URI such as "
            'sip:+4930123@trunk.example, or "Name" <sip:...>',
        ),
        (
            '[tenants.acme]\napi_keys = ["my-secret-key"]',
            "tenants.acme.api_keys = <redacted>: item 1 is not a SHA-256 hex digest (64 hex "
            "digits): store the key's digest, printf %s KEY | sha256sum, never the key",
        ),
        (
            '[tenants.acme]\ntrunks = ["carrier.example"]',
            "tenants.acme.trunks = ['carrier.example']: 'carrier.example' is not an IP address "
            "or network",
        ),
        (
            '[tenants.acme.agent]\nkind = "python"',
            'tenants.acme.agent.kind, tenants.acme.agent.factory: kind = "python" needs a '
            'factory such as "mypackage.agent:MyAgent"',
        ),
        (
            '[tenants.acme.agent]\nprompts_dir = "/tmp"',
            "tenants.acme.agent.prompts_dir: set it in the top-level section",
        ),
        (
            '[tenants.acme.agent]\nsecret = "short"',
            "tenants.acme.agent.secret = <redacted>: expected empty, or at least 16 printable "
            "characters",
        ),
        (
            '[tenants.acme.transfer]\ndefault_target = "sip:x@elsewhere.example"',
            "tenants.acme.transfer.default_target, tenants.acme.transfer.allowed_targets: "
            "sip:x@elsewhere.example matches no pattern of allowed_targets: add one that "
            "covers it",
        ),
        (
            '[sip]\nnumbers = ["100"]\n[tenants.acme]\nnumbers = ["100"]',
            "sip.numbers: with [tenants.*] declared, list each called number in the numbers of "
            "the tenant that owns it, and leave sip.numbers empty",
        ),
        (
            '[tenants.acme]\nnumbers = ["100"]\n[tenants.beta]\nnumbers = ["100"]',
            "tenants.beta.numbers: number '100' is already claimed by tenant 'acme' from any "
            "source: give one of them trunks, or drop the number",
        ),
        (
            "[tenants.acme]\n[tenants.beta]",
            "tenants.beta.numbers: every number (numbers empty) is already claimed by tenant "
            "'acme' from any source: give one of them trunks, or drop the number",
        ),
        (
            f'[tenants.acme]\nnumbers = ["1"]\napi_keys = ["{ACME}"]\n'
            f'[tenants.beta]\nnumbers = ["2"]\napi_keys = ["{ACME}"]',
            "tenants.beta.api_keys: a digest also listed by tenant 'acme': a key acts for one "
            "tenant only",
        ),
    ],
)
def test_bad_tenant_tables_are_refused_naming_the_key_and_the_fix(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert problems(tmp_path, text) == [expected]


def test_a_key_pasted_where_its_digest_belongs_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"VOICEGATE_HTTP_API_KEYS": ACME_KEY})
    assert ACME_KEY not in str(caught.value.problems)
    assert "http.api_keys = <redacted>" in caught.value.problems[0]


def test_admission_refuses_a_call_no_tenant_owns_and_names_the_owner(tmp_path: Path) -> None:
    tenants = load(tmp_path, TWO_TENANTS)
    adm = Admission(max_calls=4, rate=50, route=tenants.route)
    taken = adm.decide(live_calls=0, called_user="100", now=0, source="198.51.100.7")
    assert (taken.status, taken.tenant) == (None, "acme")
    refused = adm.decide(live_calls=0, called_user="555", now=1, source="198.51.100.7")
    assert (refused.status, refused.reason) == (404, "unknown_number")


@pytest.mark.parametrize(
    ("src", "whole", "trust", "expected"),
    [
        ("203.0.113.9:5060", "", False, "203.0.113.9"),
        ("[2001:db8::1]:5060", "", False, "2001:db8::1"),
        # A caller's own header is ignored unless the worker sits behind our front door.
        ("127.0.0.1:5060", "INVITE x\r\nX-Voicegate-Source: 203.0.113.9\r\n", False, "127.0.0.1"),
        ("127.0.0.1:5060", "INVITE x\r\nx-voicegate-source: 203.0.113.9\r\n", True, "203.0.113.9"),
        ("127.0.0.1:5060", "INVITE x\r\n", True, ""),
    ],
)
def test_the_source_address_of_an_invite(src: str, whole: str, trust: bool, expected: str) -> None:
    assert source_address(src, whole, trust_header=trust) == expected


TLS_CONTACT = "<sip:127.0.0.1:5061;transport=tls>"
UDP_CONTACT = "<sip:127.0.0.1:5100>"


@pytest.mark.parametrize(
    ("contact", "whole", "trust", "expected"),
    [
        # Alone: the transport it really came on, whatever the caller writes.
        (TLS_CONTACT, "INVITE x\r\n", False, True),
        ("sips:127.0.0.1:5061", "INVITE x\r\n", False, True),
        (UDP_CONTACT, "INVITE x\r\nX-Voicegate-Transport: tls\r\n", False, False),
        (UDP_CONTACT, "INVITE x\r\nVia: SIP/2.0/TLS 192.0.2.1\r\n", False, False),
        # Behind the front door (loopback UDP): its header, which it sets only for TLS.
        (UDP_CONTACT, "INVITE x\r\nx-voicegate-transport: TLS\r\n", True, True),
        (UDP_CONTACT, "INVITE x\r\nX-Voicegate-Transport: udp\r\n", True, False),
        (UDP_CONTACT, "INVITE x\r\n", True, False),
    ],
)
def test_whether_an_invite_came_over_tls(
    contact: str, whole: str, trust: bool, expected: bool
) -> None:
    assert arrived_over_tls(contact, whole, trust_header=trust) is expected
