"""The worker process: a shell around a :class:`~.core.WorkerCore`.

What is the process's, not the core's: signals, its process group, dying with its
parent, the faulthandler that answers stack dumps, ``gc.freeze``, malloc's thresholds,
loading the user's objects, and the shared-memory arena and pipes the core's inbox,
outbox, transport and status page are made of.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import mmap
import os
import signal
from multiprocessing.connection import Connection

import cloudpickle

from .._transport.arena import WorkerArena
from .._transport.codec import Encoder, SlotPayload
from .._transport.inherited import release_foreign_memory
from ..collate import carry_in
from ..resources import close_all as close_per_worker_resources
from . import parent_watch
from .core import UserObjects, WorkerCore, WorkerSpec
from .fds import InheritedFd
from .heap import HeapKeeper
from .inbox import Inbox
from .protocol import BatchDone, Stage, StartupFailed, WorkerMessage
from .remote_error import capture
from .status import StatusWriter
from .wire import send

__all__ = ["UserObjects", "WorkerSpec", "worker_main"]


def worker_main(
    spec: WorkerSpec,
    user: UserObjects | InheritedFd,
    tasks: Connection,
    results: Connection,
    arena_fd: InheritedFd,
    stack_fd: InheritedFd,
    parent_pid: int,
) -> None:
    """Entry point of a worker process.

    ``user`` is the objects themselves under ``fork``, or a memfd holding them
    cloudpickled once for all workers under ``spawn`` / ``forkserver``.
    """
    # Ctrl-C reaches the whole process group; the main process alone handles
    # it and stops us, so the user sees one KeyboardInterrupt, not one per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Lead a process group of our own: what the dataset starts (a decoder, a
    # multiprocessing.Pool) joins it, and teardown kills the group after us.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    parent_watch.die_with_parent(parent_pid)
    # The main process asks for our Python stacks (a stalled task) with SIGUSR1;
    # faulthandler answers from C, even while Python code is stuck.
    faulthandler.register(signal.SIGUSR1, file=stack_fd.fd, all_threads=True, chain=False)
    # What this process inherited (from the training process, or the fork server) stays
    # out of its garbage collections: each would write to every inherited object's
    # header, copying its page.
    gc.freeze()
    heap = HeapKeeper()  # before the user's objects allocate: see heap.py
    if isinstance(user, UserObjects):  # forked: other loaders' shared memory came along
        release_foreign_memory(arena_fd.fd)
    arena = WorkerArena(arena_fd.fd, spec.max_slots, run_ahead_bytes=spec.run_ahead_bytes)
    status = StatusWriter(arena.status_page)
    status.begin(-1, -1)
    status.stage(Stage.STARTUP)
    out = _Results(results.fileno(), heap)
    try:
        objects = user if isinstance(user, UserObjects) else _load_user_objects(user)
    except BaseException as exc:
        out.send(StartupFailed(Stage.STARTUP, capture(exc)))
        return
    if objects.collate_registrations is not None:
        # The main process's registries, registrations made in its __main__ included
        # (not run here), before worker_init_fn can add its own.
        carry_in(objects.collate_registrations)
    inbox = Inbox(tasks.fileno(), arena)
    encoder = Encoder(arena, reclaim=inbox.reclaim)
    core = WorkerCore(spec, objects, encoder, status, owns_process=True)
    try:
        first = core.start()
        out.send(first)
        if isinstance(first, StartupFailed):
            return
        core.serve(inbox, out)
    finally:
        # The process ends with os._exit (no atexit): close what the dataset opened
        # with conveyor.per_worker now (in the core, and any other thread of ours).
        core.close()
        close_per_worker_resources(everyone=True)


class _Results:
    """The result pipe, as the core's outbox; each batch sent tells the heap keeper."""

    def __init__(self, fd: int, heap: HeapKeeper) -> None:
        self._fd = fd
        self._heap = heap

    def send(self, message: WorkerMessage) -> None:
        if type(message) is BatchDone and type(message.payload) is SlotPayload:
            self._heap.batch_made(message.payload.slot.size)
        send(self._fd, message)


def _load_user_objects(setup: InheritedFd) -> UserObjects:
    # Every worker shares this descriptor's file offset: map it, don't read it.
    try:
        size = os.fstat(setup.fd).st_size
        with mmap.mmap(setup.fd, size, prot=mmap.PROT_READ) as data:
            objects = cloudpickle.loads(data)
    finally:
        setup.close()
    assert isinstance(objects, UserObjects)
    return objects
