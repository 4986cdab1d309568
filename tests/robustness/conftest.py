"""The robustness suite replays public SIP corpora against real servers (the same fixtures as
tests/integration). The corpora are data kept beside the repository, in ``../shared/sip-corpus``
(CI lays them there); without them these tests are skipped, and say why."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import server, server_factory  # noqa: F401  (the same fixtures)
from tests.robustness.protos import CORPUS

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if CORPUS.exists():
        return
    skip = pytest.mark.skip(reason=f"no SIP corpus at {CORPUS} (../shared beside the clone)")
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(skip)
