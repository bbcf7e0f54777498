"""One worker process as the main process holds it: the process, the read end of its
stack dumps and its crash dump (:class:`Host`); and each core it runs, with its pipes,
shared-memory arena and status page (:class:`Worker`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

from .._transport.arena import MainArena, create_arena_fd
from .._transport.budget import SlotBudget
from .._transport.decoder import Decoder
from . import parent_watch
from .fds import InheritedFd
from .frames import FrameReader
from .loop import CoreEnds, worker_main
from .outbox import Outbox
from .spec import UserObjects, WorkerSpec
from .start import start_process
from .start_method import StartMethod
from .status import mark_starting
from .user_objects import PickledWhileSpawning

__all__ = ["Host", "Worker", "WorkerHandle", "release", "start_worker"]


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


class Host:
    """One worker process as the main process holds it, whatever number of cores it
    runs: the process, the read end of its stack dumps, the memfd its crash dump goes
    to (several cores), and torch's view of it. Closed once, when its last core is."""

    def __init__(self, process: BaseProcess, stacks: int, crash_fd: int, cores: Sequence[int]):
        self.process = process
        self.stacks = stacks  # read end of the pipe the worker's faulthandler writes stacks to
        self.crash_fd = crash_fd  # -1: one core, no crash dump asked for
        self.cores = tuple(cores)  # its cores' worker ids
        self.handle = WorkerHandle(process)
        self._open = set(self.cores)
        # Kept apart from the process object, which is closed once the process is let go:
        # statistics() may ask from another thread meanwhile.
        self.pid: int | None = process.pid
        self.watch = -1  # the main process's end of its parent-watch pipe (parent_watch.py)

    def crash_dump(self) -> str:
        """What faulthandler wrote when a fatal signal ended the process ("" if none)."""
        if self.crash_fd < 0:
            return ""
        try:
            return os.pread(self.crash_fd, 1 << 20, 0).decode("utf-8", "replace")
        except OSError:
            return ""

    def let_go(self, worker_id: int) -> None:
        """Core ``worker_id`` is closed; once none is left, so is the process."""
        self._open.discard(worker_id)
        if self._open:
            return
        for fd in (self.stacks, self.crash_fd):
            if fd >= 0:
                os.close(fd)
        if self.watch >= 0:
            parent_watch.close_watch(self.watch)
        self.stacks = self.crash_fd = self.watch = -1
        self.handle._released()
        self.process.close()


@dataclass
class Worker:
    """The main process's handle on one worker core (one incarnation of a worker id):
    its pipes and arena, in its process (shared with other cores: threads_per_worker)."""

    worker_id: int
    host: Host
    tasks: Connection
    results: Connection
    arena: MainArena
    decoder: Decoder = field(init=False)
    outbox: Outbox = field(init=False)
    reader: FrameReader = field(init=False)
    # Slots to give back, as its decoder collects them: that is, once
    # ``decoder.dead`` is empty (see Decoder.collect).
    pending_releases: list[int] = field(default_factory=list)
    unanswered: int = 0  # tasks sent that no reply has answered yet
    slot_bytes: int = 0  # the size of the slot its last batch came in

    def __post_init__(self) -> None:
        self.decoder = Decoder(self.arena, self.pending_releases.append)
        self.outbox = Outbox(self.tasks.fileno())
        # Read only when the selector says so, and never block on a half-written frame.
        os.set_blocking(self.results.fileno(), False)
        self.reader = FrameReader(self.results.fileno())

    @property
    def process(self) -> BaseProcess:
        return self.host.process

    @property
    def handle(self) -> WorkerHandle:
        return self.host.handle

    @property
    def pid(self) -> int | None:
        return self.host.pid

    def take_releases(self) -> tuple[int, ...]:
        if self.decoder.dead:
            self.decoder.collect()
        if not self.pending_releases:
            return ()
        taken = tuple(self.pending_releases)
        del self.pending_releases[: len(taken)]
        return taken


def release(worker: Worker) -> None:
    """Close the main process's ends of a worker core whose process has exited."""
    for conn in (worker.tasks, worker.results):
        conn.close()
    worker.arena.close()
    worker.host.let_go(worker.worker_id)


def start_worker(
    context: BaseContext,
    method: StartMethod,
    specs: Sequence[WorkerSpec],
    user: UserObjects,
    setup_fd: int | None,
    preload: Sequence[str],
    slots: SlotBudget,
) -> list[Worker]:
    """Start one worker process running a core for each of ``specs`` (several: in
    threads), each with ``slots``; its cores, in the order of ``specs``."""
    made, ends, child_ends, fds = _open_ends(context, specs, slots)
    payload = _payload(method, user, setup_fd)
    process = context.Process(  # type: ignore[attr-defined]
        target=worker_main,
        args=(ends, payload, *fds.for_the_worker()),
        name=f"conveyor-worker-{specs[0].worker_id}",
        daemon=True,
    )
    try:
        start_process(method, process, preload)
    except BaseException:  # a failed start, or Ctrl-C while starting: leave nothing open
        if process.pid is not None:
            process.kill()
            process.join()
            process.close()  # its sentinel (a traceback kept in a notebook holds `process`)
        _close_made(made, [])
        fds.close_ours()
        raise
    finally:
        # The child has its own copies now; ours would keep EOF from coming.
        for conn in child_ends:
            conn.close()
        fds.close_the_workers()
        if isinstance(payload, InheritedFd):
            payload.close()
    host = Host(process, fds.stack_reader, fds.crash_fd, [spec.worker_id for spec in specs])
    host.watch = fds.watch_write
    return [
        Worker(spec.worker_id, host, task_writer, result_reader, arena)
        for spec, (task_writer, result_reader, arena) in zip(specs, made, strict=True)
    ]


