"""Start worker processes and stop them for sure.

Teardown escalates: ask (Stop), wait on the process sentinels, SIGTERM the
ones still there, wait, SIGKILL. Shared memory is dropped only afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

import cloudpickle

from .._transport.arena import MainArena, create_arena_fd
from .._transport.codec import Decoder
from .fds import InheritedFd
from .loop import UserObjects, WorkerSpec, worker_main
from .protocol import Stop, Task
from .start import modules_to_preload, start_process

STOP_GRACE_S = 2.0
TERMINATE_GRACE_S = 1.0


@dataclass
class Worker:
    """The main process's handle on one worker."""

    worker_id: int
    process: BaseProcess
    tasks: Connection
    results: Connection
    arena: MainArena
    stacks: int  # read end of the pipe the worker's faulthandler writes stacks to
    decoder: Decoder = field(init=False)
    pending_releases: list[int] = field(default_factory=list)
    ready: bool = False

    def __post_init__(self) -> None:
        self.decoder = Decoder(self.arena, self.pending_releases.append)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, task: Task) -> None:
        """Send a task; to a worker that just died, it is simply lost.

        The caller keeps every task it sent as outstanding until answered, and
        the worker's sentinel leads to a replacement that gets it again.
        """
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.tasks.send(task)

    def take_releases(self) -> tuple[int, ...]:
        if not self.pending_releases:
            return ()
        # Finalizers may append concurrently (GC runs anywhere): swap, don't clear.
        taken = self.pending_releases[:]
        del self.pending_releases[: len(taken)]
        return tuple(taken)


class WorkerPool:
    def __init__(
        self,
        context: BaseContext,
        user: UserObjects,
        specs: Sequence[WorkerSpec],
    ) -> None:
        self.workers: list[Worker] = []
        self._closed = False
        self._owner_pid = os.getpid()
        self._context = context
        self._user = user
        self._specs = list(specs)
        method = context.get_start_method()
        # Kept until close: a replacement worker reads the same serialized copy.
        self._setup = None if method == "fork" else _serialize_once(user, method)
        self._preload = modules_to_preload(user.dataset, user.collate_fn, user.worker_init_fn)
        try:
            for spec in specs:
                self.workers.append(_start_worker(context, spec, user, self._setup, self._preload))
        except BaseException:
            self.close()
            raise

    def replace(self, worker_id: int) -> Worker:
        """Start a new worker in place of a dead one (same id, same seed)."""
        old = self.workers[worker_id]
        old.process.join(timeout=TERMINATE_GRACE_S)
        if old.process.exitcode is None:
            old.process.kill()
            old.process.join()
        _release(old)
        new = _start_worker(
            self._context, self._specs[worker_id], self._user, self._setup, self._preload
        )
        self.workers[worker_id] = new
        return new

    def kill(self, worker: Worker) -> None:
        """Kill a stuck worker; its sentinel then reports it like any death."""
        if worker.process.exitcode is None:
            worker.process.kill()

    def dump_stacks(self, worker: Worker, timeout: float = 2.0) -> str:
        """The worker's current Python stacks (all threads), or "" if it can't say."""
        pid = worker.pid
        if pid is None or worker.process.exitcode is not None:
            return ""
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            return ""
        chunks: list[bytes] = []
        # faulthandler writes the whole dump at once; wait for it, then for quiet.
        deadline = time.monotonic() + timeout
        while wait(
            [worker.stacks], timeout=max(0.0, deadline - time.monotonic()) if not chunks else 0.1
        ):
            try:
                chunk = os.read(worker.stacks, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
        return _worker_frames_only(b"".join(chunks).decode("utf-8", "replace"))

    def close(self) -> None:
        """Stop every worker and free their resources; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner_pid:
            # A forked child (one of ours, or another library's) inherited this
            # pool; the workers are not its children. Leave them to their owner.
            return
        for worker in self.workers:
            with contextlib.suppress(OSError, ValueError):  # already gone
                worker.tasks.send(Stop())
        _escalate([w.process for w in self.workers])
        for worker in self.workers:
            _release(worker)
            worker.arena.drop_maps()
        if self._setup is not None:
            os.close(self._setup)
            self._setup = None


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


def _release(worker: Worker) -> None:
    """Close the main process's ends of a worker that has exited."""
    for conn in (worker.tasks, worker.results):
        conn.close()
    worker.arena.close()
    if worker.stacks >= 0:
        os.close(worker.stacks)
        worker.stacks = -1
    worker.process.close()


def _serialize_once(user: UserObjects, start_method: str) -> int:
    """Cloudpickle the user's objects into a memfd that every worker reads."""
    try:
        data = cloudpickle.dumps(user)
    except Exception as exc:
        raise _explain(user, exc, start_method) from exc
    fd = os.memfd_create("conveyor-setup", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    return fd


def _explain(user: UserObjects, error: Exception, start_method: str) -> Exception:
    from ..diagnostics.pickling import explain_unpicklable

    for role in ("dataset", "collate_fn", "worker_init_fn"):
        obj = getattr(user, role)
        try:
            cloudpickle.dumps(obj)
        except Exception as exc:
            return explain_unpicklable(obj, role, exc, role=role, start_method=start_method)
    return error


def _start_worker(
    context: BaseContext,
    spec: WorkerSpec,
    user: UserObjects,
    setup_fd: int | None,
    preload: Sequence[str] = (),
) -> Worker:
    task_reader, task_writer = context.Pipe(duplex=False)
    result_reader, result_writer = context.Pipe(duplex=False)
    arena_fd = create_arena_fd(spec.worker_id)
    stack_reader, stack_writer = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    os.set_blocking(stack_writer, True)
    payload: UserObjects | InheritedFd
    payload = user if setup_fd is None else InheritedFd(os.dup(setup_fd))
    process = context.Process(  # type: ignore[attr-defined]
        target=worker_main,
        args=(
            spec,
            payload,
            task_reader,
            result_writer,
            InheritedFd(arena_fd),
            InheritedFd(stack_writer),
        ),
        name=f"conveyor-worker-{spec.worker_id}",
        daemon=True,
    )
    try:
        start_process(context, process, preload)
    finally:
        # The child has its own copies now; ours would keep EOF from coming.
        task_reader.close()
        result_writer.close()
        os.close(stack_writer)
        if isinstance(payload, InheritedFd):
            payload.close()
    return Worker(
        spec.worker_id, process, task_writer, result_reader, MainArena(arena_fd), stack_reader
    )


def _escalate(processes: list[BaseProcess]) -> None:
    _wait_for_exit(processes, STOP_GRACE_S)
    for p in processes:
        if p.exitcode is None:
            p.terminate()
    _wait_for_exit(processes, TERMINATE_GRACE_S)
    for p in processes:
        if p.exitcode is None:
            p.kill()
    for p in processes:
        p.join()


def _wait_for_exit(processes: list[BaseProcess], grace: float) -> None:
    deadline = time.monotonic() + grace
    while True:
        running: list[Any] = [p.sentinel for p in processes if p.exitcode is None]
        remaining = deadline - time.monotonic()
        if not running or remaining <= 0:
            return
        wait(running, timeout=remaining)
