"""API keys on real servers (docs/api.md "Authentication"): a request without a key or with a wrong
one is a JSON 401, another tenant's session a JSON 403, and each key sees its own tenant only;
health stays open and /metrics open on loopback; a pool's supervisor and its workers hold the
same rules; and an API bound beyond loopback with no key refuses to start (exit 2)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from session.store.sqlite import SqliteSessionStore
from tests.integration.harness import ROOT, Server, ServerFactory, Sipp, wait_for
from tests.integration.test_pool import pool_env
from tests.secret_audit import AUDIT

ACME_KEY = "acme-api-key-5b0e8c21d7f94a3e"
BETA_KEY = "beta-api-key-91c2f7a0e3d84b6c"
for _key, _who in ((ACME_KEY, "acme"), (BETA_KEY, "beta")):
    AUDIT.register(_key, f"API key of tenant {_who}", "tests/integration/test_api_keys.py")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


TENANTS = f"""
[tenants.acme]
numbers = ["100"]
api_keys = ["{digest(ACME_KEY)}"]

[tenants.beta]
api_keys = ["{digest(BETA_KEY)}"]
"""


def tenants_config(tmp_path: Path) -> str:
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS)
    return str(path)


def www_authenticate(server: Server, path: str, key: str) -> str | None:
    answer = server.request("GET", path, key=key)
    assert answer is not None, f"GET {path}: nothing answered"
    return answer.headers.get("WWW-Authenticate") if answer.status >= 400 else None


def test_keys_let_each_tenant_see_its_own_calls_only(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(VOICEGATE_CONFIG=tenants_config(tmp_path), PYTHONPATH=str(ROOT))
    for number in ("100", "555"):
        sipp = Sipp(
            "uac-server-hangup.xml", server.sip_target, tmp_path / number, extra=("-s", number)
        )
        assert sipp.run() == 0, sipp.errors()

    def ended(key: str) -> list[dict[str, object]] | None:
        status, body = server.http("/v1/sessions?state=ended", key=key)
        assert status == 200, body
        return body["sessions"] or None

    (acme,) = wait_for(lambda: ended(ACME_KEY), 15, "acme's session to end")
    (beta,) = wait_for(lambda: ended(BETA_KEY), 15, "beta's session to end")
    assert (acme["tenant"], beta["tenant"]) == ("acme", "beta")
    beta_id = beta["session_id"]

    # No key, a malformed header, a wrong key: 401 with a JSON body, and nothing said.
    for path in ("/v1/sessions", f"/v1/sessions/{beta_id}", "/v1/calls"):
        status, body = server.http(path, key="")
        assert (status, body["reason"]) == (401, "missing_key"), body
        assert beta_id not in str(body)
    status, body = server.http("/v1/sessions", key="not-a-key-anyone-holds")
    assert (status, body["reason"]) == (401, "wrong_key")
    assert www_authenticate(server, "/v1/sessions", "") == 'Bearer realm="voicegate"'
    assert (
        www_authenticate(server, "/v1/sessions", "wrong")
        == 'Bearer realm="voicegate" error="invalid_token"'
    )
    assert server.post(f"/v1/calls/{beta_id}/hangup", key="") == 401

    # acme's key about beta's session: 403, in every route that names one.
    for path in (
        f"/v1/sessions/{beta_id}",
        f"/v1/sessions/{beta_id}/handoff",
        f"/v1/calls/{beta_id}",
    ):
        status, body = server.http(path, key=ACME_KEY)
        assert (status, body["reason"]) == (403, "other_tenant"), (path, body)
        assert "events" not in body and "meta" not in body
    status, body = server.http(f"/v1/sessions/{beta_id}", key=BETA_KEY)
    assert status == 200 and body["tenant"] == "beta"

    # Health and (from loopback) metrics need no key; refusals are counted by reason.
    assert server.http("/healthz", key="")[0] == 200
    assert server.http("/readyz", key="")[0] == 200
    assert server.metric("voicegate_api_requests_refused_total", reason="missing_key") == 5
    assert server.metric("voicegate_api_requests_refused_total", reason="wrong_key") == 2
    assert server.metric("voicegate_api_requests_refused_total", reason="other_tenant") == 3


def test_an_api_beyond_loopback_without_a_key_refuses_to_start(tmp_path: Path) -> None:
    env = Server(tmp_path / "open", env_overrides={"VOICEGATE_HTTP_ADDRESS": "0.0.0.0"}).env
    result = subprocess.run(
        [sys.executable, "-m", "voicegate", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert "http.address = '0.0.0.0'" in result.stderr
    assert "set http.api_keys to SHA-256 digests" in result.stderr
    assert not (tmp_path / "open" / "voicegate.sqlite3").exists()  # nothing was started


def test_the_pool_and_its_workers_hold_the_same_keys(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    pool = server_factory(
        "pool", **pool_env(2), VOICEGATE_CONFIG=tenants_config(tmp_path), PYTHONPATH=str(ROOT)
    )
    status, body = pool.http("/v1/calls", key="")
    assert (status, body["reason"]) == (401, "missing_key")
    status, body = pool.http("/v1/pool", key=ACME_KEY)
    assert status == 200, body
    # The supervisor sends the caller's key on to each worker, which answers for that tenant.
    status, body = pool.http("/v1/calls", key=ACME_KEY)
    assert (status, body["unreachable_workers"]) == (200, []), body
    # A worker's own control port is held to the same rules.
    worker = Server(tmp_path / "w0", http_port=int(body_port(pool)))
    assert worker.http("/v1/calls", key="")[0] == 401
    assert worker.http("/v1/calls", key=BETA_KEY)[0] == 200
    assert worker.http("/healthz", key="")[0] == 200


def body_port(pool: Server) -> str:
    status, body = pool.http("/v1/pool", key=ACME_KEY)
    assert status == 200
    return str(body["workers"][0]["control"]).rsplit(":", 1)[1]


def post_for(server: Server, path: str, key: str) -> tuple[int, dict[str, object]]:
    answer = server.request("POST", path, data=b"", key=key)
    assert answer is not None, f"POST {path}: nothing answered"
    body = answer.json()
    if answer.status < 400:
        AUDIT.learn(body, f"POST {path}")  # registers the handle: no log may hold it
    return answer.status, body


def test_a_tenant_gets_a_new_resume_handle_for_its_own_open_session_only(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(VOICEGATE_CONFIG=tenants_config(tmp_path), PYTHONPATH=str(ROOT))
    sipp = Sipp("uac-wait-for-bye.xml", server.sip_target, tmp_path, extra=("-s", "100")).start()
    try:
        calls = wait_for(
            lambda: server.http("/v1/calls", key=ACME_KEY)[1]["calls"] or None, 10, "the call"
        )
        call_id = calls[0]["call_id"]
        path = f"/v1/sessions/{call_id}/resume"
        assert post_for(server, path, "")[0] == 401
        status, body = post_for(server, path, BETA_KEY)
        assert (status, body["reason"]) == (403, "other_tenant")
        assert "resume_handle" not in body
        first = post_for(server, path, ACME_KEY)
        second = post_for(server, path, ACME_KEY)
        assert first[0] == second[0] == 201, (first, second)
        texts = [str(first[1]["resume_handle"]), str(second[1]["resume_handle"])]
        assert texts[0] != texts[1]
        # Stored as digests; the newer supersedes the older (and the one issued at the start).
        store = SqliteSessionStore(server.data_dir / "voicegate.sqlite3")
        try:
            records = [store.resume_handle(t.split(".")[1]) for t in texts]
        finally:
            store.close()
        assert [r.state if r else None for r in records] == ["superseded", "current"]
        verifier = texts[1].split(".")[2]
        assert records[1] is not None
        assert records[1].verifier_digest == hashlib.sha256(verifier.encode()).hexdigest()
        assert all(verifier not in line for line in server.log().splitlines())
        assert server.metric("voicegate_resume_handles_issued_total", reason="api") == 2
        assert server.post(f"/v1/calls/{call_id}/hangup", key=ACME_KEY) == 202
        wait_for(
            lambda: server.http(f"/v1/sessions/{call_id}", key=ACME_KEY)[1]["ended"], 10, "the end"
        )
        status, body = post_for(server, path, ACME_KEY)
        assert status == 409 and "resume_handle" not in body
    finally:
        sipp.wait()
