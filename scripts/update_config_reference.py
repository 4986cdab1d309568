"""Rewrite docs/configuration.md's reference table from the schema (tests/unit/test_readme.py).

.venv/bin/python scripts/update_config_reference.py
"""

from __future__ import annotations

import re
from pathlib import Path

from config import render_reference

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main() -> None:
    text = REFERENCE.read_text()
    pattern = re.compile(r"(<!-- reference:start[^>]*-->\n)(.*?)(\n<!-- reference:end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit("docs/configuration.md has no reference markers")
    REFERENCE.write_text(
        pattern.sub(lambda m: m.group(1) + render_reference().strip() + m.group(3), text)
    )


if __name__ == "__main__":
    main()
