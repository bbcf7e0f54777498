"""A worker process's Python stacks, asked for while it runs (a stalled task).

The worker's faulthandler answers SIGUSR1 from C, even while Python code is stuck,
into a pipe whose read end the main process keeps.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import wait

import psutil

__all__ = ["dump_stacks"]


def dump_stacks(pid: int | None, stacks_fd: int, timeout: float = 2.0) -> str:
    """The worker's current Python stacks (all threads), or "" if it can't say."""
    if pid is None:
        return ""
    if _is_stopped(pid):
        return "(none: the process is stopped, by SIGSTOP or a debugger)"
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        return ""
    chunks: list[bytes] = []
    # faulthandler writes the whole dump at once; wait for it, then for quiet.
    deadline = time.monotonic() + timeout
    while wait([stacks_fd], timeout=max(0.0, deadline - time.monotonic()) if not chunks else 0.1):
        try:
            chunk = os.read(stacks_fd, 1 << 16)
        except BlockingIOError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
    return _worker_frames_only(b"".join(chunks).decode("utf-8", "replace"))


def _is_stopped(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() in (psutil.STATUS_STOPPED, "tracing-stop"))
    except psutil.Error:
        return False


def _worker_frames_only(dump: str) -> str:
    """Drop the frames below ``worker_main``: under fork they are the parent's,
    copied at fork time (process start-up), and only make the stack longer."""
    kept: list[str] = []
    skipping = False
    for line in dump.splitlines():
        if not line.startswith(" "):  # a thread's header line
            skipping = False
        elif skipping:
            continue
        kept.append(line)
        if "in worker_main" in line:
            skipping = True
    return "\n".join(kept)
