"""Settings reach the SIP thread: every key endpoint_config() carries comes from its setting."""

from __future__ import annotations

from config import load_settings
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
        },
    )
    cfg = endpoint_config(settings)
    assert cfg.playout_max_ms == 12_500
    assert cfg.gap_threshold_s == 2.0
    assert cfg.session_expires_s == 600
    assert cfg.numbers == frozenset({"100", "200"})
    assert cfg.fast_copy is False
