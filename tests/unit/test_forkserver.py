"""The fork server's request loop and the subreaper's orphan reaping (voicegate/pool/forkserver.py).

Forking real workers is tests/integration/test_pool.py's; here, what must hold without one.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from voicegate.pool.forkserver import serve


def test_bad_requests_are_answered_with_an_error_and_fork_nothing() -> None:
    requests = io.StringIO(
        "not json\n"
        + json.dumps({"argv": ["worker"]}) + "\n"  # no env, no cwd
        + json.dumps({"argv": ["worker"], "env": "PATH=/bin", "cwd": "/"}) + "\n"
        + json.dumps([1, 2]) + "\n"
    )  # fmt: skip
    answers = io.StringIO()
    children_before = _children()
    serve(requests, answers, supervisor=os.getpid(), output=1)
    replies = [json.loads(line) for line in answers.getvalue().splitlines()]
    assert len(replies) == 4
    assert all(set(r) == {"error"} and r["error"].startswith("bad request") for r in replies)
    assert _children() == children_before


def _children() -> set[int]:
    me = os.getpid()
    found = set()
    for task in os.listdir(f"/proc/{me}/task"):
        text = Path(f"/proc/{me}/task/{task}/children").read_text()
        found.update(int(pid) for pid in text.split())
    return found


def test_a_subreaper_reaps_the_orphans_a_dead_worker_left_and_nothing_else() -> None:
    """A worker (its own session) dies leaving a child; the child, adopted, exits: the
    supervisor must reap it, or every such child stays a zombie for the pool's life. A child of
    the supervisor's own session (as asyncio's are) is left to whoever waits for it."""
    script = textwrap.dedent(
        """
        import os, time
        from voicegate.pool.forkserver import become_subreaper, reap_orphans

        become_subreaper()
        own = os.fork()
        if own == 0:
            os._exit(7)  # a child of the supervisor's session: not an orphan
        told, tell = os.pipe()  # the worker says its child's pid
        go, release = os.pipe()  # the child waits on it until its worker is gone
        worker = os.fork()
        if worker == 0:
            os.setsid()
            orphan = os.fork()
            if orphan == 0:
                os.read(go, 1)
                os._exit(0)
            os.write(tell, str(orphan).encode().ljust(16))
            os._exit(1)  # the worker dies, its child still running
        orphan = int(os.read(told, 16))
        os.waitpid(worker, 0)
        os.write(release, b"x")

        def state(pid):
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().rpartition(")")[2].split()[0]

        deadline = time.monotonic() + 20
        while state(orphan) != "Z" or state(own) != "Z":
            assert time.monotonic() < deadline, "no zombies"
            time.sleep(0.01)
        reaped = reap_orphans()
        assert reaped == [orphan], (reaped, orphan)
        assert os.waitpid(own, 0)[1] >> 8 == 7  # still there for its own waiter
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
