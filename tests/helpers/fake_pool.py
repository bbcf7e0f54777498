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

import itertools
import pickle
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from conveyor._task import Collated, Exhausted, Failed, NothingLeft, TaskRunner
from conveyor._transport.codec import InlinePayload
from conveyor._workers.events import Died, PoolEvent, Received
from conveyor._workers.loop import UserObjects, WorkerSpec, _sent
from conveyor._workers.protocol import (
    BatchDone,
    IterationEnded,
    Ready,
    Stage,
    Task,
    TaskFailed,
)
from conveyor._workers.remote_error import capture
from conveyor._workers.status import WorkerStatus
from conveyor.config import StartMethod

IDLE = WorkerStatus(-1, -1, None, -1, 0.0)


class WouldHang(AssertionError):
    """The loop waited without a deadline while no worker could ever answer."""


@dataclass
class _FakeWorker:
    worker_id: int
    pid: int
    runner: TaskRunner
    queue: deque[tuple[int, Task]] = field(default_factory=deque)
    ready_sent: bool = False
    epoch: int | None = None  # the runner was made for the first epoch, whichever it is


class FakePool:
    """Implements the loop's ``Pool`` protocol in-process (see the module docstring)."""

    instances: list[FakePool] = []

    def __init__(
        self, start_method: StartMethod, user: UserObjects, specs: Sequence[WorkerSpec]
    ) -> None:
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
        runner = TaskRunner(
            self.user.dataset,
            iterable=spec.iterable,
            auto_collation=spec.auto_collation,
            collate_fn=self.user.collate_fn,
            drop_last=spec.drop_last,
            skip_errors=spec.skip_errors,
        )
        return _FakeWorker(spec.worker_id, next(self._pids), runner)

    # --- the Pool protocol ----------------------------------------------------------

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def pids(self) -> list[int | None]:
        return [w.pid for w in self.workers]

    def send(self, worker_id: int, task: Task) -> None:
        self.sent.append((worker_id, task))
        self.workers[worker_id].queue.append((next(self._order), task))

    def send_releases(self) -> None:
        pass  # the fake transport has no slots

    def wait(self, timeout: float | None) -> list[PoolEvent]:
        for worker in self.workers:
            if not worker.ready_sent:
                worker.ready_sent = True
                return [Received(worker.worker_id, Ready(worker.worker_id, worker.pid), worker)]
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

    def decode(self, origin: Any, payload: Any) -> Any:
        assert isinstance(payload, InlinePayload)
        return pickle.loads(payload.data)

    def discard(self, origin: Any, payload: Any) -> None:
        self.discarded += 1

    def batches_alive(self, origin: Any) -> int:
        return 0  # batches travel inline: no slot is held

    def replace(self, worker_id: int) -> None:
        self.replaced.append(worker_id)
        self.workers[worker_id] = self._make(self.specs[worker_id])

    def seed_pipes(self, seed: int) -> None:
        self.specs = [replace(spec, pipe_seed=seed) for spec in self.specs]

    def kill(self, worker_id: int) -> None:
        self.killed.append(worker_id)
        self._deaths.append(worker_id)
        self.held.discard(worker_id)

    def dump_stacks(self, worker_id: int, timeout: float = 2.0) -> str:
        return f"  File 'fake.py', line 1 in worker {worker_id}"

    def close(self) -> None:
        self.closed = True

    # --- running a task -------------------------------------------------------------

    def _run(self, worker: _FakeWorker, task: Task) -> PoolEvent:
        if task.epoch != worker.epoch:
            if worker.epoch is not None:
                worker.runner.new_epoch()
            worker.epoch = task.epoch
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
        outcome = worker.runner.run(task.index, exclude=task.exclude, trace=task.trace)
        reply: BatchDone | TaskFailed | IterationEnded
        match outcome:
            case Collated(batch=batch, left_out=left_out):
                payload = InlinePayload(pickle.dumps(batch, protocol=5))
                if task.seq in self.undecodable:
                    payload = InlinePayload(pickle.dumps(_Undecodable(), protocol=5))
                reply = BatchDone(task.epoch, task.seq, payload, _sent(left_out), busy_s=0.01)
            case NothingLeft(left_out=left_out):
                reply = BatchDone(task.epoch, task.seq, None, _sent(left_out), busy_s=0.01)
            case Failed(stage=stage, error=error):
                reply = TaskFailed(task.epoch, task.seq, stage, capture(error))
            case Exhausted():
                reply = IterationEnded(task.epoch, task.seq)
        return Received(worker.worker_id, reply, worker)

    def _death(self, worker_id: int, exitcode: int, status: WorkerStatus) -> Died:
        worker = self.workers[worker_id]
        worker.queue.clear()  # what a dead worker had queued is gone with it
        return Died(worker_id, worker.pid, exitcode, status)


def _indices(index: Any, worker: _FakeWorker) -> list[Any]:
    if worker.runner.iterable:
        return []
    return list(index) if worker.runner.auto_collation else [index]


class _Undecodable:
    """Pickles in the worker, fails to unpickle in the main process."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, ())


def _refuse() -> None:
    raise LookupError("this batch cannot be rebuilt here")
