"""Iterate with worker processes: dispatch tasks, wait on events, reorder.

Dispatch follows torch exactly: tasks go round-robin to the active workers,
``prefetch_factor`` per worker up front and one more per batch handed out, so
iterable-style datasets interleave their workers' batches in torch's order
and per-worker randomness lands on the same samples.

The main process blocks in ``multiprocessing.connection.wait`` on the result
pipes and the process sentinels together: a batch and a dead worker wake it
alike, at once.
"""

from __future__ import annotations

import itertools
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from .._transport.codec import InlinePayload
from .._workers.exits import describe_exit
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
    WorkerContext,
    WorkerCrashedError,
    WorkerStartupError,
    WorkerTimeoutError,
    attach_worker_context,
)
from ..sampling import draw_base_seed
from .pinning import pin_batch

if TYPE_CHECKING:
    from ..loader import DataLoader

DEFAULT_MAX_SLOTS_EXTRA = 4  # slots beyond prefetch_factor: batches the user holds


@dataclass
class _Outstanding:
    worker_id: int
    index: Any
    sent_at: float


class MultiprocessIterator:
    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        self._num_workers = loader.num_workers
        self._prefetch = loader.prefetch_factor or 0
        self._timeout = loader.timeout
        self._in_order = loader.in_order
        self._persistent = loader.persistent_workers
        self._pin = loader._pin_memory_enabled()
        self._index_sampler = loader._index_sampler
        self._iterable = loader._is_iterable
        self._len_hint: int | None = loader._iterable_len_called
        self._warned_inline = False
        base_seed = draw_base_seed(loader.generator)
        self._epoch = -1
        self._sampler_iter: Iterator[Any] = iter(())
        specs = [
            WorkerSpec(
                worker_id=i,
                num_workers=self._num_workers,
                base_seed=base_seed,
                iterable=self._iterable,
                auto_collation=loader._auto_collation,
                drop_last=loader.drop_last,
                max_slots=self._prefetch + DEFAULT_MAX_SLOTS_EXTRA,
                parent_pid=_own_pid(),
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
            if not self._persistent:
                self.close()
            raise
        except BaseException:
            self.close()
            raise
        self._num_yielded += 1
        self._check_iterable_length()
        return batch

    def close(self) -> None:
        """Stop the workers now (the loop ended, broke, or raised)."""
        self._closed = True
        self._finalizer()

    def _reset(self) -> None:
        """Start another epoch on the same (persistent) workers."""
        self._start_epoch()

    # --- epochs and dispatch ----------------------------------------------

    def _start_epoch(self) -> None:
        self._epoch += 1
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._next_seq = 0  # next seq to send
        self._rcvd_seq = 0  # next seq to hand out (in order)
        self._outstanding: dict[int, _Outstanding] = {}
        self._results: dict[int, Any] = {}  # done, not yet handed out
        self._active = [True] * self._num_workers
        self._cycle = itertools.cycle(range(self._num_workers))
        self._sampler_done = False
        for _ in range(self._prefetch * self._num_workers):
            self._dispatch()

    def _dispatch(self) -> None:
        if self._sampler_done:
            return
        for _ in range(self._num_workers):
            worker_id = next(self._cycle)
            if self._active[worker_id]:
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
        worker.send(Task(self._epoch, seq, index, worker.take_releases()))
        self._outstanding[seq] = _Outstanding(worker_id, index, time.monotonic())

    # --- receiving -------------------------------------------------------

    def _next_batch(self) -> Any:
        while True:
            seq = self._ready_seq()
            if seq is None:
                if not self._outstanding:
                    raise StopIteration
                self._receive()
                continue
            task = self._outstanding.pop(seq)
            message = self._results.pop(seq)
            if isinstance(message, IterationEnded):
                self._active[task.worker_id] = False
                self._dispatch()
                continue
            self._dispatch()
            if isinstance(message, TaskFailed):
                raise self._task_error(message, task)
            return self._decode(message, task)

    def _ready_seq(self) -> int | None:
        if self._in_order:
            return self._rcvd_seq_if_ready()
        return next(iter(self._results), None)

    def _rcvd_seq_if_ready(self) -> int | None:
        # Skip seqs already handed out (in_order=False never reaches here).
        if self._rcvd_seq in self._results:
            seq = self._rcvd_seq
            self._rcvd_seq += 1
            return seq
        return None

    def _receive(self) -> None:
        """Block until a worker sends something or dies; file what came."""
        by_conn = {w.results: w for w in self._workers}
        by_sentinel = {w.process.sentinel: w for w in self._workers}
        deadline = None if not self._timeout else time.monotonic() + self._timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait([*by_conn, *by_sentinel], timeout=remaining)
            if not ready:
                raise self._timeout_error()
            for obj in ready:
                if obj in by_conn:
                    self._handle_message(by_conn[obj])
            dead = [by_sentinel[obj] for obj in ready if obj in by_sentinel]
            for worker in dead:
                self._drain(worker)
                raise self._crash_error(worker)
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
        elif isinstance(message, StartupFailed):
            raise self._startup_error(worker, message)
        elif isinstance(message, (BatchDone, TaskFailed, IterationEnded)):
            if message.epoch != self._epoch or message.seq not in self._outstanding:
                # A batch of an epoch the user abandoned: just free its slot.
                if isinstance(message, BatchDone):
                    worker.decoder.discard(message.payload)
            else:
                self._results[message.seq] = message
        return True

    def _decode(self, message: BatchDone, task: _Outstanding) -> Any:
        worker = self._workers[task.worker_id]
        payload = message.payload
        if isinstance(payload, InlinePayload) and payload.slots_exhausted:
            self._warn_slots_exhausted(worker)
        batch = worker.decoder.decode(payload)
        return pin_batch(batch) if self._pin else batch

    # --- errors ------------------------------------------------------------

    def _task_error(self, message: TaskFailed, task: _Outstanding) -> BaseException:
        worker = self._workers[task.worker_id]
        exc = rebuild(message.error)
        return attach_worker_context(
            exc,
            WorkerContext(
                worker_id=worker.worker_id,
                pid=worker.pid or -1,
                stage=message.stage.value,
                indices=_indices(task.index, self._iterable),
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

    def _crash_error(self, worker: Worker) -> WorkerCrashedError:
        worker.process.join(timeout=1.0)
        held = [t for t in self._outstanding.values() if t.worker_id == worker.worker_id]
        indices = tuple(i for t in held for i in _indices(t.index, self._iterable))
        exit_text = describe_exit(worker.process.exitcode)
        holding = (
            f"It held {len(held)} task(s) with dataset indices {_short(indices)}."
            if indices
            else "It held no task."
        )
        return WorkerCrashedError(
            f"DataLoader worker {worker.worker_id} (pid {worker.pid}) exited unexpectedly: "
            f"{exit_text}. {holding}",
            worker_id=worker.worker_id,
            pid=worker.pid,
            exitcode=worker.process.exitcode,
            indices=indices,
        )

    def _timeout_error(self) -> WorkerTimeoutError:
        oldest_seq = min(self._outstanding)
        task = self._outstanding[oldest_seq]
        worker = self._workers[task.worker_id]
        age = time.monotonic() - task.sent_at
        return WorkerTimeoutError(
            f"DataLoader timed out after {self._timeout} seconds: no batch arrived. The "
            f"oldest task, batch {oldest_seq} (dataset indices "
            f"{_short(_indices(task.index, self._iterable))}), was sent to worker "
            f"{worker.worker_id} (pid {worker.pid}) {age:.1f} s ago. Fix: find what blocks "
            "that sample (a slow disk or network read, a lock), or raise timeout."
        )

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
            ResourceWarning,
            stacklevel=3,
        )

    def _check_iterable_length(self) -> None:
        if self._len_hint is not None and self._num_yielded > self._len_hint:
            warnings.warn(
                f"Length of IterableDataset {self._loader.dataset} was reported to be "
                f"{self._len_hint} (when accessing len(dataloader)), but {self._num_yielded} "
                "samples have been fetched. For multiprocessing data-loading, this could be "
                "caused by not properly configuring the IterableDataset replica at each "
                "worker (shard it with get_worker_info()).",
                UserWarning,
                stacklevel=3,
            )


def _indices(index: Any, iterable: bool) -> tuple[Any, ...]:
    if iterable:
        return ()
    return tuple(index) if isinstance(index, (list, tuple)) else (index,)


def _short(indices: tuple[Any, ...], limit: int = 16) -> str:
    shown = ", ".join(repr(i) for i in indices[:limit])
    return f"[{shown}{', ...' if len(indices) > limit else ''}]"


def _own_pid() -> int:
    import os

    return os.getpid()
