"""What a stuck process is doing, on request: ``kill -USR1`` and ``kill -USR2``.

A worker or supervisor that stops answering, or will not exit on SIGTERM, leaves nothing in its
log to say why. Two signals ask it:

- SIGUSR1 writes every thread's Python stack to stderr (``faulthandler``). It is answered from a C
  signal handler, so it works even when the event loop is blocked.
- SIGUSR2 logs every asyncio task and the line each one waits at (``debug.tasks``). It runs on the
  loop, so it answers only when the loop does; when the loop is stuck, SIGUSR1 shows where.

A fatal signal (SIGSEGV, SIGABRT from a PJSIP assertion) also writes every thread's stack before
the process dies. Only code locations are written, never a variable's value, so no secret can
reach the log this way.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
import sys

log = logging.getLogger("voicegate.observe")

THREADS_SIGNAL = signal.SIGUSR1
TASKS_SIGNAL = signal.SIGUSR2
# A task's stack is its chain of awaits; deeper than this is library code.
_MAX_DEPTH = 16


def dump_threads_on_signal() -> None:
    """At process start: SIGUSR1 and fatal signals write every thread's stack to stderr."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(THREADS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)


def dump_tasks_on_signal(loop: asyncio.AbstractEventLoop) -> None:
    """On the running loop: SIGUSR2 logs every task and where it waits."""
    loop.add_signal_handler(TASKS_SIGNAL, log_tasks)


def await_chain(coro: object) -> list[str]:
    """Where a suspended coroutine waits: its own line, then each awaited coroutine's, outermost
    first; last, what the innermost one awaits if that is not a coroutine (a future, a sleep)."""
    chain: list[str] = []
    while coro is not None and len(chain) < _MAX_DEPTH:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            chain.append(type(coro).__name__)  # a Future, or a coroutine already finished
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return chain


def task_stacks() -> list[dict[str, object]]:
    """Every task of the running loop: its name and its chain of awaits."""
    found: list[dict[str, object]] = [
        {"task": task.get_name(), "at": await_chain(task.get_coro())}
        for task in asyncio.all_tasks()
    ]
    return sorted(found, key=lambda t: str(t["task"]))


def log_tasks() -> None:
    log.warning("debug.tasks", extra={"tasks": task_stacks()})
