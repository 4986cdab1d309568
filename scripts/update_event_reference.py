"""Rewrite docs/events.md from session/events.py, the machine's rule table and its handlers
(session/event_reference.py; tests/unit/test_event_reference.py fails while it differs).

.venv/bin/python scripts/update_event_reference.py
"""

from __future__ import annotations

from pathlib import Path

from session.event_reference import render_events
from voicegate.call.executor import IN_PROCESS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "events.md"


def main() -> None:
    PAGE.write_text(render_events(in_process=IN_PROCESS))


if __name__ == "__main__":
    main()
