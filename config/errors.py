"""The one error type of the config package."""

from __future__ import annotations


class ConfigError(ValueError):
    """The settings could not be loaded.

    ``problems`` holds every problem found, each one line naming the key (or file, section or
    variable), the offending value and what is allowed. ``str()`` is the first problem, plus a
    count of the others, so a process that refuses to start prints one readable line.
    """

    def __init__(self, *problems: str) -> None:
        if not problems:
            raise TypeError("ConfigError needs at least one problem")
        # A problem must stay one line even if a value or path smuggles a newline into it.
        cleaned = tuple(p.replace("\r", "\\r").replace("\n", "\\n") for p in problems)
        # args are the problems themselves, so the error pickles back intact when a worker
        # process reports it to the supervisor.
        super().__init__(*cleaned)
        self.problems: tuple[str, ...] = cleaned

    def __str__(self) -> str:
        first, rest = self.problems[0], len(self.problems) - 1
        if rest == 0:
            return first
        return f"{first} (and {rest} more problem{'s' if rest > 1 else ''})"
