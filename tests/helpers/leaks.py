"""Find what a test leaves behind: worker processes, conveyor memfds, /dev/shm files.

Take a :class:`LeakSnapshot` before the code under test and check after it::

    with no_leaks():
        for batch in DataLoader(dataset, num_workers=2): ...

or, as the fault tests do with an autouse fixture, ``before = LeakSnapshot.take()``
then ``assert_no_leaks(before)`` once the test's locals are gone.

The check waits (up to ``timeout`` seconds) for processes started since the
snapshot to exit, then collects garbage and looks for conveyor memfds still open
(``/proc/self/fd``) or mapped (``/proc/self/maps``) in this process, and for new
files in ``/dev/shm``. multiprocessing's fork server and resource tracker are
started once per interpreter and live on by design: they are not leaks.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

MEMFD_PREFIX = "/memfd:conveyor"
SHM_DIR = "/dev/shm"
DEFAULT_TIMEOUT_S = 5.0
_POLL_S = 0.02
_HELPER_MODULES = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")

__all__ = [
    "LeakSnapshot",
    "assert_no_leaks",
    "describe",
    "is_alive",
    "memfd_fds",
    "memfd_maps",
    "new_processes",
    "new_shm_entries",
    "no_leaks",
    "shm_entries",
    "wait_gone",
]


def memfd_fds() -> dict[int, str]:
    """This process's open file descriptors that refer to a conveyor memfd."""
    found: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the fd listdir itself used, or one closed meanwhile
            continue
        if target.startswith(MEMFD_PREFIX):
            found[int(name)] = target
    return found


def memfd_maps() -> frozenset[str]:
    """Lines of ``/proc/self/maps`` that map a conveyor memfd (batches still alive)."""
    with open("/proc/self/maps") as maps:
        return frozenset(line.strip() for line in maps if MEMFD_PREFIX in line)


def shm_entries() -> frozenset[str]:
    try:
        return frozenset(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return frozenset()


def _is_helper(proc: psutil.Process) -> bool:
    """multiprocessing's fork server or resource tracker, started by this process.

    Workers forked by the fork server share its command line, so only a direct
    child of ours counts as the helper itself.
    """
    try:
        if proc.ppid() != os.getpid():
            return False
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return any(module in cmdline for module in _HELPER_MODULES)


def _descendants() -> list[psutil.Process]:
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if not _is_helper(p)]


def is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a dead child not yet reaped is dead)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(
    procs: Iterable[psutil.Process], timeout: float = DEFAULT_TIMEOUT_S
) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for ``procs`` to exit; return those still alive.

    Polls instead of ``psutil.wait_procs`` so that a zombie counts as gone and
    no child is reaped behind multiprocessing's back.
    """
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if is_alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(_POLL_S)


def describe(procs: Iterable[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        try:
            cmdline = " ".join(proc.cmdline())
            status = proc.status()
        except psutil.Error as exc:
            cmdline, status = f"<{type(exc).__name__}>", "?"
        lines.append(f"  pid {proc.pid} ({status}): {cmdline[:200]}")
    return "\n".join(lines)


@dataclass(frozen=True)
class LeakSnapshot:
    """What this process held before the code under test ran."""

    processes: frozenset[psutil.Process]
    fds: frozenset[tuple[int, str]]
    maps: frozenset[str]
    shm: frozenset[str]

    @classmethod
    def take(cls) -> LeakSnapshot:
        return cls(
            processes=frozenset(_descendants()),
            fds=frozenset(memfd_fds().items()),
            maps=memfd_maps(),
            shm=shm_entries(),
        )


def new_processes(before: LeakSnapshot, *, alive_only: bool = True) -> list[psutil.Process]:
    """Descendants of this process started since ``before`` (helpers excluded)."""
    procs = [p for p in _descendants() if p not in before.processes]
    return [p for p in procs if is_alive(p)] if alive_only else procs


def assert_no_leaks(before: LeakSnapshot, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Fail, naming each, if processes, memfds or /dev/shm files outlive the test.

    Garbage cycles (a traceback holding a loader) are collected only when something is
    still there: a full collection costs ~0.1 s in a process that loaded torch."""
    survivors = wait_gone(new_processes(before), 0.0)
    if survivors or _memfds_left(before):
        gc.collect()
        survivors = wait_gone(new_processes(before), timeout)
        gc.collect()
    problems = []
    if survivors:
        problems.append(
            f"{len(survivors)} process(es) still running {timeout:.0f} s after the test:\n"
            + describe(survivors)
        )
    fds = sorted(set(memfd_fds().items()) - before.fds)
    if fds:
        problems.append(f"conveyor memfds still open in this process: {fds}")
    maps = sorted(memfd_maps() - before.maps)
    if maps:
        problems.append(f"{len(maps)} conveyor memfd mapping(s) still in this process")
    shm = new_shm_entries(before)
    if shm:
        problems.append(f"new entries in {SHM_DIR}: {sorted(shm)}")
    assert not problems, "Leaked:\n" + "\n".join(problems)


def _memfds_left(before: LeakSnapshot) -> bool:
    return bool(set(memfd_fds().items()) - before.fds or memfd_maps() - before.maps)


def new_shm_entries(before: LeakSnapshot, timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """New /dev/shm files that no process outside this process tree holds, and that are
    still there ``timeout`` seconds on.

    /dev/shm is machine-wide and other programs (other test runs, torch's own
    loaders with their ``sem.mp-*`` semaphores) come and go in it: a file that
    is unlinked at once, or still open or mapped by an unrelated process, is theirs.
    So is one that goes within ``timeout``: a test running beside this one (another
    pytest-xdist worker's) whose process died leaves its semaphores unheld until its
    resource tracker unlinks them, and they read as ours meanwhile (a CI rehearsal
    found 14 such, once).
    """
    deadline = time.monotonic() + timeout
    while True:
        left = _unheld_new_entries(before)
        if not left or time.monotonic() >= deadline:
            return left  # (each look waits 0.2 s: the files' owners give no event)


def _unheld_new_entries(before: LeakSnapshot) -> list[str]:
    names = shm_entries() - before.shm
    if not names:
        return []
    time.sleep(0.2)
    inodes: dict[int, str] = {}
    for name in names:
        try:
            inodes[os.stat(os.path.join(SHM_DIR, name)).st_ino] = name
        except OSError:  # unlinked meanwhile
            continue
    ours = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    for pid in psutil.pids():
        if inodes and pid not in ours:
            for inode in _shm_inodes_held_by(pid) & inodes.keys():
                del inodes[inode]
    return sorted(inodes.values())


def _shm_inodes_held_by(pid: int) -> set[int]:
    """Inodes of /dev/shm files that process ``pid`` maps or has open."""
    held = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(SHM_DIR + "/"):
                    held.add(int(fields[4]))
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError):
        return held
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith(SHM_DIR + "/"):
                held.add(os.stat(path).st_ino)
        except OSError:
            continue
    return held


@contextmanager
def no_leaks(timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[LeakSnapshot]:
    """Check, when the block ends without an error, that it left nothing behind."""
    before = LeakSnapshot.take()
    yield before
    assert_no_leaks(before, timeout)
