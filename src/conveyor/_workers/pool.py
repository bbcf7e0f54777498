"""Start worker processes and stop them for sure.

Teardown escalates: ask (the stop flag and a Stop), wait on the process sentinels
while draining what workers still send, SIGTERM the ones still there, wait, SIGKILL.
Shared memory is dropped only afterwards.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import selectors
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any

import cloudpickle
import psutil

from .. import _datapipes
from .._transport.arena import SETUP_NAME, MainArena, create_arena_fd
from .._transport.codec import Decoder, Payload, SlotPayload
from ..config import StartMethod
from .events import Died, PoolEvent, Received
from .fds import InheritedFd
from .interrupts import interrupts_deferred
from .loop import UserObjects, WorkerSpec, worker_main
from .outbox import Outbox
from .protocol import Ready, Release, SeedPipe, StartupFailed, Stop, Task
from .start import modules_to_preload, start_process
from .status import WorkerStatus, mark_starting, read_status, request_stop
from .wire import FrameReader

STOP_GRACE_S = 2.0
_RESULT, _DEATH, _TASK = "result", "death", "task"  # what a selector key watches
# Slots freed go to their worker with its next task; this many pending at once (a
# discarded epoch, the end of an epoch when no task follows) go in a message of their own.
RELEASE_ALONE = 4
TERMINATE_GRACE_S = 1.0


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
class _Worker:
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


class WorkerPool:
    """Worker processes behind an event interface: :meth:`wait` returns what
    happened (messages, deaths) as values; everything else is asked of the
    pool by worker id."""

    def __init__(
        self,
        start_method: StartMethod,
        user: UserObjects,
        specs: Sequence[WorkerSpec],
    ) -> None:
        self._workers: list[_Worker] = []
        self._retired: list[_Worker] = []  # replaced: their batches may still be decoded
        self._closed = False
        self._owner_pid = os.getpid()
        self._method = start_method
        self._context = start_method.context()
        self._user = user
        self._specs = list(specs)
        # The serialized objects, kept until every worker has loaded them (then
        # freed: a 1 GiB dataset would cost 1 GiB of shared memory for the run);
        # a replacement worker gets them serialized again.
        self._setup: int | None = None
        self._each_start = False  # they must be pickled with each worker's start instead
        self._loading: set[int] = {spec.worker_id for spec in specs}
        self._preload = modules_to_preload(user.dataset, user.collate_fn, user.worker_init_fn)
        # One selector for the pool's life: building one per wait costs more than the wait.
        self._selector = selectors.DefaultSelector()
        self._writing: set[int] = set()  # task pipes registered for writability
        try:
            for spec in specs:
                self._workers.append(self._start(spec))
        except BaseException:
            self.close()
            raise

    def _start(self, spec: WorkerSpec) -> _Worker:
        if self._method.pickles_objects and self._setup is None and not self._each_start:
            self._setup = _serialize_once(self._user, self._method)
            self._each_start = self._setup is None
        self._loading.add(spec.worker_id)
        worker = _start_worker(
            self._context, self._method, spec, self._user, self._setup, self._preload
        )
        self._selector.register(worker.results, selectors.EVENT_READ, (_RESULT, worker))
        self._selector.register(worker.process.sentinel, selectors.EVENT_READ, (_DEATH, worker))
        return worker

    def _unwatch(self, worker: _Worker) -> None:
        """Stop watching a worker's pipes and sentinel (before they are closed)."""
        for obj in (worker.results, worker.process.sentinel, worker.outbox.fd):
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(obj)
        self._writing.discard(worker.outbox.fd)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def pids(self) -> list[int | None]:
        return [w.pid for w in self._workers]

    # --- talking to workers ---------------------------------------------------------

    def send(self, worker_id: int, task: Task) -> None:
        """Send a task (with the slots freed since); to a worker that just died it is
        simply lost: the caller re-sends what a dead worker had not answered."""
        worker = self._workers[worker_id]
        if not task.released and worker.pending_releases:
            # (Built directly: dataclasses.replace costs several µs, once per batch.)
            released = worker.take_releases()
            task = Task(
                task.epoch,
                task.seq,
                task.index,
                released,
                task.trace,
                task.exclude,
                task.first_sample,
                task.want_state,
                task.consecutive,
            )
        try:
            worker.outbox.send(task)  # never blocks: see outbox.py
        except (BrokenPipeError, ConnectionResetError):
            worker.outbox.clear()

    def send_releases(self) -> None:
        """Slots freed in a number no task is carrying (see RELEASE_ALONE): to their
        workers now, in a message of their own."""
        for worker in self._workers:
            if len(worker.pending_releases) >= RELEASE_ALONE:
                try:
                    worker.outbox.send(Release(worker.take_releases()))
                except (BrokenPipeError, ConnectionResetError):
                    worker.outbox.clear()

    def seed_pipes(self, seed: int) -> None:
        """A DataPipe dataset's shared seed for the next epoch: to every worker, and to
        the specs a replacement starts from."""
        self._specs = [replace(spec, pipe_seed=seed) for spec in self._specs]
        for worker in self._workers:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                worker.outbox.send(SeedPipe(seed))

    def wait(self, timeout: float | None) -> list[PoolEvent]:
        """Block until a worker sends something or dies, or ``timeout`` passes ([]).

        Messages already read (one read takes every frame a pipe holds) come first,
        without waiting; tasks queued for full pipes are written meanwhile.
        """
        events: list[PoolEvent] = []
        self.send_releases()
        for worker in self._workers:
            if worker.reader.holds_frame:
                events += self._received(worker, worker.reader.buffered())
        if events:
            return events
        deaths: list[_Worker] = []
        for key, mask in self._select(timeout):
            role, worker = key.data
            if role == _RESULT:
                messages = worker.reader.read()
                if worker.reader.eof:  # it exited: its sentinel says the rest
                    with contextlib.suppress(KeyError, ValueError):
                        self._selector.unregister(worker.results)
                events += self._received(worker, messages)
            elif role == _DEATH:
                deaths.append(worker)
            elif mask & selectors.EVENT_WRITE:
                try:
                    worker.outbox.flush()
                except (BrokenPipeError, ConnectionResetError):
                    worker.outbox.clear()  # it died: its sentinel says so
        for worker in deaths:
            events += self._died(worker)
        return events

    def _select(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        """The selector's answer, with every task pipe that has queued bytes watched for
        room: the main process never blocks on a write. Returns early with nothing when
        only writes happened before ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._watch_writers()
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            found = self._selector.select(remaining)
            if any(key.data[0] != _TASK for key, _ in found):
                return found
            for key, _ in found:  # only room to write: write, and wait again
                worker = key.data[1]
                try:
                    worker.outbox.flush()
                except (BrokenPipeError, ConnectionResetError):
                    worker.outbox.clear()
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _watch_writers(self) -> None:
        for worker in self._workers:
            fd = worker.outbox.fd
            if worker.outbox.pending and fd not in self._writing:
                self._selector.register(fd, selectors.EVENT_WRITE, (_TASK, worker))
                self._writing.add(fd)
            elif not worker.outbox.pending and fd in self._writing:
                self._selector.unregister(fd)
                self._writing.discard(fd)

    def _received(self, worker: _Worker, messages: list[Any]) -> list[PoolEvent]:
        events: list[PoolEvent] = []
        for message in messages:
            if isinstance(message, (Ready, StartupFailed)):
                self._loaded(worker.worker_id)
            payload = getattr(message, "payload", None)
            if isinstance(payload, SlotPayload):
                # Map on receipt: the batch stays readable if the worker dies before
                # the user takes it (the fd is closed when the worker is replaced).
                worker.arena.view(payload.slot)
            events.append(Received(worker.worker_id, message, worker))
        return events

    def _loaded(self, worker_id: int) -> None:
        """A worker is past loading the user's objects; free them once all are."""
        self._loading.discard(worker_id)
        if not self._loading and self._setup is not None:
            os.close(self._setup)
            self._setup = None

    def _died(self, worker: _Worker) -> list[PoolEvent]:
        """Whatever the dead worker sent before dying, then its death."""
        events = self._received(worker, worker.reader.drain())
        self._unwatch(worker)
        worker.process.join(timeout=1.0)
        status = read_status(worker.arena.status_page)
        events.append(Died(worker.worker_id, worker.pid, worker.process.exitcode, status))
        return events

    def status(self, worker_id: int) -> WorkerStatus:
        return read_status(self._workers[worker_id].arena.status_page)

    def decode(self, origin: Any, payload: Payload) -> Any:
        worker: _Worker = origin
        return worker.decoder.decode(payload)

    def batches_alive(self, origin: Any) -> int:
        """Batches of this worker's shared memory handed out and not yet garbage."""
        worker: _Worker = origin
        return worker.decoder.batches_alive

    def discard(self, origin: Any, payload: Payload | None) -> None:
        """Give a payload's slot back without decoding it."""
        if payload is not None:
            worker: _Worker = origin
            worker.decoder.discard(payload)

    # --- life and death -------------------------------------------------------------

    def handles(self) -> list[WorkerHandle]:
        """The current worker processes, for ``iterator._workers``."""
        return [worker.handle for worker in self._workers]

    def replace(self, worker_id: int) -> None:
        """Start a new worker in place of a dead one (same id, same seed)."""
        old = self._workers[worker_id]
        old.process.join(timeout=TERMINATE_GRACE_S)
        if old.process.exitcode is None:
            old.process.kill()
            old.process.join()
        _kill_descendants(old)
        self._unwatch(old)
        _release(old)
        self._retired.append(old)
        self._workers[worker_id] = self._start(self._specs[worker_id])

    def kill(self, worker_id: int) -> None:
        """Kill a stuck worker; its sentinel then reports it like any death."""
        worker = self._workers[worker_id]
        if worker.process.exitcode is None:
            worker.process.kill()

    def dump_stacks(self, worker_id: int, timeout: float = 2.0) -> str:
        """The worker's current Python stacks (all threads), or "" if it can't say."""
        worker = self._workers[worker_id]
        pid = worker.pid
        if pid is None or worker.process.exitcode is not None:
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
        """Stop every worker and what they started, then free their resources; safe
        to call twice. A Ctrl-C meanwhile is held back until teardown is complete
        (it takes a few seconds at most), so nothing is left behind by it."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner_pid:
            # A forked child (one of ours, or another library's) inherited this
            # pool; the workers are not its children. Leave them to their owner.
            return
        with interrupts_deferred():
            self._teardown()

    def _teardown(self) -> None:
        for worker in self._workers:
            with contextlib.suppress(TypeError, ValueError):  # its page already let go
                request_stop(worker.arena.status_page)  # no task it has not begun
            with contextlib.suppress(OSError, ValueError):  # already gone
                worker.outbox.send(Stop())  # wakes a worker waiting for its next task
        _escalate(self._workers)
        for worker in self._workers:
            self._unwatch(worker)
            _kill_descendants(worker)
            _release(worker)
            worker.arena.drop_maps()
        for worker in self._retired:
            worker.arena.drop_maps()
        self._retired.clear()
        self._selector.close()
        if self._setup is not None:
            os.close(self._setup)
            self._setup = None


def _is_stopped(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() in (psutil.STATUS_STOPPED, "tracing-stop"))
    except psutil.Error:
        return False


def _kill_descendants(worker: _Worker) -> None:
    """Nothing may outlive the loader: kill what a worker started (a decoder, a
    ``multiprocessing.Pool``), after the worker itself is gone.

    A worker leads its own process group (see ``loop.worker_main``) and its
    children stay in it, also once re-parented after the worker died: the group
    outlives its leader while a member lives. Called after the worker was
    reaped, so its pid may have been reused: a group whose leader is alive
    again is someone else's and is left alone.
    """
    pid = worker.pid
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


def _release(worker: _Worker) -> None:
    """Close the main process's ends of a worker that has exited."""
    for conn in (worker.tasks, worker.results):
        conn.close()
    worker.arena.close()
    if worker.stacks >= 0:
        os.close(worker.stacks)
        worker.stacks = -1
    worker.handle._released()
    worker.process.close()


def _serialize_once(user: UserObjects, start_method: StartMethod) -> int | None:
    """Cloudpickle the user's objects into a memfd that every worker reads.

    None when they hold multiprocessing objects (a ``Lock``, a ``Value``) that pickle
    only while a process is being spawned: they then travel with each worker's start,
    as torch sends its dataset (see :class:`PickledWhileSpawning`)."""
    _pickle_main_by_value()
    try:
        data = _dumps(user)
    except RuntimeError as exc:
        if "through inheritance" in str(exc):
            return None
        raise _explain(user, exc, start_method) from exc
    except Exception as exc:
        raise _explain(user, exc, start_method) from exc
    fd = os.memfd_create(SETUP_NAME, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    return fd


def _pickle_main_by_value() -> None:
    """In a process that was itself spawned (Lightning's ddp_spawn,
    torch.multiprocessing.spawn), the parent's script runs as ``__mp_main__``; our
    workers do not run it again, so what it defines travels by value, as cloudpickle
    sends what ``__main__`` defines."""
    main = sys.modules.get("__main__")
    if main is not None and main.__name__ == "__mp_main__":
        cloudpickle.register_pickle_by_value(main)


class _UserPickler(cloudpickle.CloudPickler):
    """cloudpickle, plus conveyor's reducers for objects that pickle their insides by
    reference on their own (torch's DataPipe wrappers, see conveyor._datapipes)."""

    base_table: Any = cloudpickle.CloudPickler.dispatch_table

    def __init__(self, file: io.BytesIO) -> None:
        # Before Pickler.__init__, which is where the C pickler reads the table.
        self.dispatch_table = collections.ChainMap(_datapipes.reducers(), self.base_table)
        super().__init__(file)


def _dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _UserPickler(buffer).dump(obj)
    return buffer.getvalue()


class PickledWhileSpawning:
    """The user's objects, cloudpickled when ``Process.start`` pickles the worker's
    arguments: multiprocessing's locks and shared values accept to be pickled only
    then (and a shared value passes its file descriptor to that one child)."""

    def __init__(self, user: UserObjects) -> None:
        self.user = user

    def __reduce__(self) -> tuple[Any, ...]:
        buffer = io.BytesIO()
        _SpawningPickler(buffer).dump(self.user)
        return (cloudpickle.loads, (buffer.getvalue(),))


class _SpawningPickler(_UserPickler):
    """cloudpickle, plus the reducers multiprocessing registers for its own objects
    (a shared value's memory travels as a file descriptor passed to the child)."""

    base_table = collections.ChainMap(
        ForkingPickler._extra_reducers,  # type: ignore[attr-defined]
        cloudpickle.CloudPickler.dispatch_table,
    )


def _explain(user: UserObjects, error: Exception, start_method: StartMethod) -> Exception:
    from ..diagnostics.pickling import explain_unpicklable

    for role in ("dataset", "collate_fn", "worker_init_fn"):
        obj = getattr(user, role)
        try:
            _dumps(obj)
        except Exception as exc:
            return explain_unpicklable(obj, role, exc, role=role, start_method=start_method.name)
    return error


def _start_worker(
    context: BaseContext,
    method: StartMethod,
    spec: WorkerSpec,
    user: UserObjects,
    setup_fd: int | None,
    preload: Sequence[str] = (),
) -> _Worker:
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
        ),
        name=f"conveyor-worker-{spec.worker_id}",
        daemon=True,
    )
    try:
        start_process(method, process, preload)
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
    return _Worker(spec.worker_id, process, task_writer, result_reader, arena, stack_reader)


def _escalate(workers: list[_Worker]) -> None:
    _wait_for_stop(workers, STOP_GRACE_S)
    processes = [w.process for w in workers]
    for p in processes:
        if p.exitcode is None:
            p.terminate()
    _wait_for_exit(processes, TERMINATE_GRACE_S)
    for p in processes:
        if p.exitcode is None:
            p.kill()
    for p in processes:
        p.join()


def _wait_for_stop(workers: list[_Worker], grace: float) -> None:
    """Wait up to ``grace`` s for workers asked to stop to exit, meanwhile reading and
    dropping what they still send (a worker blocked writing into a full result pipe
    would never get to see it must stop) and writing what their task pipes still owe
    them (a worker waiting for the rest of a half-written frame would wait forever)."""
    deadline = time.monotonic() + grace
    with selectors.DefaultSelector() as selector:
        for worker in workers:
            with contextlib.suppress(OSError, ValueError):  # closed: nothing to watch
                selector.register(worker.process.sentinel, selectors.EVENT_READ, worker)
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
