"""How a pool's settings are split among its workers, and the collisions start-up refuses."""

from __future__ import annotations

import pytest

from config import ConfigError, load_settings
from config.workers import worker_settings, worker_slots

POOL = {
    "VOICEGATE_POOL_WORKERS": "3",
    "VOICEGATE_MEDIA_RTP_PORT_MIN": "20000",
    "VOICEGATE_MEDIA_RTP_PORT_MAX": "20999",
}


def test_one_worker_serves_the_settings_as_given() -> None:
    settings = load_settings(environ={})
    assert worker_settings(settings, 0) is settings
    [slot] = worker_slots(settings)
    assert (slot.name, slot.sip_port, slot.http_port) == ("worker-0", 5060, 8080)
    with pytest.raises(ValueError):
        worker_settings(settings, 1)


def test_workers_get_disjoint_ports_and_their_own_names() -> None:
    settings = load_settings(environ=POOL)
    slots = worker_slots(settings)
    assert [s.name for s in slots] == ["worker-0.0", "worker-0.1", "worker-0.2"]
    assert [s.sip_port for s in slots] == [5100, 5101, 5102]
    assert [s.http_port for s in slots] == [8100, 8101, 8102]
    assert [s.sip_uri for s in slots][1] == "sip:127.0.0.1:5101"
    ranges = [(s.rtp_port_min, s.rtp_port_max) for s in slots]
    assert ranges == [(20000, 20331), (20332, 20663), (20664, 20995)]
    for low, high in ranges:
        assert low % 2 == 0 and (high - low + 1) % 2 == 0  # RTP even, RTCP next
    w1 = worker_settings(settings, 1)
    assert (w1.sip.address, w1.sip.port) == ("127.0.0.1", 5101)
    assert (w1.http.address, w1.http.port) == ("127.0.0.1", 8101)
    assert (w1.media.rtp_port_min, w1.media.rtp_port_max) == (20332, 20663)
    assert w1.session.worker_name == "worker-0.1"
    # What is not the worker's own stays shared: store, policy, the pool itself.
    assert w1.storage == settings.storage and w1.pool == settings.pool


def test_rtp_range_must_hold_every_workers_calls() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(environ={**POOL, "VOICEGATE_MEDIA_RTP_PORT_MAX": "20020"})
    assert str(err.value).endswith(
        "the RTP range holds each of 3 workers 7 ports but 4 calls need 8 (2 per call)"
    )


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"VOICEGATE_SIP_PORT": "5101"}, "include sip.port, which Kamailio listens on"),
        ({"VOICEGATE_HTTP_PORT": "8102"}, "include http.port, which the supervisor serves"),
        ({"VOICEGATE_POOL_WORKER_SIP_PORT": "20010"}, "outside the RTP range"),
        ({"VOICEGATE_POOL_WORKER_HTTP_PORT": "5101"}, "SIP (TCP) and control ports overlap"),
        ({"VOICEGATE_POOL_WORKER_SIP_PORT": "65534"}, "would run past 65535"),
        (
            {"VOICEGATE_POOL_RESTART_BACKOFF_S": "40", "VOICEGATE_POOL_RESTART_BACKOFF_MAX_S": "9"},
            "must not exceed restart_backoff_max_s",
        ),
    ],
)
def test_pool_port_collisions_are_refused(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(environ={**POOL, **env})
    assert says in str(err.value)


def test_one_worker_ignores_the_pool_ports() -> None:
    # The pool's ports are unused with one worker, so they cannot collide with anything.
    assert load_settings(environ={"VOICEGATE_POOL_WORKER_SIP_PORT": "5060"}).pool.workers == 1
