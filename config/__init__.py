"""voicegate settings: the schema, loading from TOML and ``VOICEGATE_*`` variables, validation.

This package imports no other package of voicegate; every layer may import it.
"""

from config.errors import ConfigError
from config.loader import load_settings
from config.reference import render_reference
from config.settings import (
    AgentSettings,
    AudioSettings,
    HttpSettings,
    LogSettings,
    MediaSettings,
    PoolSettings,
    SessionSettings,
    Settings,
    SipSettings,
    StorageSettings,
)

__all__ = [
    "AgentSettings",
    "AudioSettings",
    "ConfigError",
    "HttpSettings",
    "LogSettings",
    "MediaSettings",
    "PoolSettings",
    "SessionSettings",
    "Settings",
    "SipSettings",
    "StorageSettings",
    "load_settings",
    "render_reference",
]
