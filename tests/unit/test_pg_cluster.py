"""The PostgreSQL test tools themselves: tests/pg_cluster.py and tests/latency_proxy.py.

The shared store's tests trust these to give them a real server of their own, a database no other
test sees, data that outlives a crash of the server, and a database that is slow or unreachable
on demand; each of those is checked here against a real server, so that a store test failing
means the store, not its tools.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest

from tests import pg_cluster as pg_cluster_module
from tests.latency_proxy import LatencyProxy
from tests.pg_cluster import PgCluster, PgClusterError, running_cluster

# --- the cluster -----------------------------------------------------------------------------


def test_the_cluster_is_a_server_of_our_own(pg_cluster: PgCluster) -> None:
    with psycopg.connect(pg_cluster.url("postgres"), connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        port = conn.execute("SHOW port").fetchone()
        data_directory = conn.execute("SHOW data_directory").fetchone()
        fsync = conn.execute("SHOW fsync").fetchone()
    # Not the machine's server (5432): ours, in our temporary directory, on the port we chose.
    assert port == (str(pg_cluster.port),)
    assert data_directory is not None
    assert Path(data_directory[0]).resolve() == pg_cluster.data_dir.resolve()
    assert fsync == ("on",)  # the durability the store's crash tests count on
    assert pg_cluster.url("x") == f"postgresql://postgres@127.0.0.1:{pg_cluster.port}/x"


_seen_databases: list[str] = []  # the databases earlier runs of the test below were given


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_an_empty_database_of_its_own(pg_url: str, run: int) -> None:
    with psycopg.connect(pg_url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
        assert row is not None
        name = row[0]
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert tables == [], f"run {run}: the database is not empty"
        # The earlier run's database was dropped after it, not merely left beside this one.
        existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database").fetchall()}
        assert name not in _seen_databases
        assert existing.isdisjoint(_seen_databases)
        # What the other run must not find.
        conn.execute("CREATE TABLE leftover (n integer)")
        conn.execute("INSERT INTO leftover VALUES (%s)", [run])
    _seen_databases.append(name)


def test_committed_data_survives_a_kill_and_the_restart_keeps_the_port() -> None:
    with running_cluster() as cluster:
        url = cluster.url("postgres")
        port = cluster.port
        held = psycopg.connect(url, autocommit=True, connect_timeout=10)
        with held:
            held.execute("CREATE TABLE calls (id text PRIMARY KEY)")
            held.execute("INSERT INTO calls VALUES ('before the crash')")
            cluster.kill()
            # The outage, as a client sees it: its connection is gone, a new one is refused.
            with pytest.raises(psycopg.OperationalError):
                held.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=5).close()

        # Somebody took the port meanwhile: the restart fails and says why, log included.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            with pytest.raises(PgClusterError) as failure:
                cluster.restart()
        assert f"port {port}" in str(failure.value)
        assert "Address already in use" in str(failure.value)

        cluster.restart()
        assert cluster.port == port
        with psycopg.connect(url, connect_timeout=10) as conn:
            assert conn.execute("SELECT id FROM calls").fetchall() == [("before the crash",)]
        directory = cluster.directory
    assert not directory.exists()  # remove() deleted data, log and socket


def test_missing_binaries_fail_with_how_to_install_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no pg_config, no initdb on PATH
    monkeypatch.setattr(pg_cluster_module, "glob", SimpleNamespace(glob=lambda pattern: []))
    with pytest.raises(PgClusterError, match=r"not found: run scripts/bootstrap"):
        pg_cluster_module.find_bindir()
    with pytest.raises(PgClusterError, match=r"Debian package postgresql"):
        PgCluster().start()
    with pytest.raises(PgClusterError, match=str(tmp_path)):
        PgCluster(bindir=str(tmp_path)).start()


# --- the latency proxy -----------------------------------------------------------------------


def test_the_proxy_adds_its_delay_to_every_round_trip(pg_url: str, pg_cluster: PgCluster) -> None:
    rounds = 20
    with (
        LatencyProxy(pg_cluster.host, pg_cluster.port) as proxy,
        psycopg.connect(proxy.url_for(pg_url), autocommit=True, connect_timeout=10) as conn,
    ):
        assert proxy.delay_s == 0.0025  # 5 ms per round trip
        conn.execute("SELECT 1")  # the first query also prepares psycopg's types: not timed
        took: list[float] = []
        for _ in range(rounds):
            began = time.perf_counter()
            assert conn.execute("SELECT 1").fetchone() == (1,)
            took.append(time.perf_counter() - began)
    # Lower bounds only: each round trip crossed the proxy twice, each crossing delayed.
    assert min(took) >= 2 * proxy.delay_s, took
    assert sum(took) >= rounds * 2 * proxy.delay_s, took


def test_the_proxy_passes_data_intact_both_ways(pg_url: str, pg_cluster: PgCluster) -> None:
    payload = os.urandom(3 * 1024 * 1024)  # many chunks each way, in order or the digest differs
    with (
        LatencyProxy(pg_cluster.host, pg_cluster.port, delay_s=0.001) as proxy,
        psycopg.connect(proxy.url_for(pg_url), autocommit=True, connect_timeout=10) as conn,
    ):
        row = conn.execute("SELECT %s::bytea, md5(%s::bytea)", [payload, payload]).fetchone()
    assert row is not None
    echoed, digest = row
    assert digest == hashlib.md5(payload).hexdigest()  # what the server received
    assert echoed == payload  # what came back


def test_cut_makes_the_database_unreachable_until_restore(
    pg_url: str, pg_cluster: PgCluster
) -> None:
    with LatencyProxy(pg_cluster.host, pg_cluster.port) as proxy:
        proxied = proxy.url_for(pg_url)
        with psycopg.connect(proxied, autocommit=True, connect_timeout=10) as held:
            assert held.execute("SELECT 1").fetchone() == (1,)
            proxy.cut()
            with pytest.raises(psycopg.OperationalError):
                held.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(proxied, connect_timeout=5).close()
        # Unreachable, not down: the server itself still answers directly.
        with psycopg.connect(pg_url, connect_timeout=10) as direct:
            assert direct.execute("SELECT 1").fetchone() == (1,)

        proxy.restore()
        with psycopg.connect(proxied, connect_timeout=10) as again:
            assert again.execute("SELECT 1").fetchone() == (1,)


def test_url_for_keeps_everything_but_the_address() -> None:
    proxy = LatencyProxy("127.0.0.1", 5)
    proxy.port = 6543  # as start() sets it; nothing listens for this test
    assert (
        proxy.url_for("postgresql://postgres@127.0.0.1:41234/t_db?connect_timeout=3")
        == "postgresql://postgres@127.0.0.1:6543/t_db?connect_timeout=3"
    )
    assert proxy.url_for("postgresql://u:pw@db.example/x") == "postgresql://u:pw@127.0.0.1:6543/x"
