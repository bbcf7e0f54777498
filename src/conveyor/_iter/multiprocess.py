"""Iterate with worker processes: the loop between the task book and the pool.

The loop does the I/O and nothing else: it draws indices from the sampler,
asks the :class:`~conveyor._iter.book.TaskBook` what to do, sends tasks
through the pool, blocks in ``pool.wait`` (result pipes and process
sentinels together: a batch and a dead worker wake it alike, at once) and
turns the book's decisions into batches, warnings and exceptions. Every rule
about tasks lives in the book.
"""

from __future__ import annotations

import os
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from .. import _torch
from .._compat import assert_never
from .._transport.codec import InlinePayload, Payload
from .._workers.events import Died, PoolEvent, Received
from .._workers.loop import UserObjects, WorkerSpec
from .._workers.pool import WorkerPool
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
from .._workers.status import WorkerStatus
from ..config import LoaderConfig, LoaderHistory, StartMethod
from ..errors import (
    BatchesHeldWarning,
    WorkerContext,
    WorkerRestartedWarning,
    WorkerStallWarning,
    WorkerStartupError,
    add_note,
    attach_worker_context,
)
from ..records import LoaderStatistics
from ..sampling import draw_base_seed
from .batches import batch_size_of
from .book import (
    Busy,
    Entry,
    EpochEnd,
    GiveUp,
    Handout,
    Restart,
    Stalled,
    TaskBook,
    TimedOut,
    Wait,
)
from .pinning import pin_batch, pinning_enabled

SLOTS_BEYOND_PREFETCH = 4  # batches the user may hold before the pipe fallback


class Pool(Protocol):
    """What the loop needs of a worker pool (``WorkerPool``; tests use a fake)."""

    @property
    def num_workers(self) -> int: ...
    def pids(self) -> list[int | None]: ...
    def send(self, worker_id: int, task: Task) -> None: ...
    def wait(self, timeout: float | None, expect: int | None = None) -> list[PoolEvent]: ...
    def status(self, worker_id: int) -> WorkerStatus: ...
    def decode(self, origin: Any, payload: Payload) -> Any: ...
    def discard(self, origin: Any, payload: Payload | None) -> None: ...
    def replace(self, worker_id: int) -> None: ...
    def kill(self, worker_id: int) -> None: ...
    def dump_stacks(self, worker_id: int, timeout: float = 2.0) -> str: ...
    def close(self) -> None: ...


class PoolFactory(Protocol):
    def __call__(
        self, start_method: StartMethod, user: UserObjects, specs: Sequence[WorkerSpec]
    ) -> Pool: ...


