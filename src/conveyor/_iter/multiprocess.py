"""Iterate with worker processes: the loop between the task book and the pool.

The loop does the I/O and nothing else: it draws indices from the sampler,
asks the :class:`~conveyor._iter.book.TaskBook` what to do, sends tasks
through the pool, blocks in ``pool.wait`` (result pipes and process
sentinels together: a batch and a dead worker wake it alike, at once) and
turns the book's decisions into batches, warnings and exceptions. Every rule
about tasks lives in the book.
"""

from __future__ import annotations

import pickle
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .. import _torch
from .._compat import assert_never
from .._datapipes import SharedSeeds, is_iter_datapipe
from .._dataset_state import WorkerState
from .._transport.arena import RUN_AHEAD_BATCH_S, run_ahead, run_ahead_bytes
from .._workers.api import BatchHandle, Pool, PoolFactory
from .._workers.core import UserObjects, WorkerSpec
from .._workers.events import Died, Received
from .._workers.pool import WorkerPool
from .._workers.protocol import (
    BatchDone,
    IterationEnded,
    Ready,
    SeedPipe,
    Stage,
    StartupFailed,
    TaskFailed,
)
from .._workers.remote_error import rebuild
from .._workers.threads import ThreadPool
from ..collate import registrations as collate_registrations
from ..config import LoaderConfig, LoaderHistory
from ..errors import (
    BatchesHeldWarning,
    DuplicateDataWarning,
    WorkerContext,
    WorkerRestartedWarning,
    WorkerStallWarning,
    WorkerStartupError,
    add_note,
    attach_worker_context,
)
from ..records import LoaderStatistics
from ..sampling import consecutive_batches, draw_base_seed
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
from .cursor import END, SamplerCursor
from .duplicates import StreamCheck
from .pin_ahead import PinAhead
from .pinning import pin_batch, pin_thread_setup, pinning_enabled
from .progress import Progress, per_worker_why
from .rng import replayed_draw
from .state import ResumePoint

SLOTS_BEYOND_PREFETCH = 4  # batches the user may hold before the pipe fallback


