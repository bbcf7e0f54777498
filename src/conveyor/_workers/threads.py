"""Thread workers: ``num_workers`` worker cores in threads of the training process.

For work that releases the GIL (decoding images, NumPy on large arrays, waiting on
storage) a process per worker is pure cost: a copy of the dataset per process,
start-up, pickling, shared memory. Thread workers share the dataset object and hand
batches over by reference: nothing is copied or pickled.

What a thread cannot do, the pool does not claim: it cannot be killed, and a segfault
in one ends the training process. A thread stuck past ``timeout`` is *abandoned*
(``Abilities.abandon``): never used or waited for again, it ends by itself if its
sample ever returns; with ``on_timeout="restart"`` a fresh thread takes its place, while
fewer than :data:`MAX_ABANDONED` abandoned threads are still stuck in the process.
``close()`` waits for a thread still in a sample only :data:`CLOSE_JOIN_S`; the
interpreter's exit waits for them (thread_exit.py). Its stack can be read while it
runs, and its status (task, stage, for how long) is kept in memory, so stalls and
timeouts are reported as for processes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

from .._task.protocol import (
    GONE,
    BatchDone,
    Died,
    EpochMessage,
    MainMessage,
    StartupFailed,
    Stop,
    Task,
    WorkerMessage,
    WorkerStatus,
)
from . import interrupts, thread_exit
from .api import Abilities, PoolEvent, Received
from .core import WorkerCore
from .spec import UserObjects, WorkerSpec, own_objects
from .stacks import active_s
from .status import MemoryStatus

__all__ = ["ThreadPool"]

STOP_GRACE_S = 5.0  # close(): how long an idle thread may take to see its Stop
CLOSE_JOIN_S = 0.5  # close(): how long threads still in a sample get to finish it
# on_timeout="restart" abandons a stuck thread and starts another while fewer abandoned
# threads than this are still stuck in the process (each holds its stack and whatever
# its sample opened); past it, the timeout is raised instead.
MAX_ABANDONED = 16


class _ByReference:
    """A thread's transport: the batch itself."""

    arrays_as_tensors = False

    def collating(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def encode(self, batch: Any) -> Any:
        return _Batch(batch)


class _Batch:
    """A thread worker's batch, as the loop receives it (see api.BatchHandle)."""

    __slots__ = ("_batch",)
    nbytes = 0  # handed over by reference

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def open(self) -> Any:
        batch, self._batch = self._batch, None  # the loop's reference is the only one
        return batch

    def discard(self) -> None:
        self._batch = None


class _Outbox:
    """A worker's replies, onto the pool's one queue."""

    def __init__(self, worker: _Worker, events: queue.SimpleQueue[PoolEvent]) -> None:
        self._worker = worker
        self._events = events

    def send(self, message: WorkerMessage) -> None:
        if self._worker.abandoned:  # its tasks went to its replacement: the core ends
            raise BrokenPipeError("this thread worker was abandoned as stuck")
        payload = message.payload if type(message) is BatchDone else None
        self._events.put(Received(self._worker.spec.worker_id, message, payload))


class _Inbox:
    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[MainMessage] = queue.SimpleQueue()

    def recv(self) -> MainMessage:
        return self.queue.get()


class _Worker:
    """One worker thread: its core, its inbox, its status."""

    def __init__(
        self,
        spec: WorkerSpec,
        user: UserObjects,
        events: queue.SimpleQueue[PoolEvent],
        timeout: float = 0,
    ) -> None:
        self.spec = spec
        self.inbox = _Inbox()
        self.status = MemoryStatus()
        self.core = WorkerCore(spec, user, _ByReference(), self.status, owns_process=False)
        self.timeout = timeout  # the loader's: how long the exit waits for its sample
        self._events = events
        self.stopped = False  # asked to stop: its end is no death
        self.abandoned = False  # stuck: never used or waited for again
        # A daemon: a stuck thread must never keep the interpreter from exiting (the exit
        # waits for the others itself, boundedly: thread_exit.py).
        self.thread = threading.Thread(
            target=self._run, name=f"conveyor-worker-{spec.worker_id}", daemon=True
        )
        thread_exit.track(self)
        self.thread.start()

    def stop(self) -> None:
        """Run no task not begun yet; end after the one running, if any."""
        self.stopped = True
        self.status.stopping = True
        self.inbox.queue.put(Stop())  # wakes it if it waits for a task

    def in_sample(self) -> bool:
        """Running the user's code (a task, or start-up and worker_init_fn)."""
        return self.thread.is_alive() and self.status.read().stage is not None

    def stuck(self) -> bool:
        """Abandoned, or running one task past the loader's timeout: nothing waits for it."""
        if self.abandoned:
            return True
        status = self.status.read()
        return bool(self.timeout) and status.stage is not None and status.age_s >= self.timeout

    def _run(self) -> None:
        outbox = _Outbox(self, self._events)
        try:
            first = self.core.start()
            outbox.send(first)
            if isinstance(first, StartupFailed):
                return
            self.core.serve(self.inbox, outbox)
        except BaseException:  # conveyor's own failure: the loop sees a dead worker
            if not self.abandoned:  # (an abandoned one's start-up reply is refused)
                traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                self.core.close()
            if not self.stopped:
                status = self.status.read()
                self._events.put(Died(self.spec.worker_id, os.getpid(), None, status))


class ThreadPool:
    """Worker cores in threads of this process, behind the pool protocol (api.py)."""

    def __init__(
        self,
        user: UserObjects,
        specs: Sequence[WorkerSpec],
        *,
        timeout: float = 0,
    ) -> None:
        """``timeout``: the loader's (how long the interpreter's exit waits for a sample)."""
        self._user = user
        self._specs = list(specs)
        self._timeout = timeout
        self._events: queue.SimpleQueue[PoolEvent] = queue.SimpleQueue()
        self._workers = [self._new_worker(spec) for spec in specs]
        self._closed = False
        interrupts.watch_ctrl_c()  # a Ctrl-C anywhere bounds the exit's wait for them

    def _new_worker(self, spec: WorkerSpec) -> _Worker:
        return _Worker(spec, own_objects(self._user), self._events, self._timeout)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def abilities(self) -> Abilities:
        return Abilities(inspect=self, abandon=self, usage=self, resize=self)

    def send(self, worker_id: int, message: Task | EpochMessage) -> None:
        if not isinstance(message, Task):  # what a replacement starts with too
            self._specs[worker_id] = self._specs[worker_id].keeping(message)
        self._workers[worker_id].inbox.queue.put(message)

    def wait(self, timeout: float | None) -> list[PoolEvent]:
        try:
            events = [self._events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:  # what else has come, without waiting
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def add(self, spec: WorkerSpec) -> None:
        """One more worker thread (its id: the next one)."""
        assert spec.worker_id == len(self._workers), "workers are added in order"
        worker = self._new_worker(spec)  # (a thread that cannot start adds nothing)
        self._specs.append(spec)
        self._workers.append(worker)

    def retire(self, worker_id: int) -> None:
        """Stop a worker thread that has no task left, for good."""
        worker = self._workers[worker_id]
        worker.stop()
        worker.thread.join(STOP_GRACE_S)

    def restart(self, worker_id: int) -> None:
        """A fresh thread in place of one abandoned as stuck, or of one that ended
        unexpectedly (an error in conveyor itself)."""
        self._workers[worker_id] = self._new_worker(self._specs[worker_id])

    def close(self) -> None:
        """Ask every thread to stop after its task. An idle one ends at once and is
        joined; one still in a sample gets :data:`CLOSE_JOIN_S` (all together) and is
        then left to finish it (the exit waits for it: thread_exit.py); a stuck one
        (abandoned, or past the timeout) is not waited for at all."""
        if self._closed:
            return
        self._closed = True
        interrupts.unwatch_ctrl_c()
        for worker in self._workers:
            worker.stop()
        busy_until = time.monotonic() + CLOSE_JOIN_S
        for worker in self._workers:
            if worker.stuck() or worker.thread is threading.current_thread():
                continue
            if worker.in_sample():
                worker.thread.join(max(0.0, busy_until - time.monotonic()))
            else:
                worker.thread.join(STOP_GRACE_S)

    # --- stuck workers (Abilities.abandon) ---------------------------------------------

    def abandon(self, worker_id: int) -> None:
        """Leave a stuck thread to itself: a Died follows (see api.Abandoner)."""
        worker = self._workers[worker_id]
        if worker.abandoned:
            return
        status = worker.status.read()
        worker.abandoned = True
        worker.stop()
        cause = "stuck, and abandoned: a thread cannot be killed"
        self._events.put(Died(worker_id, os.getpid(), None, status, cause=cause))

    def no_replacement(self) -> str | None:
        stuck = thread_exit.abandoned_alive()
        if stuck < MAX_ABANDONED:
            return None
        return (
            f"{stuck} thread workers abandoned earlier are still stuck in this process, "
            f"and conveyor abandons no more than {MAX_ABANDONED} (each holds its stack and "
            "whatever its sample opened). Find what blocks them (the stack above), or use "
            "worker processes (worker_method='multiprocessing'), which can be killed."
        )

    # --- what workers use (Abilities.usage) --------------------------------------------

    def active_s(self, worker_id: int) -> float | None:
        return active_s(os.getpid(), self._workers[worker_id].thread.native_id)

    def memory_bytes(self, worker_id: int) -> int | None:
        return None  # threads share the process's memory

    def in_memory(self, batches: Iterable[Any]) -> int:
        return 0  # batches are the garbage collector's: nothing of the workers' holds them

    # --- seeing into workers (Abilities.inspect) ---------------------------------------

    def pids(self) -> list[int | None]:
        return [os.getpid()] * len(self._workers)

    def status(self, worker_id: int) -> WorkerStatus:
        worker = self._workers[worker_id]
        return GONE if worker.abandoned else worker.status.read()

    def stacks(self, worker_id: int, timeout: float = 2.0) -> str:
        thread = self._workers[worker_id].thread
        frame = sys._current_frames().get(thread.ident or -1)
        if frame is None:
            return ""
        lines = traceback.format_stack(frame)
        return f"Thread {thread.name} (most recent call last):\n" + "".join(lines).rstrip()
