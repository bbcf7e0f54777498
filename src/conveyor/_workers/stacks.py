"""Looking into a running worker process: its Python stacks (a stalled task), its CPU
time and memory (statistics); and, once dead, which of its cores was to blame.

The worker's faulthandler answers SIGUSR1 from C, even while Python code is stuck,
into a pipe whose read end the main process keeps.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import wait

import psutil

from conveyor._task.protocol import Blame, Bystander, Own, Unknown, WorkerStatus

__all__ = ["active_s", "blame_cores", "crashed_core", "dump_stacks", "process_uss", "thread_stack"]

# A thread's header in a faulthandler dump: "Current thread 0x00007f...", "Thread 0x...".
_THREAD_HEADER = re.compile(r"^(Current thread|Thread) 0x([0-9a-f]+)")


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


def thread_stack(dump: str, ident: int) -> str:
    """Of a dump of every thread's stack, the part of thread ``ident`` (a core's, in a
    process of several); the whole dump if that thread is not in it."""
    sections: list[list[str]] = []
    for line in dump.splitlines():
        if _THREAD_HEADER.match(line) or not sections:
            sections.append([])
        sections[-1].append(line)
    for section in sections:
        header = _THREAD_HEADER.match(section[0])
        if header and ident and int(header.group(2), 16) == ident:
            return "\n".join(section).rstrip()
    return dump


def crashed_core(dump: str, threads: Mapping[int, WorkerStatus]) -> int | None:
    """Which core's thread a fatal signal hit, from the crash dump faulthandler wrote
    (its "Current thread"), given each core's status (which names its thread); None if
    the dump names none of them (no dump: killed from outside, or a thread of the
    dataset's own)."""
    for line in dump.splitlines():
        header = _THREAD_HEADER.match(line)
        if header and header.group(1) == "Current thread":
            ident = int(header.group(2), 16)
            return next((core for core, st in threads.items() if st.thread == ident), None)
    return None


def blame_cores(cores: Sequence[int], culprit: int | None) -> list[Blame]:
    """Who is to blame for a process's death, for each of its ``cores``: the ``culprit``
    core (if known) its own, the others bystanders; unknown, each a death of its own with
    one restart charged (the first's)."""
    blames: list[Blame] = []
    for n, core in enumerate(cores):
        siblings = tuple(i for i in cores if i != core)
        if culprit is None and siblings:
            blames.append(Unknown(siblings, charged=n == 0))
        elif culprit is None or core == culprit:
            blames.append(Own(siblings))
        else:
            blames.append(Bystander(culprit))
    return blames


def active_s(pid: int | None, tid: int | None = None) -> float | None:
    """Seconds the process (or one of its threads) has been running or ready to run: on
    a CPU, or waiting in the run queue for one (``/proc/.../schedstat``). What is left of
    a worker's busy time is time it waited on something else (I/O, a lock, a sleep).
    None if it is gone or the kernel does not say."""
    if pid is None:
        return None
    path = f"/proc/{pid}/schedstat" if tid is None else f"/proc/{pid}/task/{tid}/schedstat"
    try:
        with open(path, "rb") as stat:
            running, waiting, _ = stat.read().split()
    except (OSError, ValueError):
        return None
    return (int(running) + int(waiting)) / 1e9


def process_uss(pid: int | None) -> int | None:
    """Memory the process alone holds (USS), or None if it cannot be read."""
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_full_info().uss)
    except (psutil.Error, AttributeError):
        return None