class _TaskError(Exception):
    """Carries an exception from user code out of ``_next_batch`` (see ``__next__``)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class MultiprocessIterator:
    def __init__(
        self,
        config: LoaderConfig,
        history: LoaderHistory,
        pool_factory: PoolFactory | None = None,
        resume: ResumePoint | None = None,
        pin: Callable[[Any], Any] | None = None,
    ) -> None:
        """``pin`` pins a batch (tests pass a stand-in); by default torch's pinning,
        when ``pin_memory=True`` and an accelerator is there."""
        self._config = config
        self._history = history
        setup = None
        if pin is None and pinning_enabled(config):
            pin, setup = pin_batch, pin_thread_setup
        self._pin = pin
        self._pin_ahead = PinAhead(pin, setup) if pin is not None else None
        self._warned_inline = False
        self.closed = False
        # Workers whose dataset keeps a state (or whose iterator does) report it.
        self._per_worker = config.iterable or config.dataset_keeps_state
        if resume is not None:
            resume.check_workers(
                config.num_workers, per_worker=self._per_worker, why=per_worker_why(config)
            )
            history.skipped[:] = resume.skipped
        finished = resume is not None and resume.finished
        self._resume = resume if resume is not None and not finished else None
        self._cursor = SamplerCursor(config)
        self._consecutive = consecutive_batches(config.index_sampler)
        # A DataPipe draws shared seeds around the base seed, where torch draws them: the
        # workers start with the first; the second only reseeds the main process's copy.
        self._pipe_seeds = SharedSeeds() if is_iter_datapipe(config.dataset) else None
        pipe_seed = None
        if self._pipe_seeds is not None:
            pipe_seed = self._pipe_seeds.draw(config.generator, config.dataset)
        self._base_seed = self._draw_base_seed(resume)
        if self._pipe_seeds is not None:
            self._pipe_seeds.draw(config.generator, config.dataset)
        if resume is not None and resume.epoch is not None:
            history.epochs_started = resume.epoch + (1 if finished else 0)
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
        restored = _worker_states(resume, config) if self._per_worker else None
        self._base_slots = config.prefetch_factor + SLOTS_BEYOND_PREFETCH
        self._run_ahead_bytes = run_ahead_bytes(config.num_workers) if config.run_ahead else 0
        self._slot_size = 0  # of the last batch: small ones run ahead (see _on_message)
        self._specs = [
            WorkerSpec(
                worker_id=i,
                num_workers=config.num_workers,
                base_seed=self._base_seed,
                iterable=config.iterable,
                auto_collation=config.auto_collation,
                drop_last=config.drop_last,
                max_slots=self._base_slots,
                skip_errors=config.policy.skipping,
                # Worker processes leave tensors to this process (see _torch.py).
                tensors_in_main=not config.in_threads and _torch.load() is not None,
                reseed=config.reseed,
                report_state=self._per_worker,
                resume_state=restored[i] if restored is not None else None,
                # Restored as the last epoch ended: the next epoch is a new one.
                new_epoch_first=finished and restored is not None,
                pipe_seed=pipe_seed,
                run_ahead_bytes=self._run_ahead_bytes,
                worker_method=config.worker_method,
            )
            for i in range(config.num_workers)
        ]
        user = UserObjects(
            config.dataset, config.collate_fn, config.worker_init_fn, collate_registrations()
        )
        if pool_factory is None:
            pool_factory = ThreadPool if config.in_threads else WorkerPool
        self._pool = pool_factory(config.start_method, user, self._specs)
        self._flush = self._pool.abilities.flush
        self._finalizer = weakref.finalize(self, _close, self._pin_ahead, self._pool)
        self._recheck_at = 0.0  # when the status pages must be read again (deadlines)
        # Each worker's state at the start of the epoch still to be heard (per-worker state).
        self._unreported: set[int] = set(range(config.num_workers)) if self._per_worker else set()
        self._not_ready = set(range(config.num_workers))
        self._streams: StreamCheck | None = None  # iterable datasets: do workers shard?
        if config.iterable and config.num_workers > 1 and not history.warned_duplicates:
            self._streams = StreamCheck()
        self.progress = self._new_progress()
        try:
            self._start_epoch(self._resume)
            # Like torchdata: iter() returns once every worker has started, so a
            # worker_init_fn (or a saved state that does not load) fails here.
            self._await_ready()
            self._replay(self._resume)
        except BaseException:
            self.close()
            raise

    def _draw_base_seed(self, resume: ResumePoint | None) -> int:
        """Draw the base seed as torch draws it (consuming the same RNG), and put the
        random streams where a resumed run needs them.

        torch iterates the index sampler once, draws the base seed, then iterates it
        again per epoch: samplers that draw eagerly in ``__iter__`` consume the RNG in
        that order, so do the same. After a state taken at an epoch's end, the next
        epoch draws as it would have: from the generators as the epoch left them, and
        torch's global RNG as it was then; persistent workers drew no new base seed
        for that epoch, so theirs is kept.
        """
        config, streams = self._config, self._cursor.streams
        finished = resume is not None and resume.finished
        rng_after = resume.rng_after if resume is not None and finished else None
        saved_global = resume.global_after if resume is not None and finished else None
        persistent = config.persistent_workers
        if rng_after and not persistent:
            streams.restore(rng_after)
        iter(config.index_sampler)
        if persistent:
            base_seed, self._first_global = draw_base_seed(config.generator), saved_global
        else:
            base_seed, self._first_global = replayed_draw(
                streams, saved_global, lambda: draw_base_seed(config.generator)
            )
        if rng_after and persistent:
            streams.restore(rng_after)
        keeps_seed = self._resume is not None or (finished and persistent)
        if keeps_seed and resume is not None and resume.base_seed is not None:
            return resume.base_seed
        return base_seed

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
            if self._pin_ahead is not None:
                self._pin_next()
        except StopIteration:
            self.progress.ended()
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

    def _shutdown_workers(self) -> None:
        """torch's iterator's name for :meth:`close` (code written for torch calls it on
        a persistent loader's ``_iterator`` to stop its workers)."""
        self.close()

    def reset(self) -> None:
        """Start another epoch on the same (persistent) workers."""
        previous = self.progress
        self.progress = self._new_progress(previous.worker_states)
        if self._per_worker:
            self._unreported = set(range(self._config.num_workers))
        if self._pipe_seeds is not None:
            config = self._config
            seed = SeedPipe(self._pipe_seeds.draw(config.generator, config.dataset))
            for worker_id in range(config.num_workers):
                self._pool.send(worker_id, seed)
        self._start_epoch(None)

    def statistics(self) -> LoaderStatistics:
        return self._book.statistics(time.monotonic(), self._pids())

    @property
    def _workers(self) -> list[Any]:
        """The worker processes, as torch's iterator exposes them (tests and tools reach
        for ``it._workers``): real ``pid``, ``is_alive()``, ``join()``, ``exitcode``."""
        handles = self._pool.abilities.handles
        return handles() if handles is not None else []

    def _new_progress(self, worker_states: list[WorkerState] | None = None) -> Progress:
        progress = Progress(
            config=self._config,
            history=self._history,
            cursor=self._cursor,
            num_workers=self._config.num_workers,
            base_seed=self._base_seed,
            epoch=self._history.epochs_started,
            per_worker=self._per_worker,
            worker_states=list(worker_states or []),
        )
        progress.settle = weakref.WeakMethod(self._await_reports)
        return progress

    # --- epochs and dispatch ------------------------------------------------------------

    def _start_epoch(self, resume: ResumePoint | None) -> None:
        self._abandon_epoch()
        epoch = self._history.next_epoch()
        self.progress.epoch = epoch
        first_seq = first_worker = 0
        self._done_before = resume.beyond if resume is not None else frozenset()
        if resume is not None:
            self._cursor.reopen(resume.main)
            self._cursor.restore_streams()
            self._cursor.advance(resume.main, resume.delivered, resume.samples)
            first_seq = resume.delivered
            if resume.num_workers == self._config.num_workers:
                first_worker = resume.last_worker + 1  # round-robin goes on where it was
            if self._per_worker:
                self.progress.worker_states = list(resume.workers)
                self._unreported.clear()
        else:
            self._cursor.start()
            self._cursor.replay_first_draw(self._first_global)
            self._first_global = None
        self.progress.start_from(resume)
        self._slot_size = 0  # the run-ahead is allowed again when a batch of this epoch comes
        self._book.start_epoch(
            epoch,
            self._config.epoch_samples(),
            time.monotonic(),
            first_seq=first_seq,
            first_worker=first_worker,
        )
        self._top_up()

    def _abandon_epoch(self) -> None:
        """Before a new epoch on the same workers (after a ``break``): give back the
        slots of batches that arrived and were never handed out, and count the tasks
        still out, whose replies will be discarded as they come."""
        self._stale = [0] * self._config.num_workers
        decoded = self._pin_ahead.drop() if self._pin_ahead is not None else None
        for entry in self._book.tasks.values():
            if entry.reply is None:
                self._stale[entry.worker_id] += 1
            elif entry.origin is not None and entry is not decoded:
                entry.origin.discard()

    def _top_up(self) -> None:
        """Send tasks until ``prefetch_factor`` per worker (plus the run-ahead small
        batches get) are out: at the start, and as batches arrive and are handed out."""
        while self._book.wants_task() and self._dispatch():
            pass

    def _dispatch(self) -> bool:
        """Send the sampler's next batch to the next worker; False if none was sent."""
        worker_id = self._book.next_worker()
        if worker_id is None:
            return False
        cursor = self._cursor
        while True:
            seq = cursor.drawn
            index = cursor.next()
            if index is END:
                self._book.sampler_ended()
                return False
            if seq not in self._done_before:
                break
            self._book.skip_seq()  # handed out before the state was taken (in_order=False)
        task = self._book.add(
            worker_id,
            index,
            time.monotonic(),
            first_sample=cursor.samples_before(seq),
            want_state=self._per_worker and self._config.snapshot_every_n_steps > 0,
            consecutive=self._consecutive,
        )
        self._pool.send(worker_id, task)
        return True

    def _await_ready(self) -> None:
        """Block until every worker has started (and reported its state)."""
        while self._not_ready:
            self._receive()
            self._raise_if_given_up()

    def _await_reports(self) -> None:
        """``state_dict()`` needs each worker's state at the start of the epoch."""
        while self._unreported and not self.closed and self._book.fatal is None:
            self._receive()

    def _raise_if_given_up(self) -> None:
        if self._book.fatal is not None:
            raise self._book.fatal

    def _replay(self, resume: ResumePoint | None) -> None:
        """Fetch again, and drop, the batches handed out after the last snapshot."""
        if resume is None:
            return
        for _ in range(resume.replay):
            try:
                self._next_batch()
            except StopIteration:
                break
        self.progress.resumed_from = resume.raw

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
        self._top_up()  # one more task per task handed out, as torch does
        # Run far ahead, the tasks that would carry freed slots may not come for a while.
        if self._flush is not None:
            self._flush()
        empty = not isinstance(reply, TaskFailed) and getattr(reply, "payload", None) is None
        state = getattr(reply, "state", None)
        self.progress.handed_out(
            entry.seq,
            entry.worker_id,
            pickle.loads(state) if state is not None else None,
            empty=empty,
        )
        match reply:
            case BatchDone(payload=None) | IterationEnded():
                return _NOTHING  # every sample left out, or an iterator ended
            case BatchDone():
                return self._decode(entry, entry.origin)
            case TaskFailed(error=error):
                exc = rebuild(error)
                context = self._book.task_error_context(entry, self._pid(entry.worker_id))
                raise _TaskError(attach_worker_context(exc, context))
            case None:
                raise AssertionError("the book handed out a task without a reply")
            case _:
                assert_never(reply)

    def _decode(self, entry: Entry, handle: BatchHandle) -> Any:
        if handle.slots_exhausted:
            self._on_slots_exhausted(entry, handle)
        pinned, batch = self._pin_ahead.take(entry) if self._pin_ahead else (False, None)
        if not pinned:
            batch = self._rebuild(entry, handle)
        # Counted from the task where it says (inspecting a batch of tensors costs µs).
        samples = entry.samples_in_batch()
        self._book.delivered(entry, batch_size_of(batch) if samples is None else samples)
        asked = getattr(entry.reply, "asked_worker_info", None)
        if asked is False and self._streams is not None:
            self._check_stream(entry.worker_id, batch)
        if pinned or self._pin is None:
            return batch
        return self._pin(batch)

    def _pin_next(self) -> None:
        """Pin the batch to be handed out next while the user works on this one, if it
        has come already (see :mod:`.pin_ahead`)."""
        assert self._pin_ahead is not None
        if not self._pin_ahead.idle:
            return
        entry = self._book.peek()
        if entry is None or not isinstance(entry.reply, BatchDone):
            return
        if entry.origin is None:
            return  # every sample left out: nothing to pin
        try:
            batch = self._rebuild(entry, entry.origin)
        except _TaskError as failed:
            self._pin_ahead.fail(entry, failed)  # raised when its turn comes
        else:
            self._pin_ahead.start(entry, batch)

    def _rebuild(self, entry: Entry, handle: BatchHandle) -> Any:
        """The batch as it came; a :class:`_TaskError` naming it if it does not
        unpickle here."""
        try:
            return handle.open()
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

    def _check_stream(self, worker_id: int, batch: Any) -> None:
        assert self._streams is not None
        text = self._streams.first_batch(worker_id, batch)
        if text is not None and not self._history.warned_duplicates:
            self._history.warned_duplicates = True
            self._streams = None
            warnings.warn(text, DuplicateDataWarning, stacklevel=5)

    def _pid(self, worker_id: int) -> int | None:
        return self._pids()[worker_id]

    def _pids(self) -> list[int | None]:
        inspect = self._pool.abilities.inspect
        return inspect.pids() if inspect is not None else [None] * self._pool.num_workers

    # --- waiting --------------------------------------------------------------------------

    def _receive(self) -> None:
        """Block until a worker answers or dies, or a deadline passes; act on what came."""
        events = self._pool.wait(self._next_wake())
        if not events:
            self._check_deadlines()
            return
        for event in events:
            match event:
                case Received(worker_id=worker_id, message=message, batch=batch):
                    self._on_message(worker_id, message, batch)
                case Died():
                    self._on_death(event)
                case _:
                    assert_never(event)

    def _on_message(self, worker_id: int, message: Any, batch: BatchHandle | None) -> None:
        match message:
            case Ready(state=state):
                self._book.on_ready(worker_id)
                self._not_ready.discard(worker_id)
                self._reported(worker_id, state)
            case StartupFailed():
                self._book.on_startup_failed(worker_id, self._startup_error(worker_id, message))
            case BatchDone() | TaskFailed() | IterationEnded():
                if message.epoch_state is not None:
                    self._reported(worker_id, message.epoch_state)
                if not self._book.on_reply(worker_id, message, batch, time.monotonic()):
                    # A batch of an epoch the user abandoned: just free its slot.
                    if batch is not None:
                        batch.discard()
                    self._stale[worker_id] = max(0, self._stale[worker_id] - 1)
                    return
                self._consider_run_ahead(message, batch)
                self._top_up()  # a worker may have room again (run-ahead)
            case _:
                assert_never(message)

    def _consider_run_ahead(self, message: Any, batch: BatchHandle | None) -> None:
        """Let workers run ahead when this epoch's batches are small and quick.

        Decided when the slots' size changes, which is rarely (batches alike): how many
        tasks are out at a break then does not depend on timing, so the random draws
        of the tasks left over, and of the next epoch, repeat from run to run.
        """
        slot_bytes = batch.slot_bytes if batch is not None else 0
        if (
            self._run_ahead_bytes
            and slot_bytes
            and slot_bytes != self._slot_size
            and message.busy_s <= RUN_AHEAD_BATCH_S
            # Not while slots of an abandoned epoch are still to come back.
            and not any(self._stale)
        ):
            self._slot_size = slot_bytes
            extra = run_ahead(self._slot_size, self._base_slots, self._run_ahead_bytes)
            self._book.allow_run_ahead(extra)

    def _reported(self, worker_id: int, state: bytes | None) -> None:
        """A worker's state when the epoch began (start-up, or a persistent worker's
        first task of the epoch)."""
        if state is not None and worker_id in self._unreported:
            self._unreported.discard(worker_id)
            self.progress.worker_reported(worker_id, pickle.loads(state))

    def _on_death(self, died: Died) -> None:
        self._stale[died.worker_id] = 0  # its abandoned tasks will never be answered
        decision = self._book.on_death(died, time.monotonic())
        if decision is None:
            return  # the book gives up: the error comes at its place in the order
        self._restart(decision)

    def _restart(self, decision: Restart) -> None:
        if self._pin_ahead is not None:
            self._pin_ahead.settle()  # a fork must not copy the pin thread mid-pin
        self._pool.restart(decision.worker_id)
        for task in decision.resend:
            self._pool.send(decision.worker_id, task)
        warnings.warn(decision.report, WorkerRestartedWarning, stacklevel=6)

    # --- deadlines ------------------------------------------------------------------------

    def _workers_now(self) -> list[Busy]:
        """Every worker as its status page says now (running a task, or idle)."""
        inspect = self._pool.abilities.inspect
        if inspect is None:
            return []  # nothing can be seen of them: no deadline is checked
        pids = inspect.pids()
        return [Busy(i, pids[i], inspect.status(i)) for i in range(self._pool.num_workers)]

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
                    stacks = self._stacks(worker_id) or "(unavailable)"
                    warnings.warn(
                        f"{report} Its current Python stack:\n{stacks}",
                        WorkerStallWarning,
                        stacklevel=5,
                    )
                case TimedOut(worker_id=worker_id, error=error):
                    stacks = self._stacks(worker_id)
                    self._book.add_to_kill_reason(worker_id, stacks)
                    if error is not None and stacks:
                        text = f"{error.args[0]}\nThe worker's current Python stack:\n{stacks}"
                        error.args = (text,)
                    # Known stuck: kill it now. With on_timeout="restart" its death
                    # is then handled like any other; otherwise the book gives up.
                    kill = self._pool.abilities.kill
                    if kill is not None:
                        kill(worker_id)
                case _:
                    assert_never(overdue)

    def _stacks(self, worker_id: int) -> str:
        inspect = self._pool.abilities.inspect
        return inspect.stacks(worker_id) if inspect is not None else ""

    # --- reports ----------------------------------------------------------------------------

    def _startup_error(self, worker_id: int, message: StartupFailed) -> BaseException:
        # WORKER_INIT: the user's worker_init_fn; FETCH: restoring the dataset's state.
        exc = rebuild(message.error)
        pid = self._pid(worker_id)
        context = WorkerContext(
            worker_id=worker_id,
            pid=pid or -1,
            stage=message.stage.value,
            traceback=message.error.traceback,
        )
        if message.stage in (Stage.WORKER_INIT, Stage.FETCH):
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

    def _on_slots_exhausted(self, entry: Entry, handle: BatchHandle) -> None:
        """A worker found every slot in use and sent a batch through the pipe: say why,
        when it is something the user can change.

        Slots are also in use by batches that arrived and wait to be handed out: a
        worker running ahead (or batches that keep growing) can use them all without
        the loop keeping anything. Then the user is told nothing, and the run-ahead is
        withdrawn (it filled the slots; the next batch size decides it again)."""
        held_in_worker = handle.held_in_worker
        if not held_in_worker and handle.batches_alive() < SLOTS_BEYOND_PREFETCH:
            self._book.allow_run_ahead(0)
            return
        self._warn_slots_exhausted(entry.worker_id, held_in_worker)

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


def _worker_states(resume: ResumePoint | None, config: LoaderConfig) -> list[bytes | None] | None:
    """What each new worker restores at start-up: its part of the state (persistent
    workers after a finished epoch too: they then begin a new epoch, as they would
    have in the run the state was taken in)."""
    if resume is None or not resume.workers:
        return None
    if resume.finished and not config.persistent_workers:
        return None  # new workers start from the dataset as it is
    states = list(resume.workers)
    return [
        pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL) if s.holds_state or s.ended else None
        for s in states
    ]


def _close(pin_ahead: PinAhead | None, pool: Pool) -> None:
    """Stop pinning before the pool goes: a pin in flight reads a batch in its memory."""
    try:
        if pin_ahead is not None:
            pin_ahead.close()
    finally:
        pool.close()