class _TaskError(Exception):
    """Carries an exception from user code out of ``_next_batch`` (see ``__next__``)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class MultiprocessIterator:
    def __init__(
        self,
        config: LoaderConfig,
        history: LoaderHistory,
        pool_factory: PoolFactory = WorkerPool,
    ) -> None:
        self._config = config
        self._history = history
        self._pin = pinning_enabled(config)
        self._warned_inline = False
        self.closed = False
        # torch iterates the index sampler once, draws the base seed, then
        # iterates it again per epoch: samplers that draw eagerly in __iter__
        # consume the RNG in that order, so do the same.
        self._sampler_iter: Iterator[Any] = iter(config.index_sampler)
        base_seed = draw_base_seed(config.generator)
        self._book = TaskBook(
            num_workers=config.num_workers,
            prefetch=config.prefetch_factor,
            in_order=config.in_order,
            iterable=config.iterable,
            auto_collation=config.auto_collation,
            policy=config.policy,
            skipped=history.skipped,
            timeout=config.timeout,
            forked=config.start_method.copies_memory,
            now=time.monotonic(),
        )
        specs = [
            WorkerSpec(
                worker_id=i,
                num_workers=config.num_workers,
                base_seed=base_seed,
                iterable=config.iterable,
                auto_collation=config.auto_collation,
                drop_last=config.drop_last,
                max_slots=config.prefetch_factor + SLOTS_BEYOND_PREFETCH,
                parent_pid=os.getpid(),
                skip_errors=config.policy.skipping,
                tensors_in_main=_torch.load() is not None,
            )
            for i in range(config.num_workers)
        ]
        user = UserObjects(config.dataset, config.collate_fn, config.worker_init_fn)
        self._pool = pool_factory(config.start_method, user, specs)
        self._finalizer = weakref.finalize(self, self._pool.close)
        self._recheck_at = 0.0  # when the status pages must be read again (deadlines)
        self._start_epoch()

    # --- the iterator protocol ----------------------------------------------------------

    def __iter__(self) -> MultiprocessIterator:
        return self

    def __len__(self) -> int:
        return len(self._config.index_sampler)

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        try:
            batch = self._next_batch()
        except StopIteration:
            self._book.skips.log_epoch_summary()
            if not self._config.persistent_workers:
                self.close()
            raise
        except _TaskError as wrapped:
            # Like torch: the failed batch is consumed, the next one follows.
            raise wrapped.error from None
        except BaseException:
            self.close()
            raise
        self._check_iterable_length()
        return batch

    def close(self) -> None:
        """Stop the workers now (the loop ended, broke, or raised)."""
        if not self.closed:
            self._history.last_statistics = self.statistics()
        self.closed = True
        self._finalizer()

    def reset(self) -> None:
        """Start another epoch on the same (persistent) workers."""
        self._start_epoch()

    def statistics(self) -> LoaderStatistics:
        return self._book.statistics(time.monotonic(), self._pool.pids())

    # --- epochs and dispatch ------------------------------------------------------------

    def _start_epoch(self) -> None:
        self._sampler_iter = iter(self._config.index_sampler)
        self._book.start_epoch(
            self._history.next_epoch(), self._config.epoch_samples(), time.monotonic()
        )
        for _ in range(self._book.initial_tasks):
            self._dispatch()

    def _dispatch(self) -> None:
        worker_id = self._book.next_worker()
        if worker_id is None:
            return
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            self._book.sampler_ended()
            return
        self._pool.send(worker_id, self._book.add(worker_id, index, time.monotonic()))

    # --- handing out --------------------------------------------------------------------

    def _next_batch(self) -> Any:
        self._book.user_waits(time.monotonic())
        while True:
            step = self._book.next_step()
            match step:
                case Handout(entry=entry):
                    batch = self._hand_out(entry)
                    if batch is not _NOTHING:
                        return batch
                case Wait():
                    self._receive()
                case GiveUp(error=error):
                    raise error
                case EpochEnd():
                    raise StopIteration
                case _:
                    assert_never(step)

    def _hand_out(self, entry: Entry) -> Any:
        reply = entry.reply
        self._dispatch()  # one more task per task handed out, as torch does
        match reply:
            case BatchDone(payload=None) | IterationEnded():
                return _NOTHING  # every sample left out, or an iterator ended
            case BatchDone(payload=payload):
                return self._decode(entry, payload)
            case TaskFailed(error=error):
                exc = rebuild(error)
                context = self._book.task_error_context(entry, self._pid(entry.worker_id))
                raise _TaskError(attach_worker_context(exc, context))
            case None:
                raise AssertionError("the book handed out a task without a reply")
            case _:
                assert_never(reply)

    def _decode(self, entry: Entry, payload: Payload) -> Any:
        if isinstance(payload, InlinePayload) and payload.slots_exhausted:
            self._warn_slots_exhausted(entry.worker_id, payload.held_in_worker)
        try:
            batch = self._pool.decode(entry.origin, payload)
        except Exception as exc:
            # The batch pickled in the worker but does not unpickle here (a
            # class missing in this process, a __setstate__ that raises): it
            # is this batch's error, like one raised in __getitem__.
            context = WorkerContext(
                worker_id=entry.worker_id,
                pid=self._pid(entry.worker_id) or -1,
                stage=Stage.DECODE.value,
                indices=entry.indices,
                epoch=self._book.epoch,
                seq=entry.seq,
            )
            add_note(
                exc,
                "The batch was sent by the worker but could not be rebuilt in the main "
                "process: something in it unpickles differently here (a class this process "
                "cannot import, a __setstate__ or __reduce__ that fails).",
            )
            raise _TaskError(attach_worker_context(exc, context)) from None
        self._book.delivered(entry, batch_size_of(batch))
        return pin_batch(batch) if self._pin else batch

    def _pid(self, worker_id: int) -> int | None:
        return self._pool.pids()[worker_id]

    # --- waiting --------------------------------------------------------------------------

    def _receive(self) -> None:
        """Block until a worker answers or dies, or a deadline passes; act on what came."""
        book = self._book
        expected = book.tasks.get(book.next_out) if book.in_order else None
        events = self._pool.wait(
            self._next_wake(), expect=expected.worker_id if expected is not None else None
        )
        if not events:
            self._check_deadlines()
            return
        for event in events:
            match event:
                case Received(worker_id=worker_id, message=message, origin=origin):
                    self._on_message(worker_id, message, origin)
                case Died():
                    self._on_death(event)
                case _:
                    assert_never(event)

    def _on_message(self, worker_id: int, message: Any, origin: Any) -> None:
        match message:
            case Ready():
                self._book.on_ready(worker_id)
            case StartupFailed():
                self._book.on_startup_failed(worker_id, self._startup_error(worker_id, message))
            case BatchDone() | TaskFailed() | IterationEnded():
                if not self._book.on_reply(worker_id, message, origin, time.monotonic()):
                    # A batch of an epoch the user abandoned: just free its slot.
                    self._pool.discard(origin, getattr(message, "payload", None))
            case _:
                assert_never(message)

    def _on_death(self, died: Died) -> None:
        decision = self._book.on_death(died, time.monotonic())
        if decision is None:
            return  # the book gives up: the error comes at its place in the order
        self._restart(decision)

    def _restart(self, decision: Restart) -> None:
        self._pool.replace(decision.worker_id)
        for task in decision.resend:
            self._pool.send(decision.worker_id, task)
        warnings.warn(decision.report, WorkerRestartedWarning, stacklevel=6)

    # --- deadlines ------------------------------------------------------------------------

    def _workers_now(self) -> list[Busy]:
        """Every worker as its status page says now (running a task, or idle)."""
        pids = self._pool.pids()
        return [Busy(i, pids[i], self._pool.status(i)) for i in range(self._pool.num_workers)]

    def _next_wake(self) -> float | None:
        """Seconds until a running task may reach ``timeout`` or the stall threshold.

        Reading the status pages costs a little, so it is done only once the
        previous answer has run out.
        """
        if not self._config.timeout and self._book.stall_threshold() is None:
            return None
        now = time.monotonic()
        if now < self._recheck_at:
            return self._recheck_at - now
        wake = self._book.next_deadline(now, self._workers_now())
        if wake is None:
            return None
        self._recheck_at = now + wake
        return wake

    def _check_deadlines(self) -> None:
        for overdue in self._book.overdue(time.monotonic(), self._workers_now()):
            match overdue:
                case Stalled(worker_id=worker_id, report=report):
                    stacks = self._pool.dump_stacks(worker_id) or "(unavailable)"
                    warnings.warn(
                        f"{report} Its current Python stack:\n{stacks}",
                        WorkerStallWarning,
                        stacklevel=5,
                    )
                case TimedOut(worker_id=worker_id, error=error):
                    stacks = self._pool.dump_stacks(worker_id)
                    self._book.add_to_kill_reason(worker_id, stacks)
                    if error is not None and stacks:
                        text = f"{error.args[0]}\nThe worker's current Python stack:\n{stacks}"
                        error.args = (text,)
                    # Known stuck: kill it now. With on_timeout="restart" its death
                    # is then handled like any other; otherwise the book gives up.
                    self._pool.kill(worker_id)
                case _:
                    assert_never(overdue)

    # --- reports ----------------------------------------------------------------------------

    def _startup_error(self, worker_id: int, message: StartupFailed) -> BaseException:
        exc = rebuild(message.error)
        pid = self._pid(worker_id)
        context = WorkerContext(
            worker_id=worker_id,
            pid=pid or -1,
            stage=message.stage.value,
            traceback=message.error.traceback,
        )
        if message.stage is Stage.WORKER_INIT:
            return attach_worker_context(exc, context)
        error = WorkerStartupError(
            f"DataLoader worker {worker_id} (pid {pid}) could not start: "
            f"{type(exc).__name__}: {exc}. This usually means the dataset, collate_fn or "
            "worker_init_fn refers to something the worker process cannot import (a module "
            "missing from its sys.path, or a class defined in a module that is not "
            "importable there). Fix: make that module importable in the worker, or use "
            "multiprocessing_context='fork'."
        )
        error.__cause__ = exc
        return attach_worker_context(error, context)

    def _warn_slots_exhausted(self, worker_id: int, held_in_worker: int) -> None:
        if self._warned_inline:
            return
        self._warned_inline = True
        if held_in_worker:
            why = (
                f"{held_in_worker} of them are held by arrays the worker itself keeps (a "
                "collate_fn or dataset that keeps earlier batches, e.g. a memory bank), "
                "so that memory cannot be reused. Fix: keep copies (.clone() or .copy()) "
                "of what the worker keeps across batches."
            )
        else:
            why = (
                "they are held by batches still alive in this process (the loop keeps "
                "references to many batches, e.g. appends them to a list). Fix: keep only "
                "what you need (e.g. .clone() or .copy() the part you keep)."
            )
        warnings.warn(
            f"DataLoader worker {worker_id}: every shared-memory slot is in use, so batches "
            f"are now copied through a pipe (slower): {why}",
            BatchesHeldWarning,
            stacklevel=6,
        )

    def _check_iterable_length(self) -> None:
        len_hint = self._history.iterable_len
        yielded = self._book.handed_out
        if len_hint is not None and yielded > len_hint:
            warnings.warn(
                f"Length of IterableDataset {self._config.dataset!r} was reported to be "
                f"{len_hint} (when accessing len(dataloader)), but {yielded} "
                "samples have been fetched. For multiprocessing data-loading, this could be "
                "caused by not properly configuring the IterableDataset replica at each "
                "worker (shard it with get_worker_info()).",
                UserWarning,
                stacklevel=3,
            )


_NOTHING = object()  # a handed-out task with no batch to give the user
