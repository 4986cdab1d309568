"""The generated Kamailio configuration: Kamailio accepts it, and deploy/ is its output."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from session.store.nodes import NodeRecord, NodeWorker
from session.store.postgres import PostgresSessionStore
from voicegate.pool.front_door import find_executable, front_door_for
from voicegate.pool.kamailio_config import (
    FrontDoor,
    render_config,
    render_dispatcher_list,
    render_tls_config,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kamailio"
# The command deploy/kamailio/README.md gives for its two-host example.
EXAMPLE_ENV = {"VOICEGATE_SIP_ADDRESS": "203.0.113.10", "VOICEGATE_SIP_PORT": "5060"}
EXAMPLE_ARGS = [
    "front-door-config",
    "--worker", "hosta.0=sip:10.0.0.11:5100",
    "--worker", "hosta.1=sip:10.0.0.11:5101",
    "--worker", "hostb.0=sip:10.0.0.12:5100",
    "--worker", "hostb.1=sip:10.0.0.12:5101",
    "--run-dir", "/run/voicegate-front",
    "--list-file", "/etc/voicegate-front/dispatcher.list",
]  # fmt: skip


def door(tmp_path: Path, address: str = "127.0.0.1") -> FrontDoor:
    return FrontDoor(
        address=address,
        port=5060,
        ctl_socket=tmp_path / "ctl.sock",
        dispatcher_list=tmp_path / "dispatcher.list",
        runtime_dir=tmp_path,
    )


def kamailio_check(config: Path, runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    kamailio, _ = find_executable("kamailio")
    return subprocess.run(
        [kamailio, "-c", "-f", str(config), "-Y", str(runtime_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_kamailio_accepts_the_generated_configuration(tmp_path: Path) -> None:
    (tmp_path / "dispatcher.list").write_text(
        render_dispatcher_list([("w.0", "sip:127.0.0.1:5100"), ("w.1", "sip:127.0.0.1:5101")])
    )
    config = tmp_path / "kamailio.cfg"
    config.write_text(render_config(door(tmp_path)))
    result = kamailio_check(config, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "udp: 127.0.0.1" in result.stdout + result.stderr


def test_ipv6_addresses_are_bracketed(tmp_path: Path) -> None:
    text = render_config(door(tmp_path, "::1"))
    assert "listen=udp:[::1]:5060" in text
    assert render_dispatcher_list([("w.0", "sip:[::1]:5100")]).splitlines()[1] == (
        "1 sip:[::1]:5100 0 0 duid=w.0"
    )


def test_failover_covers_busy_unavailable_and_silence_but_not_other_answers(
    tmp_path: Path,
) -> None:
    text = render_config(door(tmp_path))
    assert 't_check_status("486|503")' in text
    assert "t_branch_timeout()" in text and 'ds_mark_dst("ip")' in text
    assert "record_route();" in text and "loose_route()" in text


def tls_door(tmp_path: Path) -> FrontDoor:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return front_door_for(
        "127.0.0.1", 5060, tmp_path, 2, 30.0, tls_port=5061, tls_cert_file=cert, tls_key_file=key
    )


def test_kamailio_accepts_the_tls_configuration_and_listens_on_tls(tmp_path: Path) -> None:
    door = tls_door(tmp_path)
    assert door.tls_config == tmp_path / "tls.cfg"
    (tmp_path / "dispatcher.list").write_text(render_dispatcher_list([("w.0", "sip:[::1]:5100")]))
    (tmp_path / "tls.cfg").write_text(render_tls_config(door))
    config = tmp_path / "kamailio.cfg"
    config.write_text(render_config(door))
    result = kamailio_check(config, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tls: 127.0.0.1 [127.0.0.1]:5061" in result.stdout + result.stderr


def test_tls_is_terminated_with_the_settings_pair_tls_1_2_up_and_no_client_check(
    tmp_path: Path,
) -> None:
    door = tls_door(tmp_path)
    text = render_config(door)
    assert "listen=tls:127.0.0.1:5061\nenable_tls=yes\n" in text
    assert f'loadmodule "tls.so"\nmodparam("tls", "config", "{tmp_path / "tls.cfg"}")' in text
    tls = render_tls_config(door)
    server = tls.split("[server:default]")[1].split("[client:default]")[0]
    assert f"certificate = {tmp_path / 'cert.pem'}" in server
    assert f"private_key = {tmp_path / 'key.pem'}" in server
    for section in (server, tls.split("[client:default]")[1]):
        assert "method = TLSv1.2+" in section
        assert "verify_certificate = no" in section and "require_certificate = no" in section
    # Without a TLS port, none of it.
    plain = render_config(door_without_tls := dataclasses.replace(door, tls_port=0))
    markers = ("listen=tls", "enable_tls", "tls.so", "X-Voicegate-Transport: tls")
    assert [marker for marker in markers if marker in plain] == []
    with pytest.raises(ValueError, match="tls_port"):
        render_tls_config(door_without_tls)


def test_only_the_front_door_says_a_call_came_over_tls(tmp_path: Path) -> None:
    for text in (render_config(door(tmp_path)), render_config(tls_door(tmp_path))):
        # A caller's own claim is removed, whether or not this front door speaks TLS.
        removed = text.index('remove_hf("X-Voicegate-Transport");')
        assert removed < text.index("record_route();")
    text = render_config(tls_door(tmp_path))
    appended = text.index('append_hf("X-Voicegate-Transport: tls\\r\\n");')
    assert text.index('remove_hf("X-Voicegate-Transport");') < appended
    assert text.rindex('if ($proto == "tls") {', 0, appended) > text.index("remove_hf(")
    assert "X-Voicegate-Transport: tls" not in render_config(door(tmp_path))


def test_a_caller_on_a_connection_is_reached_back_over_it(tmp_path: Path) -> None:
    text = render_config(tls_door(tmp_path))
    # The caller's Contact names its connection (requests and the caller's answers), and the
    # worker's in-dialog requests go to that connection, kept open through a long call.
    assert text.count("add_contact_alias();") == 2 and "onreply_route {" in text
    assert "handle_ruri_alias();" in text.split("route[WITHINDLG]")[1]
    assert "tcp_connection_lifetime=3605" in text


def test_front_door_config_writes_the_tls_config_beside_the_deployed_list(tmp_path: Path) -> None:
    pair = tls_door(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")}
    tls_env = {
        "VOICEGATE_SIP_TLS_PORT": "5061",
        "VOICEGATE_SIP_TLS_CERT_FILE": str(pair.tls_cert_file),
        "VOICEGATE_SIP_TLS_KEY_FILE": str(pair.tls_key_file),
    }
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "voicegate", *EXAMPLE_ARGS, "--out", str(out)],
        env={**env, **EXAMPLE_ENV, **tls_env},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    config = (out / "kamailio.cfg").read_text()
    assert 'modparam("tls", "config", "/etc/voicegate-front/tls.cfg")' in config
    assert "listen=tls:203.0.113.10:5061" in config
    assert f"certificate = {pair.tls_cert_file}" in (out / "tls.cfg").read_text()


def test_deploy_example_is_the_generators_output(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")}
    result = subprocess.run(
        [sys.executable, "-m", "voicegate", *EXAMPLE_ARGS, "--out", str(tmp_path)],
        env={**env, **EXAMPLE_ENV},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    for name in ("kamailio.cfg", "dispatcher.list"):
        assert (tmp_path / name).read_text() == (DEPLOY / name).read_text(), (
            f"deploy/kamailio/{name} is stale: rerun the command in deploy/kamailio/README.md"
        )
    # And Kamailio accepts the example (the list file path is the deployed one: point it here).
    shutil.copy(DEPLOY / "dispatcher.list", tmp_path / "dispatcher.list")
    config = tmp_path / "check.cfg"
    config.write_text(
        (DEPLOY / "kamailio.cfg")
        .read_text()
        .replace("/etc/voicegate-front/dispatcher.list", str(tmp_path / "dispatcher.list"))
        .replace("203.0.113.10", "127.0.0.1")
        .replace("/run/voicegate-front", str(tmp_path))
    )
    result_check = kamailio_check(config, tmp_path)
    assert result_check.returncode == 0, result_check.stdout + result_check.stderr


def test_a_bad_worker_spec_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "voicegate", "front-door-config", "--worker", "oops",
         "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")},
    )  # fmt: skip
    assert result.returncode == 2
    assert "expected NAME=sip:host:port" in result.stderr
    assert not (tmp_path / "kamailio.cfg").exists()


async def test_kamailio_log_lines_are_relayed_with_callers_masked() -> None:
    import asyncio
    import io

    from voicegate.pool.front_door import relay_masked

    stream = asyncio.StreamReader()
    stream.feed_data(
        b" 2(24199) ERROR: <core> [core/parser/msg_parser.c:749]: parse_msg(): message=<INVITE\n"
        b'From: "+15551230199" <sip:+15551230199@example.net>;tag=1344\n'
        b"Contact: <sip:5551230199@10.0.0.1:5060>\n"
    )
    stream.feed_eof()
    out = io.StringIO()
    await relay_masked(stream, out)
    text = out.getvalue()
    assert "parse_msg()" in text and "10.0.0.1:5060" in text
    assert "5551230" not in text
    assert text.count("***199") == 3  # the last three digits stay, as everywhere else


def _door_config(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voicegate", "front-door-config", *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("VOICEGATE_")} | env,
    )


def test_the_nodes_of_a_cluster_come_from_the_registry_or_a_file(
    tmp_path: Path, pg_url: str
) -> None:
    store = PostgresSessionStore(pg_url)
    try:
        for name, address, state in (("hosta", "10.0.0.11", "up"), ("hostb", "10.0.0.12", "up"),
                                     ("old", "10.0.0.13", "left")):  # fmt: skip
            workers = tuple(NodeWorker(f"{name}.{i}", f"sip:{address}:{5100 + i}") for i in (0, 1))
            store.node_heartbeat(NodeRecord(name, "i1", "http://x", workers, 1.0, 1.0, state))
    finally:
        store.close()
    made = _door_config(tmp_path / "store", "--from-store", VOICEGATE_STORAGE_URL=pg_url)
    assert made.returncode == 0, made.stderr
    listed = (tmp_path / "store" / "dispatcher.list").read_text()
    for uri in ("sip:10.0.0.11:5100", "sip:10.0.0.11:5101", "sip:10.0.0.12:5101"):
        assert uri in listed
    assert "10.0.0.13" not in listed  # a node that left is no destination
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"nodes": [{"name": "hosta", "workers": [
        {"name": "hosta.0", "sip": "sip:10.0.0.11:5100"}]}]}))  # fmt: skip
    made = _door_config(tmp_path / "file", "--nodes-file", str(nodes))
    assert made.returncode == 0, made.stderr
    assert "sip:10.0.0.11:5100" in (tmp_path / "file" / "dispatcher.list").read_text()


@pytest.mark.parametrize(
    ("content", "says"),
    [("{", "Expecting"), ('{"nodes": 3}', "nodes is not a list"), ('{"nodes": []}', "no node")],
)
def test_a_bad_nodes_file_is_refused_and_writes_nothing(
    tmp_path: Path, content: str, says: str
) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(content)
    made = _door_config(tmp_path / "out", "--nodes-file", str(nodes))
    assert made.returncode == 2 and says in made.stderr, made.stderr
    assert not (tmp_path / "out" / "kamailio.cfg").exists()
