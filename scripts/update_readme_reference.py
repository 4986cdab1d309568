"""Rewrite README.md's configuration reference from the schema (tests/unit/test_readme.py).

.venv/bin/python scripts/update_readme_reference.py
"""

from __future__ import annotations

import re
from pathlib import Path

from config import render_reference

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    text = README.read_text()
    pattern = re.compile(r"(<!-- reference:start[^>]*-->\n)(.*?)(\n<!-- reference:end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit("README.md has no reference markers")
    README.write_text(
        pattern.sub(lambda m: m.group(1) + render_reference().strip() + m.group(3), text)
    )


if __name__ == "__main__":
    main()
