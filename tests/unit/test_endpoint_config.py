"""Settings reach the SIP thread: every key endpoint_config() carries comes from its setting."""

from __future__ import annotations

import asyncio

from config import load_settings
from telephony.endpoint import SipEndpoint
from voicegate.runtime import endpoint_config


def test_settings_reach_the_endpoint_config() -> None:
    settings = load_settings(
        None,
        {
            "VOICEGATE_AUDIO_PLAYOUT_MAX_S": "12.5",
            "VOICEGATE_MEDIA_GAP_THRESHOLD_S": "2",
            "VOICEGATE_SIP_SESSION_EXPIRES_S": "600",
            "VOICEGATE_SIP_NUMBERS": "100,200",
            "VOICEGATE_MEDIA_FAST_FRAME_COPY": "false",
            "VOICEGATE_MEDIA_RESAMPLE_QUALITY": "4",
        },
    )
    cfg = endpoint_config(settings)
    assert cfg.playout_max_ms == 12_500
    assert cfg.gap_threshold_s == 2.0
    assert cfg.session_expires_s == 600
    assert cfg.numbers == frozenset({"100", "200"})
    assert cfg.fast_copy is False
    assert cfg.resample_quality == 4


def test_the_sip_thread_blocks_until_its_next_own_deadline() -> None:
    # Commands wake it (telephony.sip_wake); its own deadlines bound how long it may block.
    loop = asyncio.new_event_loop()
    sip = SipEndpoint(endpoint_config(load_settings(None, {})), loop, lambda event: None)
    try:
        assert sip._wait_ms(now=100.0, next_health=100.2) == 1000  # idle: no call to watch
        sip._calls["c1"] = object()  # type: ignore[assignment]
        assert sip._wait_ms(now=100.0, next_health=100.2) == 200  # the next media-health poll
        sip._ports.graveyard.append((100.05, object()))  # type: ignore[arg-type]
        assert sip._wait_ms(now=100.0, next_health=100.2) == 50  # a port due back in the pool
        assert sip._wait_ms(now=100.3, next_health=100.2) == 1  # overdue: poll, never block
    finally:
        sip._waker.close()
        loop.close()
