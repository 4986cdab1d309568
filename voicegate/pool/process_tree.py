"""Children that do not outlive the supervisor.

A supervisor killed with SIGKILL runs no clean-up, so each child asks the kernel for SIGTERM when
its parent dies (Linux ``PR_SET_PDEATHSIG``): workers then drain and exit, and Kamailio stops,
instead of holding the SIP ports against the supervisor's restart.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a child process: SIGTERM it when its parent exits."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
