"""README.md promises: the configuration reference it links (docs/configuration.md) is the schema's,
and CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

from config import render_reference

ROOT = Path(__file__).resolve().parents[2]


def test_readme_configuration_reference_matches_the_schema() -> None:
    assert "docs/configuration.md" in (ROOT / "README.md").read_text()
    reference = (ROOT / "docs" / "configuration.md").read_text()
    pattern = r"<!-- reference:start[^>]*-->\n(.*?)\n<!-- reference:end -->"
    match = re.search(pattern, reference, re.S)
    assert match, "docs/configuration.md lost its reference markers"
    assert match.group(1).strip() == render_reference().strip()


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "scripts/test" in readme
    assert "exec scripts/test" in (ROOT / ".ci" / "run").read_text()
