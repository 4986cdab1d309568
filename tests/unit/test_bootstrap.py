"""scripts/bootstrap's two profiles (README's two commands): serving installs what
``voicegate serve`` needs on its embedded defaults and nothing the tests alone need, and the test
command still gets everything, in the same .venv.

The script is run for real, with a PATH holding only the few tools it calls and stand-ins for
the rest (apt-get, the venv's python), so what it would install is seen without installing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "scripts" / "bootstrap"
BASH = shutil.which("bash") or "/bin/bash"
# Needed by the tests alone (or by a pool, which the embedded defaults are not).
TEST_ONLY = {
    "sip-tester",
    "tcpdump",
    "kamailio",
    "kamailio-tls-modules",
    "prometheus",
    "chromium",
    "iproute2",
    "postgresql",
    "baresip-core",
}
SERVE = {"espeak-ng", "gcc"}


def _bin_dir(tmp_path: Path, *tools: str) -> Path:
    """A PATH directory with the real ``cat``, ``dirname``, ``id`` and ``touch``, stand-ins for
    ``tools`` that log their arguments to ``calls.log`` beside it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for real in ("cat", "dirname", "id", "touch"):
        found = shutil.which(real)
        assert found, f"{real} is not on this machine's PATH"
        (bin_dir / real).symlink_to(found)
    for tool in tools:
        _stand_in(bin_dir / tool, tmp_path / "calls.log")
    return bin_dir


def _stand_in(path: Path, log: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!{BASH}\necho "{path.name} $*" >> {log}\n')
    path.chmod(0o755)


def _run(bin_dir: Path, cwd: Path, *args: str) -> list[str]:
    done = subprocess.run(
        [BASH, str(cwd / "scripts" / "bootstrap"), *args],
        env={"PATH": str(bin_dir), "HOME": str(cwd)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, f"bootstrap {args} exited {done.returncode}: {done.stderr}"
    return done.stdout.split()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files bootstrap reads, with a .venv whose python is a stand-in (pip is not run)."""
    tree = tmp_path / "clone"
    for name in ("scripts/bootstrap", "pyproject.toml", "setup.py", "telephony/media_port.c"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    _stand_in(tree / ".venv" / "bin" / "python", tmp_path / "calls.log")
    return tree


def test_serving_installs_no_test_only_package(tmp_path: Path) -> None:
    bin_dir = _bin_dir(tmp_path)
    serve = set(_run(bin_dir, ROOT, "--serve", "--print-packages"))
    everything = set(_run(bin_dir, ROOT, "--print-packages"))
    assert serve == SERVE, f"scripts/serve would install {sorted(serve)}"
    assert not serve & TEST_ONLY
    assert everything == SERVE | TEST_ONLY, f"scripts/test would install {sorted(everything)}"


def test_on_a_bare_machine_serving_asks_apt_for_its_packages_only(tmp_path: Path) -> None:
    # No tool on PATH: every package whose check is a command is missing.
    bin_dir = _bin_dir(tmp_path)
    serve = set(_run(bin_dir, ROOT, "--serve", "--print-missing"))
    everything = set(_run(bin_dir, ROOT, "--print-missing"))
    assert serve == SERVE
    # kamailio, its TLS module and postgresql are also found by their paths, which this machine
    # may have.
    by_path = {"kamailio", "kamailio-tls-modules", "postgresql"}
    assert everything >= SERVE | (TEST_ONLY - by_path)


def test_scripts_serve_uses_the_serve_profile_and_scripts_test_the_full_one() -> None:
    def bootstrap_lines(script: str) -> list[str]:
        lines = (ROOT / "scripts" / script).read_text().splitlines()
        return [line.strip() for line in lines if line.strip().startswith("scripts/bootstrap")]

    assert bootstrap_lines("serve") == ["scripts/bootstrap --serve"]
    assert bootstrap_lines("test") == ["scripts/bootstrap"]


def test_tests_after_serving_add_the_dev_extra_to_the_same_venv(
    tmp_path: Path, checkout: Path
) -> None:
    tools = ["espeak-ng", "cc", "sipp", "tcpdump", "kamailio", "promtool", "chromium", "ip"]
    tools.append("baresip")
    bin_dir = _bin_dir(tmp_path, *tools, "apt-get", "sudo")
    calls = tmp_path / "calls.log"

    def installs(*args: str) -> list[str]:
        calls.unlink(missing_ok=True)
        _run(bin_dir, checkout, *args)
        logged = calls.read_text().splitlines() if calls.exists() else []
        asked = {
            word
            for call in logged
            if call.removeprefix("sudo ").startswith("apt-get install")
            for word in call.split()[2:]
            if not word.startswith("-")
        }
        # Every tool is on PATH; only PostgreSQL's server and Kamailio's TLS module are looked
        # for by their paths.
        by_path = {"postgresql", "kamailio-tls-modules"}
        assert asked <= by_path, f"apt was asked for {asked}: {logged}"
        return [c.split()[-1] for c in logged if c.startswith("python -m pip install -q -e")]

    assert installs("--serve") == ["."]
    assert installs("--serve") == [], "a second serve reinstalled"
    assert installs() == [".[dev,pipecat]"], "the test command skipped the dev extra after a serve"
    assert installs() == []
    # A change to the project's dependencies reinstalls, in either order of the two commands.
    _touch_after_stamps(checkout / "pyproject.toml")
    assert installs() == [".[dev,pipecat]"]
    assert installs("--serve") == [], "a dev install already holds what serving needs"
    _touch_after_stamps(checkout / "setup.py")
    assert installs("--serve") == ["."]
    assert installs() == [".[dev,pipecat]"]


def _touch_after_stamps(path: Path) -> None:
    """``path`` changed after every install: the stamps are moved back, not ``path`` forward
    (a stamp touched later must be newer than it)."""
    now = time.time()
    os.utime(path, (now, now))
    for stamp in (path.parent / ".venv").glob(".voicegate-installed*"):
        os.utime(stamp, (now - 100, now - 100))


def test_a_failing_pip_is_shown_and_stops_with_no_stamp(tmp_path: Path, checkout: Path) -> None:
    bin_dir = _bin_dir(tmp_path, "espeak-ng", "cc")
    python = checkout / ".venv" / "bin" / "python"
    python.write_text(
        f"#!{BASH}\necho 'ERROR: No matching distribution found for numpy' >&2\nexit 1\n"
    )
    done = subprocess.run(
        [BASH, str(checkout / "scripts" / "bootstrap"), "--serve"],
        env={"PATH": str(bin_dir), "HOME": str(checkout)},
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert "ERROR: No matching distribution found for numpy" in done.stderr
    assert not list((checkout / ".venv").glob(".voicegate-installed*")), "a failed install stamped"
