"""Thread workers at interpreter exit: never inside a C extension when Python ends.

A thread cannot be stopped mid-sample. When the interpreter finalizes, CPython ends
every other thread the next time it asks for the GIL, with ``pthread_exit``: the
unwinding that runs through a C++ extension's frames on the way (torch releases the GIL
around each operation, so a thread running an augmentation is almost always there)
reaches a ``noexcept`` destructor and calls ``std::terminate``: ``terminate called
without an active exception``, SIGABRT, exit status 134, whatever the script meant.

So at exit (an ``atexit`` hook: the interpreter is still whole) every thread worker is
told to stop, and the interpreter waits for each to finish the sample it is running:
it starts no other (the batch it was building is abandoned at that sample boundary: see
``TaskRunner.run``), and then it has left the user's code for good. The wait is bounded
by the loader's ``timeout``, counted from the sample's start: a thread past it is
stuck, and is left (it may be in a dead network read, where being ended is harmless).
Threads already abandoned as stuck are not waited for. Without a ``timeout`` the wait
has no bound, as ``concurrent.futures`` waits for its threads; after
:data:`EXIT_NOTICE_S` it says, on the ``conveyor`` logger, which thread it waits for,
where it is, and how to end the wait (Ctrl-C, or a ``timeout``). A program whose user
pressed Ctrl-C wants out now: once Ctrl-C was pressed while thread workers ran, wherever
it landed (interrupts.py notes it; the script caught the ``KeyboardInterrupt``, as
Lightning catches it to tear down, or not), or the program ends on an uncaught one,
the exit waits :data:`INTERRUPTED_EXIT_S` at most, and says on the ``conveyor`` logger
which threads it left, and where they were.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import traceback
import weakref
from typing import Protocol

from . import interrupts
from .status import MemoryStatus

__all__ = ["EXIT_NOTICE_S", "abandoned_alive", "finish_at_exit", "track"]

EXIT_NOTICE_S = 5.0  # the exit says what it waits for after this long
INTERRUPTED_EXIT_S = 1.0  # the most a program ending on Ctrl-C waits for its threads
logger = logging.getLogger("conveyor")


class ThreadWorker(Protocol):
    """What the exit needs of a thread worker (threads.py's)."""

    thread: threading.Thread
    status: MemoryStatus
    timeout: float  # the loader's (0: none)
    abandoned: bool

    def stop(self) -> None:
        """Start no other task; end once the current one (if any) returns."""
        ...


_workers: weakref.WeakSet[ThreadWorker] = weakref.WeakSet()
_lock = threading.Lock()


def track(worker: ThreadWorker) -> None:
    """A thread worker the exit must know of (kept only while something holds it: its
    running thread does)."""
    with _lock:
        _workers.add(worker)


def abandoned_alive() -> int:
    """Threads abandoned as stuck whose sample has not returned yet, in this process."""
    with _lock:
        workers = list(_workers)
    return sum(1 for w in workers if w.abandoned and w.thread.is_alive())


def _deadline(worker: ThreadWorker, now: float, interrupted: bool) -> float | None:
    """When the exit stops waiting for ``worker`` (None: never): its sample's start plus
    the loader's timeout; after Ctrl-C, :data:`INTERRUPTED_EXIT_S` at most."""
    until = now + INTERRUPTED_EXIT_S if interrupted else None
    if not worker.timeout:
        return until
    status = worker.status.read()
    started = now - status.age_s if status.stage is not None else now
    return min(started + worker.timeout, until or float("inf"))


def _wants_out() -> bool:
    """The user pressed Ctrl-C: while thread workers ran (noted, caught or not), or the
    program ends on an uncaught one (the interpreter printed it before its
    exit, keeping it as ``sys.last_exc``, ``sys.last_value`` before 3.12)."""
    if interrupts.interrupted():
        return True
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return isinstance(last, KeyboardInterrupt)


def finish_at_exit(notice_after: float = EXIT_NOTICE_S) -> None:
    """Stop every thread worker and wait for each to leave the user's code (see the
    module's docstring). Called by ``atexit``; a Ctrl-C ends the wait."""
    with _lock:
        workers = [w for w in _workers if w.thread.is_alive() and not w.abandoned]
    if not workers:
        return
    for worker in workers:
        worker.stop()
    now, interrupted = time.monotonic(), _wants_out()
    deadlines = {id(w): _deadline(w, now, interrupted) for w in workers}
    notice_at = now + notice_after
    told = False
    left: list[ThreadWorker] = []
    try:
        for worker in workers:
            while worker.thread.is_alive():
                now = time.monotonic()
                until = deadlines[id(worker)]
                if until is not None and now >= until:
                    left.append(worker)
                    break
                wake = [t for t in (until, None if told else notice_at) if t is not None]
                worker.thread.join(max(0.0, min(wake) - now) if wake else None)
                if not told and worker.thread.is_alive() and time.monotonic() >= notice_at:
                    told = True
                    logger.warning(_waiting_notice([w for w in workers if w.thread.is_alive()]))
    except KeyboardInterrupt:
        logger.warning(
            "conveyor: interrupted: the interpreter exits without waiting for its thread "
            "workers (one still inside a C extension such as torch may abort the process)."
        )
        return
    if left:
        logger.warning(_left_notice(left, interrupted))


def _where(worker: ThreadWorker) -> str:
    """The thread's name, what it runs and for how long, and its innermost frames."""
    status = worker.status.read()
    doing = f"batch {status.seq}" if status.stage is not None else "no task"
    text = f"{worker.thread.name} ({doing}, {status.age_s:.1f} s"
    frame = sys._current_frames().get(worker.thread.ident or -1)
    if frame is None:
        return text + ")"
    stack = "".join(traceback.format_stack(frame)[-3:]).rstrip()
    return f"{text}), at:\n{stack}"


def _waiting_notice(workers: list[ThreadWorker]) -> str:
    names = "\n".join(_where(w) for w in workers)
    return (
        "conveyor: the interpreter waits, before it exits, for thread workers to finish "
        "the sample each is running: a thread cannot be stopped mid-sample, and one ended "
        "by the interpreter inside a C extension (torch) aborts the process. Press Ctrl-C "
        "to stop waiting, or pass timeout= to the DataLoader to bound the wait. Waiting "
        f"for:\n{names}"
    )


def _left_notice(workers: list[ThreadWorker], interrupted: bool) -> str:
    names = "\n".join(_where(w) for w in workers)
    why = (
        "still in a sample after Ctrl-C" if interrupted else "stuck past their DataLoader's timeout"
    )
    return (
        f"conveyor: the interpreter exits without waiting for thread workers {why} (a "
        "thread cannot be killed; if one returns into a C extension while the interpreter "
        f"ends, the process may abort):\n{names}"
    )


def _after_fork_in_child() -> None:
    """A forked child has none of this process's threads; the lock, which one of them
    may have held at the fork, starts afresh."""
    global _lock, _workers
    _lock = threading.Lock()
    _workers = weakref.WeakSet()


atexit.register(finish_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
