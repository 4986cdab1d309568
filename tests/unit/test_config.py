"""Loading settings: defaults, file, environment, precedence, the example file and the reference.

Error paths are in test_config_errors.py. Every test passes ``environ=`` explicitly and never
touches os.environ; tests that depend on relative paths chdir into tmp_path.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import config
from config import (
    AgentSettings,
    AudioSettings,
    ConfigError,
    HttpSettings,
    LogSettings,
    MediaSettings,
    PoolSettings,
    SessionSettings,
    Settings,
    SipSettings,
    StorageSettings,
    load_settings,
    render_reference,
)
from config.schema import KEYS, Kind, SchemaKey, from_env
from config.settings import FaultSettings, TransferSettings
from config.tools import KEY_DOCS as TOOL_KEY_DOCS
from config.tools import ToolSettings

EXAMPLE = Path(config.__file__).parent / "voicegate.example.toml"


def write(tmp_path: Path, text: str, name: str = "voicegate.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def defaults_in(cwd: Path) -> Settings:
    return Settings(
        sip=SipSettings(
            address="127.0.0.1",
            port=5060,
            max_setup_rate=20.0,
            numbers=(),
            user_agent="voicegate",
            answer_after_s=0.0,
            session_expires_s=1800,
            drain_deadline_s=60.0,
            shutdown_grace_s=5.0,
        ),
        media=MediaSettings(
            address="127.0.0.1",
            public_address="",
            rtp_port_min=20000,
            rtp_port_max=20999,
            codecs=("PCMU", "PCMA", "G722"),
            clock_rate=16000,
            fast_frame_copy=True,
            gap_threshold_s=1.0,
        ),
        audio=AudioSettings(
            agent_rate=16000,
            vad_aggressiveness=2,
            vad_frame_ms=20,
            vad_onset_ms=60,
            vad_hangover_ms=400,
            vad_detector="evidence",
            vad_margin_db=8.5,
            vad_window_ms=160,
            vad_floor_rise_db_per_s=3.0,
            turn_min_speech_ms=240,
            barge_in=True,
            barge_in_false_window_ms=2500,
            barge_in_min_speech_ms=60,
            barge_in_dtmf=True,
            playout_max_s=60.0,
        ),
        http=HttpSettings(address="127.0.0.1", port=8080),
        storage=StorageSettings(data_dir=(cwd / "voicegate-data").resolve()),
        session=SessionSettings(
            worker_name="worker-0",
            reap_after_s=120.0,
            heartbeat_s=5.0,
            reconcile_timeout_s=30.0,
            status_attempts=8,
            recovery_timeout_s=20.0,
            no_input_s=60.0,
            no_input_grace_s=10.0,
            max_duration_s=3600.0,
        ),
        pool=PoolSettings(
            workers=1,
            calls_per_worker=4,
            worker_address="127.0.0.1",
            worker_sip_port=5100,
            worker_http_port=8100,
            front_door=True,
            kamailio="kamailio",
            probe_interval_s=2,
            health_interval_s=1.0,
            health_timeout_s=5.0,
            health_failures=3,
            start_timeout_s=30.0,
            restart_backoff_s=0.5,
            restart_backoff_max_s=30.0,
        ),
        agent=AgentSettings(kind="demo", prompts_dir=None),
        transfer=TransferSettings(),
        log=LogSettings(level="info", format="auto", pjsip_level=1),
        faults=FaultSettings(crash_at=""),
        tools=(
            ToolSettings(
                name="charge",
                kind="write",
                endpoint="http://127.0.0.1:8090/v1/charges",
                status_endpoint="http://127.0.0.1:8090/v1/charges/{key}",
                timeout_s=5.0,
                approval="caller",
            ),
        ),
    )


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(environ={})
    assert settings == defaults_in(tmp_path)
    assert settings.storage.data_dir.is_absolute()
    assert settings.media.advertised_address == "127.0.0.1"


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.sip.port = 1  # type: ignore[misc]


def test_file_overrides_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(
        tmp_path,
        """
