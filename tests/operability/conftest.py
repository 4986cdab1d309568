"""Operability tests run real peers: a pool (Kamailio, workers), SIPp, Prometheus, Chromium."""

from __future__ import annotations

from tests.integration.conftest import server_factory

__all__ = ["server_factory"]
