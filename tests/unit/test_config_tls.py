"""SIP over TLS and SRTP settings (issue 33): the relations config refuses, and the start-up
check of the certificate and key (voicegate/tls_files.py), which is exit 2 naming the key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from config import ConfigError, load_settings
from config.workers import worker_settings
from voicegate import cli
from voicegate.runtime import endpoint_config
from voicegate.tls_files import tls_problems


def _pair(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("tls")
    return {"a": _pair(d, "a"), "b": _pair(d, "b")}


def _env(cert: Path | str, key: Path | str, **more: str) -> dict[str, str]:
    return {
        "VOICEGATE_SIP_TLS_PORT": "5061",
        "VOICEGATE_SIP_TLS_CERT_FILE": str(cert),
        "VOICEGATE_SIP_TLS_KEY_FILE": str(key),
        **more,
    }


def test_the_default_has_no_tls_and_plain_rtp() -> None:
    s = load_settings(environ={})
    assert (s.sip.tls_port, s.sip.tls_cert_file, s.sip.tls_key_file) == (0, None, None)
    assert s.media.srtp == "off"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"VOICEGATE_SIP_TLS_PORT": "5061"}, ("sip.tls_cert_file =", "sip.tls_key_file =")),
        ({"VOICEGATE_MEDIA_SRTP": "mandatory"}, ("media.srtp =", "sip.tls_port = 0")),
        ({"VOICEGATE_SIP_TLS_PORT": "5060"}, ("sip.tls_port = 5060", "sip.port = 5060")),
    ],
)
def test_relations_config_refuses(env: dict[str, str], names: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ=env)
    problems = caught.value.problems
    assert any(all(n in p for n in names) for p in problems), problems


def test_a_certificate_without_a_port_is_refused(pairs: dict[str, tuple[Path, Path]]) -> None:
    cert, _ = pairs["a"]
    with pytest.raises(ConfigError, match=r"sip\.tls_cert_file"):
        load_settings(environ={"VOICEGATE_SIP_TLS_CERT_FILE": str(cert)})


def test_a_matching_pair_loads_with_mandatory_srtp(pairs: dict[str, tuple[Path, Path]]) -> None:
    s = load_settings(environ=_env(*pairs["a"], VOICEGATE_MEDIA_SRTP="mandatory"))
    assert s.media.srtp == "mandatory" and tls_problems(s) == []


def test_a_pool_serves_tls_at_its_front_door_only(pairs: dict[str, tuple[Path, Path]]) -> None:
    # docs/pool.md, "TLS and SRTP": Kamailio holds the listener and the pair; each worker keeps
    # its loopback UDP port and believes the front door's X-Voicegate-Transport.
    env = _env(*pairs["a"], VOICEGATE_POOL_WORKERS="2", VOICEGATE_MEDIA_SRTP="mandatory")
    s = load_settings(environ=env)
    assert tls_problems(s) == []
    worker = endpoint_config(worker_settings(s, 1))
    assert (worker.tls_port, worker.tls_cert_file, worker.tls_key_file) == (0, "", "")
    assert worker.trusted_source_header and worker.srtp == "mandatory"
    alone = endpoint_config(load_settings(environ=_env(*pairs["a"])))
    assert alone.tls_port == 5061 and not alone.trusted_source_header


def test_a_missing_file_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ=_env(tmp_path / "none.pem", tmp_path / "none.key"))
    problems = " ".join(caught.value.problems)
    assert "sip.tls_cert_file" in problems and "sip.tls_key_file" in problems, problems
    assert "no such file" in problems


def test_a_key_of_another_certificate_is_exit_2_naming_the_key(
    pairs: dict[str, tuple[Path, Path]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (cert, _), (_, other_key) = pairs["a"], pairs["b"]
    for name, value in _env(cert, other_key).items():
        monkeypatch.setenv(name, value)
    assert cli.main(["check-config"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "sip.tls_key_file" in err and "does not match sip.tls_cert_file" in err, err


def test_an_unreadable_or_non_pem_file_names_the_keys(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    cert, _ = pairs["a"]
    junk = tmp_path / "junk.key"
    junk.write_text("not a key\n")
    (problem,) = tls_problems(load_settings(environ=_env(cert, junk)))
    assert "sip.tls_cert_file" in problem and "sip.tls_key_file" in problem, problem


def test_a_tenant_may_require_tls_when_there_is_a_tls_listener(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    from voicegate.runtime import endpoint_config

    toml = tmp_path / "t.toml"
    toml.write_text(
        '[tenants.acme]\nnumbers = ["100"]\nrequire_tls = true\n'
        '[tenants.other]\nnumbers = ["200"]\n'
    )
    s = load_settings(toml, environ=_env(*pairs["a"]))
    assert [t.require_tls for t in s.tenants] == [True, False]
    assert endpoint_config(s).tls_tenants == frozenset({"acme"})
    with pytest.raises(ConfigError, match=r"tenants\.acme\.require_tls.*sip\.tls_port"):
        load_settings(toml, environ={})