[sip]
port = 5070
numbers = ["100", "+4930123"]
shutdown_grace_s = 0   # an integer is fine for a float key

[media]
public_address = "203.0.113.7"
codecs = ["pcma", "G722"]   # case does not matter, the canonical spelling is kept
clock_rate = 8000

[storage]
data_dir = "state/here"

[agent]
prompts_dir = "/opt/prompts"

[log]
level = "DEBUG"
""",
    )
    s = load_settings(path, environ={})
    assert s.sip.port == 5070
    assert s.sip.numbers == ("100", "+4930123")
    assert s.sip.shutdown_grace_s == 0.0
    assert isinstance(s.sip.shutdown_grace_s, float)
    assert s.media.public_address == "203.0.113.7"
    assert s.media.advertised_address == "203.0.113.7"
    assert s.media.codecs == ("PCMA", "G722")
    assert s.media.clock_rate == 8000
    assert s.storage.data_dir == (tmp_path / "state" / "here").resolve()
    assert s.agent.prompts_dir == Path("/opt/prompts")
    assert s.log.level == "debug"
    # Untouched keys keep their defaults.
    assert s.http == HttpSettings()
    assert s.pool.calls_per_worker == 4


def test_env_beats_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[sip]\nport = 5070\nuser_agent = "from-file"\n')
    s = load_settings(path, environ={"VOICEGATE_SIP_PORT": "5080", "PATH": "/bin"})
    assert s.sip.port == 5080
    assert s.sip.user_agent == "from-file"


def test_env_values_of_every_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_settings(
        environ={
            "VOICEGATE_MEDIA_RTP_PORT_MIN": "30000",
            "VOICEGATE_MEDIA_RTP_PORT_MAX": " 30100 ",
            "VOICEGATE_MEDIA_CODECS": "G722, PCMU,",  # blanks and a trailing comma are dropped
            "VOICEGATE_SIP_NUMBERS": "100,200",
            "VOICEGATE_SIP_MAX_SETUP_RATE": "12.5",
            "VOICEGATE_STORAGE_DATA_DIR": "rel/dir",
            "VOICEGATE_AGENT_PROMPTS_DIR": "",
            "VOICEGATE_LOG_FORMAT": "Text",
        }
    )
    assert (s.media.rtp_port_min, s.media.rtp_port_max) == (30000, 30100)
    assert s.media.codecs == ("G722", "PCMU")
    assert s.sip.numbers == ("100", "200")
    assert s.sip.max_setup_rate == 12.5
    assert s.storage.data_dir == (tmp_path / "rel" / "dir").resolve()
    assert s.agent.prompts_dir is None
    assert s.log.format == "text"


def test_empty_env_list_is_empty_tuple() -> None:
    assert load_settings(environ={"VOICEGATE_SIP_NUMBERS": ""}).sip.numbers == ()


def test_voicegate_config_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[http]\nport = 9090\n")
    assert load_settings(environ={"VOICEGATE_CONFIG": str(path)}).http.port == 9090


def test_explicit_path_wins_over_voicegate_config(tmp_path: Path) -> None:
    path = write(tmp_path, "[http]\nport = 9090\n")
    other = write(tmp_path, "[http]\nport = 9191\n", name="other.toml")
    s = load_settings(path, environ={"VOICEGATE_CONFIG": str(other)})
    assert s.http.port == 9090


def test_empty_voicegate_config_means_no_file() -> None:
    assert load_settings(environ={"VOICEGATE_CONFIG": ""}).http.port == 8080


def test_env_bool_spellings() -> None:
    # No bool key exists yet; the conversion is exercised on a stand-in key.
    from config.rules import Rule

    flag = SchemaKey("x", "flag", Kind.BOOL, False, Rule("a boolean", lambda v: v), "test")
    for text, want in [("true", True), ("YES", True), ("1", True), ("no", False), ("0", False)]:
        assert from_env(flag, text) is want
    with pytest.raises(ValueError, match=r"^expected true/false, 1/0 or yes/no$"):
        from_env(flag, "maybe")


# ---- ports round-trip ------------------------------------------------------------------------

# Distinct loopback addresses, so that no port value collides with another service's port.
_APART = {
    "VOICEGATE_SIP_ADDRESS": "127.0.0.2",
    "VOICEGATE_HTTP_ADDRESS": "127.0.0.3",
    "VOICEGATE_MEDIA_ADDRESS": "127.0.0.4",
}


@given(port=st.integers(min_value=1, max_value=65535), which=st.sampled_from(["sip", "http"]))
def test_any_valid_port_round_trips(
    tmp_path_factory: pytest.TempPathFactory, port: int, which: str
) -> None:
    from_environment = load_settings(
        environ={**_APART, f"VOICEGATE_{which.upper()}_PORT": str(port)}
    )
    assert getattr(from_environment, which).port == port

    path = tmp_path_factory.mktemp("port") / "voicegate.toml"
    path.write_text(f"[{which}]\nport = {port}\n", encoding="utf-8")
    from_file = load_settings(path, environ=_APART)
    assert getattr(from_file, which).port == port


@given(port=st.integers().filter(lambda p: not 1 <= p <= 65535))
def test_any_invalid_port_is_refused(port: int) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(environ={"VOICEGATE_SIP_PORT": str(port)})
    assert str(err.value) == (
        f"sip.port = '{port}' (from VOICEGATE_SIP_PORT): expected an integer from 1 to 65535"
    )


# ---- the example file and the reference --------------------------------------------------------


def test_example_file_loads_to_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings(EXAMPLE, environ={}) == load_settings(environ={}) == defaults_in(tmp_path)


def test_example_file_sets_every_key() -> None:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    tools = data.pop("tools")
    written = {f"{section}.{name}" for section, table in data.items() for name in table}
    assert written == {k.dotted for k in KEYS}
    assert set(tools["charge"]) == set(TOOL_KEY_DOCS)


def test_example_file_says_what_each_key_allows() -> None:
    # The line just above each assignment is "# Allowed: <the rule's own phrase>.", so changing
    # a rule without the example fails here.
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    section = ""
    for i, line in enumerate(lines):
        if m := re.fullmatch(r"\[([\w.]+)\]", line):
            section = m[1]
        elif section.startswith("tools."):
            continue  # tool tables document their keys in prose (config/tools.py)
        elif m := re.match(r"(\w+) = ", line):
            k = next(k for k in KEYS if k.dotted == f"{section}.{m[1]}")
            assert lines[i - 1] == f"# Allowed: {k.rule.allowed}.", k.dotted
            assert lines[i - 2].startswith("# ") and "Allowed" not in lines[i - 2], k.dotted


def test_reference_has_one_row_per_key() -> None:
    # The settings' table, then (after a blank line) the tools' (tests/unit/test_config_tools.py).
    table = render_reference().split("\n\n", 1)[0].splitlines()
    assert table[0] == "| key | env var | default | allowed | description |"
    assert table[1] == "| --- | --- | --- | --- | --- |"
    assert len(table) == 2 + len(KEYS)
    assert table[2 + [k.dotted for k in KEYS].index("sip.port")] == (
        "| `sip.port` | `VOICEGATE_SIP_PORT` | `5060` | an integer from 1 to 65535 "
        "| SIP port, shared by UDP and TCP |"
    )
    assert '| `media.codecs` | `VOICEGATE_MEDIA_CODECS` | `["PCMU", "PCMA", "G722"]` |' in (
        render_reference()
    )
    assert '| `agent.prompts_dir` | `VOICEGATE_AGENT_PROMPTS_DIR` | `""` |' in render_reference()


def test_config_error_pickles_and_stays_one_line() -> None:
    err = ConfigError("a.b = 'x\ny': first", "second")
    assert isinstance(err, ValueError)
    assert str(err) == "a.b = 'x\\ny': first (and 1 more problem)"
    back = pickle.loads(pickle.dumps(err))
    assert back.problems == err.problems
    assert str(back) == str(err)