_Ours = tuple[Connection, Connection, MainArena]  # a core's task writer, result reader, arena


def _open_ends(
    context: BaseContext, specs: Sequence[WorkerSpec], slots: SlotBudget
) -> tuple[list[_Ours], list[CoreEnds], list[Connection], _ProcessFds]:
    """Each core's pipes and arena (our ends, and the worker's) and the process's
    descriptors; nothing is left open when one cannot be made (too many open files)."""
    made: list[_Ours] = []
    ends: list[CoreEnds] = []
    child_ends: list[Connection] = []
    try:
        for spec in specs:
            task_reader, task_writer = context.Pipe(duplex=False)
            child_ends.append(task_reader)
            try:
                result_reader, arena = _results_and_arena(context, spec, child_ends)
            except BaseException:
                task_writer.close()
                raise
            made.append((task_writer, result_reader, arena))
            result_writer = child_ends[-1]
            arena_fd = InheritedFd(arena.fd)
            ends.append(CoreEnds(spec, task_reader, result_writer, arena_fd, slots))
        fds = _ProcessFds.open(specs)
    except BaseException:
        _close_made(made, child_ends)
        raise
    return made, ends, child_ends, fds


def _payload(
    method: StartMethod, user: UserObjects, setup_fd: int | None
) -> UserObjects | InheritedFd | PickledWhileSpawning:
    """How the user's objects reach the worker: inherited (fork), or pickled once for
    every worker into the memfd ``setup_fd``, or else pickled with its start."""
    if setup_fd is not None:
        return InheritedFd(os.dup(setup_fd))
    return PickledWhileSpawning(user) if method.pickles_objects else user


def _results_and_arena(
    context: BaseContext, spec: WorkerSpec, child_ends: list[Connection]
) -> tuple[Connection, MainArena]:
    """A core's result pipe (its write end goes to ``child_ends``) and arena; nothing is
    left open when one of them cannot be made (too many open files, say)."""
    result_reader, result_writer = context.Pipe(duplex=False)
    child_ends.append(result_writer)
    try:
        arena_fd = create_arena_fd(spec.worker_id)
        try:
            arena = MainArena(arena_fd)  # (its map of the status page dups the descriptor)
        except BaseException:
            os.close(arena_fd)
            raise
    except BaseException:
        result_reader.close()
        raise
    mark_starting(arena.status_page)
    return result_reader, arena


@dataclass
class _ProcessFds:
    """The descriptors of one worker process as a whole (not of a core): its stack dumps'
    pipe, its crash dump's memfd (several cores), its parent-watch pipe."""

    stack_reader: int
    stack_writer: int
    crash_fd: int  # -1: one core, no crash dump asked for
    watch_read: int
    watch_write: int

    @classmethod
    def open(cls, specs: Sequence[WorkerSpec]) -> _ProcessFds:
        opened: list[int] = []
        try:
            stack_reader, stack_writer = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            opened += [stack_reader, stack_writer]
            os.set_blocking(stack_writer, True)
            crash_fd = -1
            if len(specs) > 1:
                crash_fd = os.memfd_create(f"conveyor-crash-{specs[0].worker_id}", os.MFD_CLOEXEC)
                opened.append(crash_fd)
            watch_read, watch_write = parent_watch.open_watch()
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        return cls(stack_reader, stack_writer, crash_fd, watch_read, watch_write)

    def for_the_worker(self) -> tuple[object, ...]:
        """``worker_main``'s arguments after the cores and the user's objects."""
        crash = InheritedFd(self.crash_fd) if self.crash_fd >= 0 else None
        main_thread = threading.current_thread() is threading.main_thread()
        return (
            InheritedFd(self.stack_writer), crash, os.getpid(),
            InheritedFd(self.watch_read), main_thread,
        )  # fmt: skip

    def close_the_workers(self) -> None:
        """The worker has its copies (or failed to start)."""
        os.close(self.stack_writer)
        os.close(self.watch_read)

    def close_ours(self) -> None:
        """The start failed: what the main process would have kept."""
        os.close(self.stack_reader)
        if self.crash_fd >= 0:
            os.close(self.crash_fd)
        parent_watch.close_watch(self.watch_write)


def _close_made(
    made: list[tuple[Connection, Connection, MainArena]], child_ends: list[Connection]
) -> None:
    for task_writer, result_reader, arena in made:
        task_writer.close()
        result_reader.close()
        arena.drop_maps()  # the status page's map holds a descriptor of its own
        arena.close()
    for conn in child_ends:
        conn.close()
