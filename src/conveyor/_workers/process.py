"""One worker process as the main process holds it: the process, its pipes, its
shared-memory arena and status page, and the read end of its stack dumps."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

from .._transport.arena import MainArena, create_arena_fd
from .._transport.codec import Decoder
from ..config import StartMethod
from .core import UserObjects, WorkerSpec
from .fds import InheritedFd
from .loop import worker_main
from .outbox import Outbox
from .start import Starter
from .status import mark_starting
from .user_objects import PickledWhileSpawning
from .wire import FrameReader

__all__ = ["Worker", "WorkerHandle", "release", "start_worker"]


class WorkerHandle:
    """One worker process as code written for torch reaches it (``iterator._workers``):
    ``pid``, ``is_alive()``, ``join()``, ``exitcode``, ``terminate()``, ``kill()``,
    true of the real process, also after conveyor has shut it down and let go of it."""

    def __init__(self, process: BaseProcess) -> None:
        self._process: BaseProcess | None = process
        self.pid = process.pid
        self._exitcode: int | None = None

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode if self._process is not None else self._exitcode

    def is_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self._process is not None:
            self._process.join(timeout)

    def terminate(self) -> None:
        if self._process is not None:
            self._process.terminate()

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()

    def _released(self) -> None:
        """The process has exited and conveyor closes its object: keep what it said."""
        if self._process is not None:
            self._exitcode = self._process.exitcode
            self._process = None


@dataclass
class Worker:
    """The main process's handle on one worker process (one incarnation of a worker id)."""

    worker_id: int
    process: BaseProcess
    tasks: Connection
    results: Connection
    arena: MainArena
    stacks: int  # read end of the pipe the worker's faulthandler writes stacks to
    decoder: Decoder = field(init=False)
    outbox: Outbox = field(init=False)
    reader: FrameReader = field(init=False)
    pending_releases: list[int] = field(default_factory=list)
    handle: WorkerHandle = field(init=False)

    def __post_init__(self) -> None:
        self.decoder = Decoder(self.arena, self.pending_releases.append)
        self.outbox = Outbox(self.tasks.fileno())
        # Read only when the selector says so, and never block on a half-written frame.
        os.set_blocking(self.results.fileno(), False)
        self.reader = FrameReader(self.results.fileno())
        self.handle = WorkerHandle(self.process)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def take_releases(self) -> tuple[int, ...]:
        if not self.pending_releases:
            return ()
        # Finalizers may append concurrently (GC runs anywhere): swap, don't clear.
        taken = self.pending_releases[:]
        del self.pending_releases[: len(taken)]
        return tuple(taken)


def release(worker: Worker) -> None:
    """Close the main process's ends of a worker that has exited."""
    for conn in (worker.tasks, worker.results):
        conn.close()
    worker.arena.close()
    if worker.stacks >= 0:
        os.close(worker.stacks)
        worker.stacks = -1
    worker.handle._released()
    worker.process.close()


def start_worker(
    context: BaseContext,
    method: StartMethod,
    spec: WorkerSpec,
    user: UserObjects,
    setup_fd: int | None,
    starter: Starter,
    preload: Sequence[str] = (),
) -> Worker:
    task_reader, task_writer = context.Pipe(duplex=False)
    result_reader, result_writer = context.Pipe(duplex=False)
    arena_fd = create_arena_fd(spec.worker_id)
    arena = MainArena(arena_fd)
    mark_starting(arena.status_page)
    stack_reader, stack_writer = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    os.set_blocking(stack_writer, True)
    payload: UserObjects | InheritedFd | PickledWhileSpawning
    if setup_fd is not None:
        payload = InheritedFd(os.dup(setup_fd))
    elif method.pickles_objects:
        payload = PickledWhileSpawning(user)
    else:
        payload = user
    process = context.Process(  # type: ignore[attr-defined]
        target=worker_main,
        args=(
            spec,
            payload,
            task_reader,
            result_writer,
            InheritedFd(arena_fd),
            InheritedFd(stack_writer),
            os.getpid(),
        ),
        name=f"conveyor-worker-{spec.worker_id}",
        daemon=True,
    )
    try:
        starter.start(method, process, preload)
    except BaseException:  # a failed start, or Ctrl-C while starting: leave nothing open
        if process.pid is not None:
            process.kill()
            process.join()
            process.close()  # its sentinel (a traceback kept in a notebook holds `process`)
        task_writer.close()
        result_reader.close()
        arena.drop_maps()  # the status page's map holds a descriptor of its own
        arena.close()
        os.close(stack_reader)
        raise
    finally:
        # The child has its own copies now; ours would keep EOF from coming.
        task_reader.close()
        result_writer.close()
        os.close(stack_writer)
        if isinstance(payload, InheritedFd):
            payload.close()
    return Worker(spec.worker_id, process, task_writer, result_reader, arena, stack_reader)
