"""Stopping worker processes for sure, and what they started.

Teardown escalates: ask (the stop flag, which a worker sees before its next task and
its next sample, and a Stop, which wakes one waiting for a task), wait on the process
sentinels while draining what workers still send, SIGTERM the ones still there, wait,
SIGKILL. Then whatever a worker started (its process group) is killed, and the main
process's ends of each are closed (:func:`stop_for_good`).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from .._task.protocol import Stop
from .process import Worker, release
from .status import request_stop

__all__ = ["STOP_GRACE_S", "TERMINATE_GRACE_S", "escalate", "kill_descendants", "stop_for_good"]

STOP_GRACE_S = 2.0
TERMINATE_GRACE_S = 1.0


class Stopping(Protocol):
    """A worker being stopped, as teardown sees it."""

    @property
    def process(self) -> BaseProcess: ...
    @property
    def results(self) -> Any: ...  # its result pipe (a Connection)
    @property
    def outbox(self) -> Any: ...  # its task pipe's queue (outbox.Outbox)


def stop_for_good(workers: Sequence[Worker], unwatch: Callable[[Worker], None]) -> None:
    """Ask every worker to stop, :func:`escalate`, then (``unwatch`` first: the pool's
    selector lets go of them) kill what each started and close the main process's ends."""
    for worker in workers:
        with contextlib.suppress(TypeError, ValueError):  # its page already let go
            request_stop(worker.arena.status_page)  # no task, nor sample, it has not begun
        with contextlib.suppress(OSError, ValueError):  # already gone
            worker.outbox.send(Stop())  # wakes a worker waiting for its next task
    escalate(workers)  # (cores sharing a process: it is stopped once)
    for worker in workers:
        unwatch(worker)
        kill_descendants(worker.pid)
        release(worker)
        worker.arena.drop_maps()


def escalate(workers: Sequence[Stopping]) -> None:
    _wait_for_stop(workers, STOP_GRACE_S)
    processes = list({id(w.process): w.process for w in workers}.values())
    for p in processes:
        if p.exitcode is None:
            p.terminate()
    _wait_for_exit(processes, TERMINATE_GRACE_S)
    for p in processes:
        if p.exitcode is None:
            p.kill()
    for p in processes:
        p.join()


def _wait_for_stop(workers: Sequence[Stopping], grace: float) -> None:
    """Wait up to ``grace`` s for workers asked to stop to exit, meanwhile reading and
    dropping what they still send (a worker blocked writing into a full result pipe
    would never get to see it must stop) and writing what their task pipes still owe
    them (a worker waiting for the rest of a half-written frame would wait forever)."""
    deadline = time.monotonic() + grace
    with selectors.DefaultSelector() as selector:
        watched: set[int] = set()  # processes (cores in threads share one)
        for worker in workers:
            with contextlib.suppress(OSError, ValueError):  # closed: nothing to watch
                if id(worker.process) not in watched:
                    selector.register(worker.process.sentinel, selectors.EVENT_READ, worker)
                    watched.add(id(worker.process))
                selector.register(worker.results.fileno(), selectors.EVENT_READ, worker)
                if worker.outbox.pending:
                    selector.register(worker.outbox.fd, selectors.EVENT_WRITE, worker)
        while any(w.process.exitcode is None for w in workers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for key, events in selector.select(remaining):
                if key.fd == key.data.process.sentinel:
                    # Its descriptors are closed: it is exiting, not yet reapable.
                    key.data.process.join(max(0.0, deadline - time.monotonic()))
                    selector.unregister(key.fd)
                elif events & selectors.EVENT_WRITE:
                    with contextlib.suppress(OSError):
                        if not key.data.outbox.flush():
                            continue
                    selector.unregister(key.fd)
                elif not _drop_what_is_there(key.fd):
                    selector.unregister(key.fd)


def _drop_what_is_there(fd: int) -> bool:
    """Read ``fd`` (non-blocking) until it is empty; False at end of file."""
    while True:
        try:
            if not os.read(fd, 1 << 16):
                return False
        except BlockingIOError:
            return True
        except OSError:
            return False


def _wait_for_exit(processes: list[BaseProcess], grace: float) -> None:
    deadline = time.monotonic() + grace
    while True:
        running: list[Any] = [p.sentinel for p in processes if p.exitcode is None]
        remaining = deadline - time.monotonic()
        if not running or remaining <= 0:
            return
        wait(running, timeout=remaining)


def kill_descendants(pid: int | None) -> None:
    """Nothing may outlive the loader: kill what a worker started (a decoder, a
    ``multiprocessing.Pool``), after the worker itself is gone.

    A worker leads its own process group (see ``loop.worker_main``) and its
    children stay in it, also once re-parented after the worker died: the group
    outlives its leader while a member lives. Called after the worker was
    reaped, so its pid may have been reused: a group whose leader is alive
    again is someone else's and is left alone.
    """
    if pid is None:
        return
    try:
        os.killpg(pid, 0)  # any member left?
        if _group_of(pid) == pid:
            return  # the pid now leads a new group: not ours
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
