"""Children that do not outlive the supervisor.

A supervisor killed with SIGKILL runs no clean-up, so each child asks the kernel for SIGTERM when
its parent dies (Linux ``PR_SET_PDEATHSIG``): workers then drain and exit, and Kamailio stops,
instead of holding the SIP ports against the supervisor's restart.

The request runs between fork and exec (``preexec_fn``), in a child forked from a process with
threads (the store writer, the child watchers). Only what is safe there may run: one call into a
C function found here, in the parent, at import. Looking libc up in the child
(``ctypes.util.find_library`` runs ``ldconfig`` as a subprocess) could deadlock it before its
exec, and with it the supervisor's event loop, which waits for that exec.
"""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
# The process's own global symbols: libc is loaded already, so nothing is opened or searched.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent() -> None:
    """``preexec_fn`` for a child process: SIGTERM it when its parent exits."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
