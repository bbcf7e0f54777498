"""An in-process stand-in for ``WorkerPool``: the loop's own tests run without processes.

Tasks run through conveyor's real task runner (the one workers use), in the
order the test chooses: by default the oldest task sent is answered first.
A test can make a worker slow (answered last) or hold it (its tasks stay
unanswered, its status page says it is busy), make a dataset index
kill whichever worker fetches it (always, once, or a given number of times), or make
a batch fail to decode. If the loop
ever waits with no deadline while nothing can answer, the fake raises
instead of hanging: a real pool would block forever there.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor._task.protocol import (
    Died,
    EpochMessage,
    Ready,
    Stage,
    StartupFailed,
    Task,
    WorkerStatus,
)
from conveyor._transport.codec import InlinePayload
from conveyor._transport.pickler import dumps
from conveyor._workers.api import Abilities, PoolEvent, Received
from conveyor._workers.core import STOP, WorkerCore
from conveyor._workers.spec import UserObjects, WorkerSpec, own_objects
from conveyor._workers.status import MemoryStatus

IDLE = WorkerStatus(-1, -1, None, -1, 0.0)


class WouldHang(AssertionError):
    """The loop waited without a deadline while no worker could ever answer."""


class _PickledTransport:
    """Batches cross as a pickle, as they would cross a pipe (no shared memory)."""

    arrays_as_tensors = False

    def collating(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def encode(self, batch: Any) -> InlinePayload:
        return InlinePayload(dumps(batch, arrays_as_tensors=self.arrays_as_tensors))


class _Handle:
    """A received batch: unpickled when the loop opens it."""

    nbytes = 0

    def __init__(self, pool: FakePool, payload: InlinePayload) -> None:
        self._pool = pool
        self._payload = payload

    def open(self) -> Any:
        return pickle.loads(self._payload.data)

    def discard(self) -> None:
        self._pool.discarded += 1


@dataclass
class _FakeWorker:
    worker_id: int
    pid: int
    core: WorkerCore
    first: Ready | StartupFailed
    queue: deque[tuple[int, Task]] = field(default_factory=deque)
    ready_sent: bool = False


class FakePool:
    """Implements the loop's ``Pool`` protocol in-process (see the module docstring)."""

    instances: list[FakePool] = []

    def __init__(self, user: UserObjects, specs: Sequence[WorkerSpec]) -> None:
        self.user = user
        self.specs = list(specs)
        self._pids = itertools.count(1000)
        self._order = itertools.count()
        self.workers = [self._make(spec) for spec in specs]
        self.slow: set[int] = set()  # answered only when no other worker can answer
        self.held: set[int] = set()  # workers that never answer (frozen)
        self.kill_at: dict[Any, int] = {}  # dataset index -> exit code of the worker fetching it
        self.kill_once: dict[Any, int] = {}  # the same, the first time only
        # The same, with each code in turn, then fetched fine (a kill from outside
        # that happens to land on the same sample again).
        self.kill_next: dict[Any, list[int]] = {}
        self.undecodable: set[int] = set()  # seqs whose batch fails to decode
        self.stalled: dict[int, WorkerStatus] = {}  # worker id -> status page while held
        self.sent: list[tuple[int, Task]] = []  # every (worker id, task) sent, in order
        self.replaced: list[int] = []
        self.killed: list[int] = []
        self.discarded = 0
        self.closed = False
        self._deaths: list[int] = []  # workers killed from outside, to report
        self._idle_waits = 0
        FakePool.instances.append(self)

    def _make(self, spec: WorkerSpec) -> _FakeWorker:
        """A worker as its process would make it: a core with a dataset of its own (a
        shallow copy, as a thread worker's), started (its Ready, or the error of its
        worker_init_fn, is its first message)."""
        user = own_objects(self.user)
        core = WorkerCore(spec, user, _PickledTransport(), MemoryStatus(), owns_process=False)
        return _FakeWorker(spec.worker_id, next(self._pids), core, core.start())

    # --- the Pool protocol ----------------------------------------------------------

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def abilities(self) -> Abilities:
        return Abilities(inspect=self, kill=self.kill)

    def pids(self) -> list[int | None]:
        return [w.pid for w in self.workers]

    def send(self, worker_id: int, message: Task | EpochMessage) -> None:
        if not isinstance(message, Task):  # kept for a replacement, as the real pools do
            self.specs[worker_id] = self.specs[worker_id].keeping(message)
            self.workers[worker_id].core.handle(message)
            return
        self.sent.append((worker_id, message))
        self.workers[worker_id].queue.append((next(self._order), message))

    def wait(self, timeout: float | None) -> list[PoolEvent]:
        for worker in self.workers:
            if not worker.ready_sent:
                worker.ready_sent = True
                return [Received(worker.worker_id, worker.first)]
        if self._deaths:
            return [self._death(self._deaths.pop(0), exitcode=-9, status=IDLE)]
        waiting = [w for w in self.workers if w.queue and w.worker_id not in self.held]
        runnable = [w for w in waiting if w.worker_id not in self.slow] or waiting
        if not runnable:
            # Time passes only in a real wait: here the deadline has come at once.
            self._idle_waits += 1
            if timeout is None or self._idle_waits > 100:
                raise WouldHang("the loop waits forever: no worker can answer")
            return []
        self._idle_waits = 0
        worker = min(runnable, key=lambda w: w.queue[0][0])
        _, task = worker.queue.popleft()
        return [self._run(worker, task)]

    def status(self, worker_id: int) -> WorkerStatus:
        return self.stalled.get(worker_id, IDLE) if worker_id in self.held else IDLE

    def restart(self, worker_id: int) -> None:
        self.replaced.append(worker_id)
        self.workers[worker_id].core.close()
        self.workers[worker_id] = self._make(self.specs[worker_id])

    def kill(self, worker_id: int) -> None:
        self.killed.append(worker_id)
        self._deaths.append(worker_id)
        self.held.discard(worker_id)

    def stacks(self, worker_id: int, timeout: float = 2.0) -> str:
        return f"  File 'fake.py', line 1 in worker {worker_id}"

    def close(self) -> None:
        for worker in self.workers:
            worker.core.close()
        self.closed = True

    # --- running a task -------------------------------------------------------------

    def _run(self, worker: _FakeWorker, task: Task) -> PoolEvent:
        for position, index in enumerate(_indices(task.index, worker)):
            if index in self.kill_once and index not in task.exclude:
                status = WorkerStatus(task.epoch, task.seq, Stage.FETCH, -1, 0.0)
                return self._death(worker.worker_id, self.kill_once.pop(index), status)
            if self.kill_next.get(index) and index not in task.exclude:
                traced = position if task.trace else -1
                status = WorkerStatus(task.epoch, task.seq, Stage.FETCH, traced, 0.0)
                return self._death(worker.worker_id, self.kill_next[index].pop(0), status)
            if index in self.kill_at and index not in task.exclude:
                # The status page names the sample only on a traced retry, as a worker's does.
                traced = position if task.trace else -1
                status = WorkerStatus(task.epoch, task.seq, Stage.FETCH, traced, 0.0)
                return self._death(worker.worker_id, self.kill_at[index], status)
        reply = worker.core.handle(task)
        assert reply is not None and reply is not STOP
        payload = getattr(reply, "payload", None)
        if payload is None:
            return Received(worker.worker_id, reply)
        if task.seq in self.undecodable:
            payload = InlinePayload(pickle.dumps(_Undecodable(), protocol=5))
        return Received(worker.worker_id, reply, _Handle(self, payload))

    def _death(self, worker_id: int, exitcode: int, status: WorkerStatus) -> Died:
        worker = self.workers[worker_id]
        worker.queue.clear()  # what a dead worker had queued is gone with it
        return Died(worker_id, worker.pid, exitcode, status)


def _indices(index: Any, worker: _FakeWorker) -> list[Any]:
    spec = worker.core.spec
    if spec.iterable:
        return []
    return list(index) if spec.auto_collation else [index]


class _Undecodable:
    """Pickles in the worker, fails to unpickle in the main process."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, ())


def _refuse() -> None:
    raise LookupError("this batch cannot be rebuilt here")
