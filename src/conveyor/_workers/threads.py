"""Thread workers: ``num_workers`` worker cores in threads of the training process.

For work that releases the GIL (decoding images, NumPy on large arrays, waiting on
storage) a process per worker is pure cost: a copy of the dataset per process,
start-up, pickling, shared memory. Thread workers share the dataset object and hand
batches over by reference: nothing is copied or pickled.

What a thread cannot do, the pool does not claim: it cannot be killed (no ``kill``
ability, so ``on_timeout="restart"`` is refused at construction), and a segfault in
one ends the training process. Its stack can be read while it runs, and its status
(task, stage, for how long) is kept in memory, so stalls and timeouts are reported
as for processes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..config import StartMethod
from .api import Abilities
from .core import UserObjects, WorkerCore, WorkerSpec, own_objects
from .events import Died, PoolEvent, Received
from .protocol import BatchDone, MainMessage, SeedPipe, StartupFailed, Stop, Task, WorkerMessage
from .stacks import active_s
from .status import MemoryStatus, WorkerStatus

__all__ = ["ThreadPool"]

STOP_GRACE_S = 5.0  # how long close() waits for a thread to finish its task


class _ByReference:
    """A thread's transport: the batch itself."""

    arrays_as_tensors = False

    def collating(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def encode(self, batch: Any) -> Any:
        return _Batch(batch)

    def release(self, released: tuple[int, ...]) -> None:
        pass  # no slots: memory is the garbage collector's

    def trim(self) -> None:
        pass


class _Batch:
    """A thread worker's batch, as the loop receives it (see api.BatchHandle)."""

    __slots__ = ("_batch",)
    slot_bytes = 0
    slots_exhausted = False
    held_in_worker = 0
    nbytes = 0  # handed over by reference

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def open(self) -> Any:
        batch, self._batch = self._batch, None  # the loop's reference is the only one
        return batch

    def discard(self) -> None:
        self._batch = None

    def batches_alive(self) -> int:
        return 0


class _Outbox:
    """A worker's replies, onto the pool's one queue."""

    def __init__(self, worker_id: int, events: queue.SimpleQueue[PoolEvent]) -> None:
        self._worker_id = worker_id
        self._events = events

    def send(self, message: WorkerMessage) -> None:
        payload = message.payload if type(message) is BatchDone else None
        self._events.put(Received(self._worker_id, message, payload))


class _Inbox:
    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[MainMessage] = queue.SimpleQueue()

    def recv(self) -> MainMessage:
        return self.queue.get()


class _Worker:
    """One worker thread: its core, its inbox, its status."""

    def __init__(
        self, spec: WorkerSpec, user: UserObjects, events: queue.SimpleQueue[PoolEvent]
    ) -> None:
        self.spec = spec
        self.inbox = _Inbox()
        self.status = MemoryStatus()
        self.core = WorkerCore(spec, user, _ByReference(), self.status, owns_process=False)
        self._events = events
        self.stopped = False  # asked to stop: its end is no death
        self.thread = threading.Thread(
            target=self._run, name=f"conveyor-worker-{spec.worker_id}", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        outbox = _Outbox(self.spec.worker_id, self._events)
        try:
            first = self.core.start()
            outbox.send(first)
            if isinstance(first, StartupFailed):
                return
            self.core.serve(self.inbox, outbox)
        except BaseException:  # conveyor's own failure: the loop sees a dead worker
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
        start_method: StartMethod,  # unused: threads start no process
        user: UserObjects,
        specs: Sequence[WorkerSpec],
    ) -> None:
        self._user = user
        self._specs = list(specs)
        self._events: queue.SimpleQueue[PoolEvent] = queue.SimpleQueue()
        self._workers = [_Worker(spec, own_objects(self._user), self._events) for spec in specs]
        self._closed = False

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def abilities(self) -> Abilities:
        return Abilities(inspect=self, usage=self, resize=self)

    def send(self, worker_id: int, message: Task | SeedPipe) -> None:
        if isinstance(message, SeedPipe):
            spec = self._specs[worker_id]
            self._specs[worker_id] = replace(spec, pipe_seed=message.seed)
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
        self._specs.append(spec)
        self._workers.append(_Worker(spec, own_objects(self._user), self._events))

    def retire(self, worker_id: int) -> None:
        """Stop a worker thread that has no task left, for good."""
        worker = self._workers[worker_id]
        worker.stopped = True
        worker.inbox.queue.put(Stop())
        worker.thread.join(STOP_GRACE_S)

    def restart(self, worker_id: int) -> None:
        """A thread that ended unexpectedly (an error in conveyor itself) is replaced."""
        spec = self._specs[worker_id]
        self._workers[worker_id] = _Worker(spec, own_objects(self._user), self._events)

    def close(self) -> None:
        """Ask every thread to stop after its task, and wait for them a while: a thread
        stuck in user code cannot be killed, and is left to finish (it is a daemon)."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.stopped = True
            worker.status.stopping = True  # queued tasks are not begun
            worker.inbox.queue.put(Stop())
        for worker in self._workers:
            if worker.thread is not threading.current_thread():
                worker.thread.join(STOP_GRACE_S)

    # --- what workers use (Abilities.usage) --------------------------------------------

    def active_s(self, worker_id: int) -> float | None:
        return active_s(os.getpid(), self._workers[worker_id].thread.native_id)

    def memory_bytes(self, worker_id: int) -> int | None:
        return None  # threads share the process's memory

    def alive(self) -> int:
        return 0  # no slots: batches are the garbage collector's

    # --- seeing into workers (Abilities.inspect) ---------------------------------------

    def pids(self) -> list[int | None]:
        return [os.getpid()] * len(self._workers)

    def status(self, worker_id: int) -> WorkerStatus:
        return self._workers[worker_id].status.read()

    def stacks(self, worker_id: int, timeout: float = 2.0) -> str:
        thread = self._workers[worker_id].thread
        frame = sys._current_frames().get(thread.ident or -1)
        if frame is None:
            return ""
        lines = traceback.format_stack(frame)
        return f"Thread {thread.name} (most recent call last):\n" + "".join(lines).rstrip()
