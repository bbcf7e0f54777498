"""Make a worker die with the process that started it (Linux).

Each worker process gets the read end of a pipe of its own, its *parent-watch pipe*,
whose write end only the main process holds (:func:`open_watch`). The worker asks the
kernel to send it SIGKILL when that pipe's last writer is gone (``O_ASYNC`` with
``F_SETSIG``): the main process exited, however it ended, whatever thread of it started
the worker. No thread waits in the worker, and none is needed in the main process. A
forked child of the main process (another loader's worker, the user's own ``os.fork``)
closes the write ends it inherited at once; one that runs another program never had
them (they close on exec).

Started from the main thread, a worker also sets ``PR_SET_PDEATHSIG``. The kernel ties
that to the thread that forked, so it is not set for a worker started from another
thread (an evaluation thread that ends would take its workers with it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import signal
import sys
import threading

from .fds import InheritedFd

__all__ = ["close_watch", "die_with_parent", "open_watch"]

_PR_SET_PDEATHSIG = 1
_write_ends: set[int] = set()  # the main process's ends of its workers' pipes
_lock = threading.Lock()


# --- the main process's side ---------------------------------------------------------


def open_watch() -> tuple[int, int]:
    """A new parent-watch pipe: (the worker's read end, the main process's write end).
    Both close on exec; the read end is the worker's to inherit or be passed."""
    read, write = os.pipe()
    with _lock:
        _write_ends.add(write)
    return read, write


def close_watch(write: int) -> None:
    """The worker is gone (or must go now): close the main process's end."""
    with _lock:
        _write_ends.discard(write)
    os.close(write)


def _close_inherited_write_ends() -> None:
    """A forked child holds copies of the write ends: they must not keep other
    processes' workers alive after the main process is gone. (The lock, which another
    thread may have held at the fork, starts afresh.)"""
    global _lock
    _lock = threading.Lock()
    for fd in _write_ends:
        with contextlib.suppress(OSError):
            os.close(fd)
    _write_ends.clear()


os.register_at_fork(after_in_child=_close_inherited_write_ends)


# --- the worker's side -----------------------------------------------------------------


def die_with_parent(
    parent_pid: int, watch_fd: InheritedFd | None, main_thread_started: bool
) -> None:
    """Ask the kernel to SIGKILL us when the main process is gone: when the write end of
    our parent-watch pipe ``watch_fd`` closes, and (``main_thread_started``) when our
    parent exits (``PR_SET_PDEATHSIG``: under ``forkserver`` the parent is the fork
    server, which itself exits when the main process does)."""
    if sys.platform != "linux":
        return
    if main_thread_started:
        _set_pdeathsig()
    if watch_fd is not None:
        watch = watch_fd.fd
        fcntl.fcntl(watch, fcntl.F_SETOWN, os.getpid())
        fcntl.fcntl(watch, fcntl.F_SETSIG, signal.SIGKILL)
        flags = fcntl.fcntl(watch, fcntl.F_GETFL)
        fcntl.fcntl(watch, fcntl.F_SETFL, flags | os.O_ASYNC | os.O_NONBLOCK)
        try:
            if os.read(watch, 1) == b"":  # every writer is gone already: no signal comes
                os._exit(1)
        except BlockingIOError:
            pass  # the main process is there
    # The parent may have died before we asked.
    if os.getppid() == 1 or not _alive(parent_pid):
        os._exit(1)


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
