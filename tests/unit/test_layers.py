"""The layers' dependencies point one way (ARCHITECTURE.md, "Layout").

``voicegate -> telephony, agents, audio, session, config``; ``telephony -> audio``; ``session``
depends on nothing of ours but ``config``; ``config`` and ``audio`` on nothing of ours at all;
``agents`` never reaches into ``telephony`` or back up into ``voicegate``; and no package imports
``tests``. Every import statement counts, wherever it is: at module level, inside a function,
under ``if TYPE_CHECKING:`` (a cycle hidden from the interpreter is still a cycle). Each module is
parsed (ast), never imported, so a violation is reported as the importing file, its line and the
import, whether or not the import would run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Every top-level package of ours, whether installed (pyproject.toml) or not: an import of one of
# these is an import of our own code; anything else is the standard library or a third party.
OURS = frozenset(
    {"config", "session", "audio", "telephony", "agents", "voicegate", "providers", "examples"}
    | {"integrations"}
    | {"tests", "bench", "scripts"}
)


@dataclass(frozen=True, slots=True)
class Rule:
    only: frozenset[str] | None = None  # the packages of ours it may import besides itself
    never: frozenset[str] = frozenset()  # or: the ones it must not

    def refuses(self, package: str, top: str) -> str | None:
        """Why ``package`` may not import ``top`` (a package of ours), or None."""
        if top == package:
            return None
        if top == "tests":
            return "no package imports tests"
        if self.only is not None and top not in self.only:
            if not self.only:
                return f"{package} may import nothing of ours but {package}"
            return f"{package} may import only {', '.join([package, *sorted(self.only)])}"
        if top in self.never:
            return f"{package} must not import {' or '.join(sorted(self.never))}"
        return None


RULES = {
    "config": Rule(only=frozenset()),
    "audio": Rule(only=frozenset()),
    "session": Rule(only=frozenset({"config"})),
    # telephony does not import config either (it is handed plain values): keep it so.
    "telephony": Rule(only=frozenset({"audio"})),
    "agents": Rule(never=frozenset({"voicegate", "telephony"})),
    "voicegate": Rule(),
    "providers": Rule(),
    "examples": Rule(),
    # A framework's bot installs voicegate[pipecat] to speak the protocol; it needs nothing of
    # the server, so the integration is written from docs/agent-protocol.md alone.
    "integrations": Rule(only=frozenset()),
}
# bench/ and scripts/ are not packages (no __init__.py, not installed): tools run from a
# checkout. bench/ drives the servers with the integration tests' harness (tests/integration/
# harness.py) by design, so it is not held to the rule on tests.


@dataclass(frozen=True, slots=True)
class Import:
    path: Path  # relative to ROOT
    line: int
    module: str  # as written, made absolute for a relative import

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: import {self.module}"


def _module_package(path: Path) -> list[str]:
    """The dotted package a file's relative imports start from (``path`` relative to ROOT)."""
    parts = list(path.with_suffix("").parts)
    return parts[:-1]  # a module's package; for __init__.py, the package itself


def imports_of(path: Path, source: str) -> Iterator[Import]:
    """Every import in ``source`` (the file at ``path``, relative to ROOT), relative ones made
    absolute."""
    tree = ast.parse(source, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _module_package(path)
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                assert node.module is not None
                module = node.module
            yield Import(path, node.lineno, module)


def files_of(package: str) -> list[Path]:
    return sorted(p.relative_to(ROOT) for p in (ROOT / package).rglob("*.py"))


def violations(package: str, found: Iterator[Import]) -> list[str]:
    """The imports of ours that ``package`` may not make, each with why."""
    rule = RULES[package]
    return [
        f"{imp} ({why})"
        for imp in found
        if imp.top in OURS and (why := rule.refuses(package, imp.top)) is not None
    ]


@pytest.mark.parametrize("package", sorted(RULES))
def test_dependencies_point_one_way(package: str) -> None:
    files = files_of(package)
    assert files, f"no Python files under {package}/: is ROOT ({ROOT}) the repository?"
    bad = [
        v
        for path in files
        for v in violations(package, imports_of(path, (ROOT / path).read_text(encoding="utf-8")))
    ]
    assert not bad, f"{package}/ imports against ARCHITECTURE.md's layers:\n" + "\n".join(bad)


def test_every_package_of_ours_has_a_rule() -> None:
    # A package added later gets a row in RULES (and a line in ARCHITECTURE.md's layout).
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages <= set(RULES), f"no layer rule for {sorted(packages - set(RULES))}"


# --- the checker itself -------------------------------------------------------------------------


def _check(path: str, source: str) -> list[str]:
    return violations(Path(path).parts[0], imports_of(Path(path), source))


def test_a_wrong_way_import_is_named_with_its_file_line_and_module() -> None:
    source = "import json\n\n\ndef f():\n    from voicegate.observe import metrics\n"
    assert _check("session/machine.py", source) == [
        "session/machine.py:5: import voicegate.observe (session may import only session, config)"
    ]


def test_imports_under_type_checking_count() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import config.settings\n"
    assert _check("audio/frame.py", source) == [
        "audio/frame.py:3: import config.settings (audio may import nothing of ours but audio)"
    ]


def test_relative_imports_are_resolved_and_tests_are_off_limits() -> None:
    assert _check("agents/remote/link.py", "from ..base import Agent\nfrom . import dial\n") == []
    assert _check("agents/remote/link.py", "from tests.fixtures import speech\n") == [
        "agents/remote/link.py:1: import tests.fixtures (no package imports tests)"
    ]
    assert _check("agents/demo.py", "import telephony.calls\nimport session.backoff\n") == [
        "agents/demo.py:1: import telephony.calls (agents must not import telephony or voicegate)"
    ]
