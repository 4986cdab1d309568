"""Every way loading settings can fail, and the one-line message each failure gives.

Messages are asserted whole: they are the interface an operator reads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from config import ConfigError, load_settings

SECTIONS = (
    "sip, media, audio, http, storage, session, pool, node, agent, transfer, outbound, log, "
    "faults, tools.<name>, tenants.<name>"
)


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "voicegate.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def env_error(**env: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_settings(environ=env)
    return err.value


def file_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    return err.value


@pytest.mark.parametrize(
    ("var", "text", "message"),
    [
        ("VOICEGATE_SIP_PORT", "abc", "expected an integer from 1 to 65535"),
        ("VOICEGATE_SIP_PORT", "0", "expected an integer from 1 to 65535"),
        ("VOICEGATE_SIP_PORT", "5060.0", "expected an integer from 1 to 65535"),
        ("VOICEGATE_POOL_CALLS_PER_WORKER", "4097", "expected an integer from 1 to 4096"),
        ("VOICEGATE_SIP_MAX_SETUP_RATE", "0", "expected a number > 0 and <= 60"),
        ("VOICEGATE_SIP_MAX_SETUP_RATE", "61", "expected a number > 0 and <= 60"),
        ("VOICEGATE_SIP_MAX_SETUP_RATE", "nan", "expected a number > 0 and <= 60"),
        ("VOICEGATE_SIP_MAX_SETUP_RATE", "fast", "expected a number > 0 and <= 60"),
        ("VOICEGATE_SIP_SHUTDOWN_GRACE_S", "-1", "expected a number from 0 to 300"),
        ("VOICEGATE_SIP_ANSWER_AFTER_S", "inf", "expected a number from 0 to 60"),
        ("VOICEGATE_MEDIA_FAST_FRAME_COPY", "maybe", "expected true/false, 1/0 or yes/no"),
        ("VOICEGATE_SIP_ADDRESS", "localhost", "expected an IPv4 or IPv6 address literal"),
        (
            "VOICEGATE_MEDIA_PUBLIC_ADDRESS",
            "0.0.0.0",
            "expected empty, or an IPv4 or IPv6 address literal, not a wildcard",
        ),
        ("VOICEGATE_MEDIA_RTP_PORT_MIN", "80", "expected an integer from 1024 to 65535"),
        ("VOICEGATE_MEDIA_CODECS", "OPUS", "each codec must be one of PCMU, PCMA, G722"),
        ("VOICEGATE_MEDIA_CODECS", "PCMU,pcmu", "codec PCMU is listed twice"),
        ("VOICEGATE_MEDIA_CODECS", "", "expected at least one codec, from PCMU, PCMA, G722"),
        ("VOICEGATE_MEDIA_CLOCK_RATE", "44100", "expected 8000 or 16000"),
        (
            "VOICEGATE_SIP_NUMBERS",
            "100,sip:200@example.com",
            "'sip:200@example.com' is not a SIP user part: give the bare user, no 'sip:', "
            "'@host', ';params' or spaces",
        ),
        ("VOICEGATE_SIP_USER_AGENT", "vg\r\nX-Evil: 1", "expected non-empty printable text"),
        ("VOICEGATE_SIP_USER_AGENT", " ", "expected non-empty printable text"),
        (
            "VOICEGATE_STORAGE_DATA_DIR",
            "",
            "expected a directory path (relative to the current directory)",
        ),
        ("VOICEGATE_STORAGE_DATA_DIR", "~/vg", "'~' is not expanded here: give the full path"),
        ("VOICEGATE_AGENT_KIND", "websocket", "expected one of demo, python, remote"),
        ("VOICEGATE_AGENT_CA_FILE", "/nonexistent/ca.pem", "no such file: /nonexistent/ca.pem"),
        ("VOICEGATE_LOG_LEVEL", "loud", "expected one of debug, info, warning, error"),
        ("VOICEGATE_LOG_FORMAT", "xml", "expected one of auto, json, text"),
        ("VOICEGATE_LOG_PJSIP_LEVEL", "7", "expected an integer from 0 to 6"),
        ("VOICEGATE_AUDIO_VAD_DETECTOR", "neural", "expected one of evidence, verdicts"),
        ("VOICEGATE_AUDIO_VAD_MARGIN_DB", "50", "expected a number from 0 to 40"),
    ],
)
def test_bad_env_value(var: str, text: str, message: str) -> None:
    key = var.removeprefix("VOICEGATE_").lower().replace("_", ".", 1)
    err = env_error(**{var: text})
    assert err.problems == (f"{key} = {text!r} (from {var}): {message}".replace("\r\n", "\\r\\n"),)


def test_the_briefs_examples_word_for_word(tmp_path: Path) -> None:
    assert str(env_error(VOICEGATE_SIP_PORT="abc")) == (
        "sip.port = 'abc' (from VOICEGATE_SIP_PORT): expected an integer from 1 to 65535"
    )
    path = write(tmp_path, '[media]\ncodecs = ["OPUS"]\n')
    assert str(file_error(path)) == (
        f"media.codecs = ['OPUS'] (from {path}): each codec must be one of PCMU, PCMA, G722"
    )


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[sip]\nport = "5060"',
            "sip.port = '5060' {src}: expected an integer from 1 to 65535, got a string",
        ),
        ("[sip]\nport = 70000", "sip.port = 70000 {src}: expected an integer from 1 to 65535"),
        (
            "[sip]\nport = true",
            "sip.port = True {src}: expected an integer from 1 to 65535, got a boolean",
        ),
        (
            "[sip]\nmax_setup_rate = false",
            "sip.max_setup_rate = False {src}: expected a number > 0 and <= 60, got a boolean",
        ),
        (
            "[sip]\nmax_setup_rate = inf",
            "sip.max_setup_rate = inf {src}: expected a number > 0 and <= 60",
        ),
        (
            '[media]\ncodecs = "PCMU"',
            "media.codecs = 'PCMU' {src}: expected a non-empty list of "
            "PCMU, PCMA, G722 (no repeats), got a string",
        ),
        (
            "[sip]\nnumbers = [100]",
            "sip.numbers = [100] {src}: expected a list of SIP user parts "
            'such as "100" or "+4930123" (empty = any), got an array holding an integer',
        ),
        (
            "[storage]\ndata_dir = 1979-05-27",
            "storage.data_dir = datetime.date(1979, 5, 27) {src}: "
            "expected a directory path (relative to the current directory), got a date/time",
        ),
        (
            "[http]\naddress = {a = 1}",
            "http.address = {{'a': 1}} {src}: expected an IPv4 or IPv6 "
            "address literal, got a table",
        ),
    ],
)
def test_bad_file_value(tmp_path: Path, toml: str, message: str) -> None:
    path = write(tmp_path, toml + "\n")
    assert file_error(path).problems == (message.format(src=f"(from {path})"),)


def test_unknown_section(tmp_path: Path) -> None:
    path = write(tmp_path, "[sipp]\nport = 5060\n")
    assert str(file_error(path)) == (
        f"[sipp] (from {path}): unknown section; did you mean [sip]? known sections: {SECTIONS}"
    )


def test_unknown_section_far_from_any(tmp_path: Path) -> None:
    path = write(tmp_path, "[zzz]\n")
    assert (
        str(file_error(path)) == f"[zzz] (from {path}): unknown section; known sections: {SECTIONS}"
    )


def test_unknown_key_suggests_the_nearest(tmp_path: Path) -> None:
    path = write(tmp_path, "[sip]\nprot = 5080\n")
    assert str(file_error(path)) == (
        f"sip.prot = 5080 (from {path}): unknown key; did you mean sip.port?"
    )


def test_key_in_the_wrong_section(tmp_path: Path) -> None:
    path = write(tmp_path, "[sip]\nrtp_port_min = 30000\n")
    assert str(file_error(path)) == (
        f"sip.rtp_port_min = 30000 (from {path}): unknown key; did you mean media.rtp_port_min?"
    )


def test_unknown_key_with_no_near_match(tmp_path: Path) -> None:
    path = write(tmp_path, "[log]\nzzzzzz = 1\n")
    assert str(file_error(path)) == f"log.zzzzzz = 1 (from {path}): unknown key"


def test_key_outside_any_section(tmp_path: Path) -> None:
    path = write(tmp_path, "port = 5080\n")
    assert str(file_error(path)) == (
        f"port = 5080 (from {path}): keys belong in a [section]; did you mean sip.port?"
    )


def test_section_that_is_not_a_table(tmp_path: Path) -> None:
    path = write(tmp_path, "sip = 5\n")
    assert str(file_error(path)) == f"sip = 5 (from {path}): expected a table [sip]"


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[sip]\nport 5060\n")
    # tomllib's wording may change between Python versions; the file and position may not.
    assert re.fullmatch(
        rf"config file {re.escape(str(path))}: invalid TOML: [^\n]+ \(at line 2, column 6\)",
        str(file_error(path)),
    )


def test_file_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, b'[sip]\nuser_agent = "\xff"\n')
    assert str(file_error(path)) == f"config file {path}: not UTF-8 text, which TOML requires"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    assert str(file_error(path)) == f"config file {path}: not found"


def test_missing_file_from_voicegate_config(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    assert str(env_error(VOICEGATE_CONFIG=str(path))) == (
        f"config file {path} (from VOICEGATE_CONFIG): not found"
    )


def test_directory_as_file(tmp_path: Path) -> None:
    assert str(file_error(tmp_path)) == f"config file {tmp_path}: cannot be read (Is a directory)"


def test_unknown_env_var_is_named_without_its_value() -> None:
    err = env_error(VOICEGATE_SIP_PROT="s3cret", VOICEGATE_CONFIG="")
    assert err.problems == (
        "VOICEGATE_SIP_PROT: unknown voicegate environment variable; did you mean "
        "VOICEGATE_SIP_PORT?",
    )


def test_unknown_env_var_with_no_near_match() -> None:
    assert str(env_error(VOICEGATE_ZZZZZZZZZZZZ="1")) == (
        "VOICEGATE_ZZZZZZZZZZZZ: unknown voicegate environment variable; see VOICEGATE_CONFIG "
        "and the reference"
    )


def test_other_variables_are_ignored() -> None:
    s = load_settings(environ={"VOICEGATEWAY": "x", "voicegate_sip_port": "1", "HOME": "/"})
    assert s.sip.port == 5060


def test_all_problems_are_collected(tmp_path: Path) -> None:
    path = write(tmp_path, '[sip]\nport = "x"\nprot = 1\n[xyzzy]\n')
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={"VOICEGATE_LOG_LEVEL": "loud"})
    src = f"(from {path})"
    assert err.value.problems == (
        f"sip.port = 'x' {src}: expected an integer from 1 to 65535, got a string",
        f"sip.prot = 1 {src}: unknown key; did you mean sip.port?",
        f"[xyzzy] {src}: unknown section; known sections: {SECTIONS}",
        "log.level = 'loud' (from VOICEGATE_LOG_LEVEL): expected one of debug, info, warning, "
        "error",
    )
    assert str(err.value) == err.value.problems[0] + " (and 3 more problems)"


def test_a_bad_file_value_is_reported_even_when_env_overrides_it(tmp_path: Path) -> None:
    # The file is wrong and will bite the next run without the variable: say so now.
    path = write(tmp_path, "[sip]\nport = 0\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={"VOICEGATE_SIP_PORT": "5070"})
    assert err.value.problems == (
        f"sip.port = 0 (from {path}): expected an integer from 1 to 65535",
    )


# ---- relations between keys --------------------------------------------------------------------


def test_rtp_range_must_hold_two_ports_per_call() -> None:
    env = {"VOICEGATE_MEDIA_RTP_PORT_MIN": "30000", "VOICEGATE_MEDIA_RTP_PORT_MAX": "30006"}
    assert str(env_error(**env)) == (
        "media.rtp_port_min = 30000 (from VOICEGATE_MEDIA_RTP_PORT_MIN), "
        "media.rtp_port_max = 30006 (from VOICEGATE_MEDIA_RTP_PORT_MAX), "
        "pool.calls_per_worker = 4: "
        "the RTP range holds 7 ports but 4 calls need 8 (2 per call)"
    )
    # One more port is enough; fewer calls need fewer ports.
    assert load_settings(environ={**env, "VOICEGATE_MEDIA_RTP_PORT_MAX": "30007"})
    fewer = load_settings(environ={**env, "VOICEGATE_POOL_CALLS_PER_WORKER": "3"})
    assert fewer.pool.calls_per_worker == 3


def test_rtp_min_must_be_below_max(tmp_path: Path) -> None:
    path = write(tmp_path, "[media]\nrtp_port_min = 21000\nrtp_port_max = 21000\n")
    assert str(file_error(path)) == (
        f"media.rtp_port_min = 21000 (from {path}), media.rtp_port_max = 21000 (from {path}): "
        "rtp_port_min must be below rtp_port_max"
    )


def test_wildcard_media_address_needs_a_public_address() -> None:
    assert str(env_error(VOICEGATE_MEDIA_ADDRESS="0.0.0.0")) == (
        "media.address = '0.0.0.0' (from VOICEGATE_MEDIA_ADDRESS), media.public_address = '': "
        "a wildcard media address needs a public_address to advertise in SDP"
    )
    s = load_settings(
        environ={"VOICEGATE_MEDIA_ADDRESS": "::", "VOICEGATE_MEDIA_PUBLIC_ADDRESS": "2001:db8::5"}
    )
    assert s.media.advertised_address == "2001:db8::5"


def test_sip_and_http_ports_must_differ_on_one_address() -> None:
    assert str(env_error(VOICEGATE_HTTP_PORT="5060", VOICEGATE_SIP_ADDRESS="0.0.0.0")) == (
        "sip.port = 5060, http.port = 5060 (from VOICEGATE_HTTP_PORT): "
        "SIP (TCP) and HTTP need different ports"
    )
    apart = {"VOICEGATE_HTTP_PORT": "5060", "VOICEGATE_HTTP_ADDRESS": "127.0.0.2"}
    assert load_settings(environ=apart).http.port == 5060


def test_sip_port_outside_the_rtp_range() -> None:
    assert str(env_error(VOICEGATE_SIP_PORT="20500")) == (
        "sip.port = 20500 (from VOICEGATE_SIP_PORT), media.rtp_port_min = 20000, "
        "media.rtp_port_max = 20999: the SIP port must lie outside the RTP range (both UDP)"
    )


def test_session_keys_are_validated() -> None:
    from config import ConfigError, load_settings

    with pytest.raises(ConfigError, match=r"session\.worker_name = 'a/b'"):
        load_settings(None, {"VOICEGATE_SESSION_WORKER_NAME": "a/b"})
    with pytest.raises(ConfigError, match=r"reap_after_s must be at least 3 x heartbeat_s"):
        load_settings(
            None, {"VOICEGATE_SESSION_REAP_AFTER_S": "20", "VOICEGATE_SESSION_HEARTBEAT_S": "10"}
        )
    settings = load_settings(None, {"VOICEGATE_SESSION_WORKER_NAME": "edge-2.b_x"})
    assert settings.session.worker_name == "edge-2.b_x"


def test_a_renamed_key_says_where_it_went(tmp_path: Path) -> None:
    path = tmp_path / "old.toml"
    path.write_text("[sip]\nmax_calls = 4\n")
    assert str(file_error(path)) == (
        f"sip.max_calls = 4 (from {path}): unknown key; it was renamed pool.calls_per_worker"
    )
    assert str(env_error(VOICEGATE_SIP_MAX_CALLS="4")) == (
        "VOICEGATE_SIP_MAX_CALLS: unknown voicegate environment variable; "
        "it was renamed VOICEGATE_POOL_CALLS_PER_WORKER"
    )


def test_the_evidence_detector_needs_20_ms_vad_frames() -> None:
    err = env_error(VOICEGATE_AUDIO_VAD_FRAME_MS="30")
    assert len(err.problems) == 1
    assert "audio.vad_detector" in err.problems[0] and "audio.vad_frame_ms" in err.problems[0]
    assert 'needs vad_frame_ms = 20 (or use "verdicts")' in err.problems[0]


def test_the_barge_in_tick_cannot_be_slower_than_the_steady_one() -> None:
    from config import load_settings

    err = env_error(VOICEGATE_AUDIO_TICK_MS="40", VOICEGATE_AUDIO_BARGE_IN_TICK_MS="60")
    assert len(err.problems) == 1
    assert (
        "audio.barge_in_tick_ms = 60" in err.problems[0] and "audio.tick_ms = 40" in err.problems[0]
    )
    assert "cannot exceed tick_ms" in err.problems[0]
    # Equal is allowed: one pace, as before the barge-in tick.
    same = load_settings(
        None, {"VOICEGATE_AUDIO_TICK_MS": "40", "VOICEGATE_AUDIO_BARGE_IN_TICK_MS": "40"}
    )
    assert (same.audio.tick_ms, same.audio.barge_in_tick_ms) == (40, 40)
