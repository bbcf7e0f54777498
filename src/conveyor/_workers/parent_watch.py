"""Make a worker die with the process that started it."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL us when our parent exits (Linux).

    Under ``forkserver`` our parent is the fork server, which itself exits
    when the main process does, so the chain still holds. A worker blocked on
    its task pipe also notices the main process's exit as EOF.
    """
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    # The parent may have died before prctl took effect.
    if os.getppid() == 1 or not _alive(parent_pid):
        os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
