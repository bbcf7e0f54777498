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
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from .. import _torch
from .._task.protocol import BatchDone, Stage, StartupFailed, WorkerMessage
from .._transport.arena import WorkerArena
from .._transport.budget import SlotBudget
from .._transport.codec import Encoder, SlotPayload
from .._transport.inherited import release_foreign_memory
from ..collate import carry_in
from ..resources import close_all as close_per_worker_resources
from . import parent_watch
from . import scope as _scope
from .core import WorkerCore
from .fds import InheritedFd
from .heap import HeapKeeper
from .inbox import Inbox
from .remote_error import capture
from .spec import UserObjects, WorkerSpec, own_objects
from .status import StatusWriter
from .wire import send

__all__ = ["CoreEnds", "UserObjects", "WorkerSpec", "worker_main"]


@dataclass(frozen=True)
class CoreEnds:
    """What one core of a worker process is given: who it is, its two pipes, and the
    memfd of its shared-memory arena (whose first page is its status page) with how many
    slots it may hold."""

    spec: WorkerSpec
    tasks: Connection
    results: Connection
    arena_fd: InheritedFd
    slots: SlotBudget


def worker_main(
    cores: Sequence[CoreEnds],
    user: UserObjects | InheritedFd,
    stack_fd: InheritedFd,
    crash_fd: InheritedFd | None,
    parent_pid: int,
    watch: InheritedFd | None = None,
    main_thread_started: bool = True,
) -> None:
    """Entry point of a worker process: one core (torch's worker), or several, each in a
    thread of its own (``threads_per_worker``).

    ``user`` is the objects themselves under ``fork``, or a memfd holding them
    cloudpickled once for all workers under ``spawn`` / ``forkserver``. ``crash_fd``
    (several cores): where faulthandler writes a fatal signal's stacks, so the main
    process can tell which core's thread crashed the process.
    """
    _become_a_worker(parent_pid, watch, main_thread_started, stack_fd, crash_fd)
    heap = HeapKeeper()  # before the user's objects allocate: see heap.py
    if isinstance(user, UserObjects):  # forked: other loaders' shared memory came along
        release_foreign_memory(*(core.arena_fd.fd for core in cores))
    shells = [_CoreShell(core, heap) for core in cores]
    try:
        objects = user if isinstance(user, UserObjects) else _load_user_objects(user)
    except BaseException as exc:
        for shell in shells:
            shell.out.send(StartupFailed(Stage.STARTUP, capture(exc)))
        return
    if objects.collate_registrations is not None:
        # The main process's registries, registrations made in its __main__ included
        # (not run here), before worker_init_fn can add its own.
        carry_in(objects.collate_registrations)
    if len(shells) == 1:
        shells[0].run(objects, owns_process=True)
    else:
        _run_in_threads(shells, objects)


def _become_a_worker(
    parent_pid: int,
    watch: InheritedFd | None,
    main_thread_started: bool,
    stack_fd: InheritedFd,
    crash_fd: InheritedFd | None,
) -> None:
    """What makes this process a worker, before anything of the user's runs."""
    # Ctrl-C reaches the whole process group; the main process alone handles
    # it and stops us, so the user sees one KeyboardInterrupt, not one per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Lead a process group of our own: what the dataset starts (a decoder, a
    # multiprocessing.Pool) joins it, and teardown kills the group after us.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    parent_watch.die_with_parent(parent_pid, watch, main_thread_started)
    # The main process asks for our Python stacks (a stalled task) with SIGUSR1;
    # faulthandler answers from C, even while Python code is stuck.
    faulthandler.register(signal.SIGUSR1, file=stack_fd.fd, all_threads=True, chain=False)
    if crash_fd is not None:
        # A file, not a pipe: a dying process must never block on a full pipe.
        faulthandler.enable(file=crash_fd.fd, all_threads=True)
    # What this process inherited (from the training process, or the fork server) stays
    # out of its garbage collections: each would write to every inherited object's
    # header, copying its page.
    gc.freeze()


def _run_in_threads(shells: list[_CoreShell], objects: UserObjects) -> None:
    """Several cores: each in a thread of its own (the first in this one), each with a
    dataset of its own; the process's generators seeded once, as its first core's."""
    _seed_process(shells[0].ends.spec)
    threads = [
        threading.Thread(
            target=shell.run,
            args=(own_objects(objects),),
            kwargs={"owns_process": False},
            name=f"conveyor-core-{shell.ends.spec.worker_id}",
            daemon=True,
        )
        for shell in shells[1:]
    ]
    for thread in threads:
        thread.start()
    shells[0].run(own_objects(objects), owns_process=False)
    for thread in threads:
        thread.join()
    close_per_worker_resources(everyone=True)  # what threads of the dataset's own opened


class _CoreShell:
    """One core of this process and what it is made of: its arena, status page,
    inbox and outbox."""

    def __init__(self, ends: CoreEnds, heap: HeapKeeper) -> None:
        self.ends = ends
        slots = ends.slots
        self.arena = WorkerArena(
            ends.arena_fd.fd, slots.max_slots, run_ahead_bytes=slots.run_ahead_bytes
        )
        self.status = StatusWriter(self.arena.status_page)
        self.status.begin(-1, -1)
        self.status.stage(Stage.STARTUP)
        self.out = _Results(ends.results.fileno(), heap)

    def run(self, objects: UserObjects, *, owns_process: bool) -> None:
        """Start the core and serve until told to stop (in this thread)."""
        self.status.thread(threading.get_ident(), threading.get_native_id())
        inbox = Inbox(self.ends.tasks.fileno(), self.arena)
        self.arena.reclaim = inbox.reclaim  # before a slot is added (see WorkerArena)
        encoder = Encoder(self.arena, reclaim=inbox.reclaim)
        core = WorkerCore(self.ends.spec, objects, encoder, self.status, owns_process=owns_process)
        try:
            first = core.start()
            self.out.send(first)
            if isinstance(first, StartupFailed):
                return
            core.serve(inbox, self.out)
        finally:
            # The process ends with os._exit (no atexit): close what the dataset opened
            # with conveyor.per_worker now (in the core, and any other thread of ours).
            core.close()
            if owns_process:
                close_per_worker_resources(everyone=True)


def _seed_process(first: WorkerSpec) -> None:
    """Cores in threads share the process's generators (each seeds only its own): they
    are seeded once, as its first core's would be, so that two processes do not draw
    alike (torch's workers' bug of old); torch's intra-op threads, which would multiply
    with the cores, are kept to one."""
    from ..sampling._seeds import worker_seeds

    seeds = worker_seeds(first.base_seed, first.worker_id)
    _scope.GLOBAL_GENERATORS.seed_each(seeds.python, seeds.numpy, seeds.torch)

    def one_thread(torch: Any) -> None:
        torch.manual_seed(seeds.torch)
        torch.set_num_threads(1)

    _torch.on_import(one_thread)


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
