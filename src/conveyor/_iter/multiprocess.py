"""Iterate with worker processes: dispatch tasks, wait on events, reorder, recover.

Dispatch follows torch exactly: tasks go round-robin to the active workers,
``prefetch_factor`` per worker up front and one more per batch handed out, so
iterable-style datasets interleave their workers' batches in torch's order
and per-worker randomness lands on the same samples.

The main process blocks in ``multiprocessing.connection.wait`` on the result
pipes and the process sentinels together: a batch and a dead worker wake it
alike, at once. A dead worker is replaced and its unanswered tasks re-sent
(see ``_recover``): every index is still delivered exactly once, in order.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from .. import _torch
from .._transport.codec import InlinePayload
from .._workers.loop import UserObjects, WorkerSpec
from .._workers.pool import Worker, WorkerPool
from .._workers.protocol import (
    BatchDone,
    IterationEnded,
    Ready,
    Stage,
    StartupFailed,
    Task,
    TaskFailed,
)
from .._workers.remote_error import rebuild
from ..errors import (
    BatchesHeldWarning,
    WorkerContext,
    WorkerCrashedError,
    WorkerStartupError,
    attach_worker_context,
)
from ..records import InFlightTask, LoaderStatistics, WorkerStatistics
from ..sampling import draw_base_seed
from .pinning import pin_batch
from .policy import SupervisionPolicy
from .recovery import Recovery
from .skips import SkipLedger
from .tasks import (
    Done,
    Outstanding,
    UserError,
    WorkerCounters,
    batch_size_of,
    indices_of,
    short,
)
from .watchdog import Watchdog

if TYPE_CHECKING:
    from ..loader import DataLoader

log = logging.getLogger("conveyor")

SLOTS_BEYOND_PREFETCH = 4  # batches the user may hold before the pipe fallback


class MultiprocessIterator(Recovery, Watchdog):
    def __init__(self, loader: DataLoader) -> None:
        # Weak: a persistent iterator is held by its loader, and a cycle would
        # keep the workers alive after ``del loader`` until the cyclic GC runs.
        self._loader_ref = weakref.ref(loader)
        self._dataset_name = repr(loader.dataset)
        self._sampler = loader.sampler
        self._num_workers = loader.num_workers
        self._prefetch = loader.prefetch_factor or 0
        self._timeout = loader.timeout
        self._in_order = loader.in_order
        self._persistent = loader.persistent_workers
        self._pin = loader._pin_memory_enabled()
        self._index_sampler = loader._index_sampler
        self._iterable = loader._is_iterable
        self._policy: SupervisionPolicy = loader._policy
        self._len_hint: int | None = loader._iterable_len_called
        self._warned_inline = False
        self._restarts = 0
        self._retried = 0
        self._skips = SkipLedger(loader._skipped_log, self._policy)
        self._batch_time = 0.0  # moving average of a task's time in a worker
        self._counters = [WorkerCounters() for _ in range(self._num_workers)]
        self._killed_stuck: dict[int, str] = {}  # worker id -> why we killed it
        self._recheck_at = 0.0  # when _next_wake must read the status pages again
        self._fatal: WorkerCrashedError | None = None  # raised once earlier batches are out
        # torch iterates the index sampler once, draws the base seed, then
        # iterates it again per epoch: samplers that draw eagerly in __iter__
        # consume the RNG in that order, so do the same.
        self._sampler_iter: Iterator[Any] = iter(self._index_sampler)
        base_seed = draw_base_seed(loader.generator)
        self._epoch = -1
        specs = [
            WorkerSpec(
                worker_id=i,
                num_workers=self._num_workers,
                base_seed=base_seed,
                iterable=self._iterable,
                auto_collation=loader._auto_collation,
                drop_last=loader.drop_last,
                max_slots=self._prefetch + SLOTS_BEYOND_PREFETCH,
                parent_pid=os.getpid(),
                skip_errors=self._policy.on_error == "skip",
                tensors_in_main=_torch.load() is not None,
            )
            for i in range(self._num_workers)
        ]
        user = UserObjects(loader.dataset, loader.collate_fn, loader.worker_init_fn)
        self._pool = WorkerPool(loader._context(), user, specs)
        self._workers: list[Worker] = self._pool.workers
        self._finalizer = weakref.finalize(self, self._pool.close)
        self._closed = False
        self._start_epoch()

    # --- public iterator protocol ---------------------------------------

    def __iter__(self) -> MultiprocessIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            batch = self._next_batch()
        except StopIteration:
            self._skips.log_epoch_summary()
            if not self._persistent:
                self.close()
            raise
        except UserError as wrapped:
            # Like torch: the failed batch is consumed, the next one follows.
            raise wrapped.error from None
        except BaseException:
            self.close()
            raise
        self._num_yielded += 1
        self._check_iterable_length()
        return batch

    def close(self) -> None:
        """Stop the workers now (the loop ended, broke, or raised)."""
        if not self._closed:
            loader = self._loader_ref()
            if loader is not None:
                loader._final_statistics = self.statistics()
        self._closed = True
        self._finalizer()

    def _reset(self) -> None:
        """Start another epoch on the same (persistent) workers."""
        self._start_epoch()

    def statistics(self) -> LoaderStatistics:
        now = time.monotonic()
        in_flight = tuple(
            InFlightTask(t.worker_id, seq, indices_of(t.index, self._iterable), now - t.sent_at)
            for seq, t in sorted(self._outstanding.items())
            if seq not in self._results
        )
        workers = tuple(
            WorkerStatistics(
                worker_id=w.worker_id,
                pid=w.pid,
                batches=c.batches,
                samples=c.samples,
                restarts=c.restarts,
                samples_per_s=c.samples / max(now - c.since, 1e-9),
            )
            for w, c in zip(self._workers, self._counters, strict=True)
        )
        return LoaderStatistics(
            epoch=self._epoch,
            batches=self._num_yielded,
            samples=self._samples_yielded,
            worker_restarts=self._restarts,
            tasks_retried=self._retried,
            samples_skipped=len(self._skips.records),
            in_flight=in_flight,
            workers=workers,
        )

    # --- epochs and dispatch ----------------------------------------------

    def _start_epoch(self) -> None:
        loader = self._loader_ref()
        self._epoch = loader._next_epoch() if loader is not None else self._epoch + 1
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._samples_yielded = 0
        self._next_seq = 0  # next seq to send
        self._rcvd_seq = 0  # next seq to hand out (in order)
        self._outstanding: dict[int, Outstanding] = {}
        self._results: dict[int, Done] = {}  # done, not yet handed out
        self._active = [True] * self._num_workers
        self._tasks_per_worker = [0] * self._num_workers  # sent, not yet handed out
        self._cycle = itertools.cycle(range(self._num_workers))
        self._sampler_done = False
        self._skips.start_epoch(self._epoch, self._epoch_samples())
        for _ in range(self._prefetch * self._num_workers):
            self._dispatch()

    def _epoch_samples(self) -> int | None:
        try:
            return len(self._sampler)
        except TypeError:
            return None

    def _dispatch(self) -> None:
        if self._sampler_done:
            return
        capacity = self._prefetch * self._num_workers // max(1, sum(self._active))
        for _ in range(self._num_workers):
            worker_id = next(self._cycle)
            if self._active[worker_id] and (
                # Out of order, route around a slow worker as torch does.
                self._in_order or self._tasks_per_worker[worker_id] < capacity
            ):
                break
        else:
            return
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            self._sampler_done = True
            return
        worker = self._workers[worker_id]
        seq = self._next_seq
        self._next_seq += 1
        exclude = self._known_poison(index)
        for poison in exclude:  # left out again: recorded again, for this epoch
            self._skips.record(
                poison,
                worker_id,
                "crash",
                "conveyor.errors.WorkerCrashedError",
                "killed its worker in an earlier epoch; left out without trying again",
            )
        if exclude and self._skips.over_budget():
            raise WorkerCrashedError(
                f"Dataset indices {short(exclude)} killed their workers in an earlier epoch "
                f"and are left out again. {self._skips.budget_note()}",
                worker_id=worker_id,
                indices=exclude,
            )
        worker.send(Task(self._epoch, seq, index, worker.take_releases(), exclude=exclude))
        self._outstanding[seq] = Outstanding(
            worker_id, index, time.monotonic(), exclude=exclude, timed=worker.ready
        )
        self._tasks_per_worker[worker_id] += 1

    def _known_poison(self, index: Any) -> tuple[Any, ...]:
        """Samples that killed workers earlier: left out again, without a crash."""
        poison = self._skips.poison() if not self._iterable else ()
        return tuple(i for i in indices_of(index, False) if i in poison) if poison else ()

    # --- receiving -------------------------------------------------------

    def _next_batch(self) -> Any:
        while True:
            seq = self._ready_seq()
            if seq is None:
                if self._fatal is not None:
                    raise self._fatal  # after every batch that arrived before it
                if not self._outstanding:
                    raise StopIteration
                self._receive()
                continue
            task = self._outstanding.pop(seq)
            done = self._results.pop(seq)
            self._tasks_per_worker[task.worker_id] -= 1
            message = done.message
            if isinstance(message, IterationEnded):
                self._active[task.worker_id] = False
                self._dispatch()
                continue
            self._dispatch()
            if isinstance(message, TaskFailed):
                raise UserError(self._task_error(message, task, done.worker))
            if message.payload is None:
                continue  # every sample of this batch was skipped
            return self._decode(message, done.worker)

    def _ready_seq(self) -> int | None:
        if not self._in_order:
            return next(iter(self._results), None)
        if self._rcvd_seq in self._results:
            self._rcvd_seq += 1
            return self._rcvd_seq - 1
        return None

    def _receive(self) -> None:
        """Block until a worker sends something or dies; file what came.

        Wakes early only for a deadline: a task running past ``timeout`` or past
        the stall threshold, measured from the worker's status page (time the
        task has actually been running, not queued or waiting for start-up).
        """
        expected = self._outstanding.get(self._rcvd_seq) if self._in_order else None
        if expected is not None:
            # The common case: the worker holding the next batch has already
            # answered. A zero-timeout poll of its pipe is far cheaper than
            # wait(), which builds a selector over every pipe and sentinel.
            worker = self._workers[expected.worker_id]
            # (EOF polls readable too: a dead worker falls through to wait(),
            # where its sentinel is seen.)
            if worker.results.poll() and self._handle_message(worker):
                return
        while True:
            by_conn = {w.results: w for w in self._workers}
            by_sentinel = {w.process.sentinel: w for w in self._workers}
            ready = wait([*by_conn, *by_sentinel], timeout=self._next_wake())
            if not ready:
                if self._check_timeout():
                    return
                self._report_stalls()
                continue
            for obj in ready:
                if obj in by_conn:
                    self._handle_message(by_conn[obj])
            for obj in ready:
                if obj in by_sentinel:
                    try:
                        self._recover(by_sentinel[obj])
                    except WorkerCrashedError as exc:
                        self._fatal = exc
                        return
            return

    def _drain(self, worker: Worker) -> None:
        """Take what a dead worker sent before dying."""
        while True:
            try:
                if not worker.results.poll():
                    return
            except (OSError, EOFError):
                return
            if not self._handle_message(worker):
                return

    def _handle_message(self, worker: Worker) -> bool:
        try:
            message = worker.results.recv()
        except (EOFError, OSError):
            return False  # it died; its sentinel tells the rest
        if isinstance(message, Ready):
            worker.ready = True
            # A replacement that starts fine ends a run of start-up deaths.
            self._counters[worker.worker_id].init_crashes = 0
        elif isinstance(message, StartupFailed):
            raise self._startup_error(worker, message)
        elif isinstance(message, (BatchDone, TaskFailed, IterationEnded)):
            task = self._outstanding.get(message.seq)
            if message.epoch != self._epoch or task is None or message.seq in self._results:
                # A batch of an epoch the user abandoned: just free its slot.
                if isinstance(message, BatchDone) and message.payload is not None:
                    worker.decoder.discard(message.payload)
                return True
            self._results[message.seq] = Done(message, worker)
            if task.timed:
                elapsed = time.monotonic() - task.sent_at
                ewma = 0.9 * self._batch_time + 0.1 * elapsed
                self._batch_time = ewma if self._batch_time else elapsed
            if isinstance(message, BatchDone) and message.skipped:
                self._record_skips(message.skipped, worker, message)
        return True

    def _decode(self, message: BatchDone, worker: Worker) -> Any:
        payload = message.payload
        if isinstance(payload, InlinePayload) and payload.slots_exhausted:
            self._warn_slots_exhausted(worker)
        batch = worker.decoder.decode(payload)
        counters = self._counters[worker.worker_id]
        counters.batches += 1
        size = batch_size_of(batch)
        counters.samples += size
        self._samples_yielded += size
        return pin_batch(batch) if self._pin else batch

    # --- errors ------------------------------------------------------------

    def _task_error(self, message: TaskFailed, task: Outstanding, worker: Worker) -> BaseException:
        exc = rebuild(message.error)
        return attach_worker_context(
            exc,
            WorkerContext(
                worker_id=worker.worker_id,
                pid=worker.pid or -1,
                stage=message.stage.value,
                indices=indices_of(task.index, self._iterable),
                traceback=message.error.traceback,
                epoch=message.epoch,
                seq=message.seq,
            ),
        )

    def _startup_error(self, worker: Worker, message: StartupFailed) -> BaseException:
        exc = rebuild(message.error)
        context = WorkerContext(
            worker_id=worker.worker_id,
            pid=worker.pid or -1,
            stage=message.stage.value,
            traceback=message.error.traceback,
        )
        if message.stage is Stage.WORKER_INIT:
            return attach_worker_context(exc, context)
        error = WorkerStartupError(
            f"DataLoader worker {worker.worker_id} (pid {worker.pid}) could not start: "
            f"{type(exc).__name__}: {exc}. This usually means the dataset, collate_fn or "
            "worker_init_fn refers to something the worker process cannot import (a module "
            "missing from its sys.path, or a class defined in a module that is not "
            "importable there). Fix: make that module importable in the worker, or use "
            "multiprocessing_context='fork'."
        )
        error.__cause__ = exc
        return attach_worker_context(error, context)

    def _warn_slots_exhausted(self, worker: Worker) -> None:
        if self._warned_inline:
            return
        self._warned_inline = True
        warnings.warn(
            f"DataLoader worker {worker.worker_id}: every shared-memory slot is held by "
            "batches still alive in this process, so batches are now copied through a pipe "
            "(slower). This happens when the loop keeps references to many batches (e.g. "
            "appends them to a list). Fix: keep only what you need (e.g. .clone() or "
            ".copy() the part you keep).",
            BatchesHeldWarning,
            stacklevel=4,
        )

    def _check_iterable_length(self) -> None:
        if self._len_hint is not None and self._num_yielded > self._len_hint:
            warnings.warn(
                f"Length of IterableDataset {self._dataset_name} was reported to be "
                f"{self._len_hint} (when accessing len(dataloader)), but {self._num_yielded} "
                "samples have been fetched. For multiprocessing data-loading, this could be "
                "caused by not properly configuring the IterableDataset replica at each "
                "worker (shard it with get_worker_info()).",
                UserWarning,
                stacklevel=3,
            )
