"""Iterate with workers: the loop between the task book and the pool.

The loop does the I/O and nothing else: it draws indices from the sampler, sends tasks
through the pool, blocks in ``pool.wait`` (a batch and a dead worker wake it alike, at
once) and turns decisions into batches, warnings and exceptions. The rules are in pure
objects it tells the facts: the :class:`~.book.TaskBook` (dispatch, order, hand-out), and
behind the :class:`~.supervisor.Supervisor` (dead, stalled, stuck workers) the crash judge
and the deadlines. The first epoch starts through :class:`~.epoch.EpochStart`, as the
in-process iterator's does.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .._task.compat import assert_never
from .._task.dataset_state import WorkerState
from .._task.protocol import (
    BatchDone,
    Died,
    IterationEnded,
    Ready,
    StartupFailed,
    TaskFailed,
)
from .._workers.api import BatchHandle, PoolFactory, Received
from .._workers.interrupts import interrupts_deferred, note_interrupt
from ..config import LoaderConfig, LoaderHistory
from ..errors import BatchesHeldWarning, DuplicateDataWarning
from ..observe.watch import Watch
from ..records import LoaderStatistics
from ..sampling._defaults import consecutive_batches
from . import failures, messages
from .book import FILED, SURVIVED, TaskBook
from .cursor import END
from .duplicates import StreamCheck
from .epoch import EpochStart, warn_past_length
from .epoch_news import EpochNews
from .face import IteratorFace
from .facts import Position
from .failures import TaskError
from .ledger import Entry
from .ownership import Ownership
from .pin_ahead import PinAhead
from .pinning import pin_batch, pin_thread_setup, pinning_enabled
from .progress import Progress
from .state import ResumePoint
from .steps import EpochEnd, GiveUp, Handout, Wait
from .supervisor import Supervisor
from .tally import Tally


class MultiprocessIterator(IteratorFace):
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
        self.closed = False
        # Workers whose dataset keeps a state (or whose iterator does) report it.
        self._per_worker = config.state_per_worker
        self._want_state = self._per_worker and config.options.snapshot_every > 0
        start = EpochStart(config, history, resume, num_workers=config.num_workers)
        self._cursor = start.cursor
        self._consecutive = consecutive_batches(config.index_sampler)
        self._reseed_places = config.options.reseed == "sample" and self._cursor.share is not None
        self._news = EpochNews(config, lambda: start.draw_base_seed(in_process=False))
        self._base_seed = self._news.base_seed
        now = time.monotonic()
        self._book = TaskBook(
            num_workers=config.num_workers, prefetch=config.prefetch,
            in_order=config.in_order, iterable=config.iterable,
            auto_collation=config.auto_collation, policy=config.policy,
            skipped=history.skipped, now=now,
        )  # fmt: skip
        self._tally = Tally(config.num_workers, now, history, config.kind.name)
        self._specs = start.worker_specs(**self._news.at_start())
        self._ownership = Ownership(self._pin_ahead)
        try:  # (a Ctrl-C from the pool's first pipe on finds the workers to stop)
            self._pool = self._ownership.make(self, config, self._specs, pool_factory)
            self._take_charge(now)
            self._start_epoch(start)
            # Like torchdata: iter() returns once every worker has started, so a
            # worker_init_fn (or a saved state that does not load) fails here.
            self._await_ready()
            start.replay(self._next_batch)  # what was handed out since the state's snapshot
            if start.mid is not None:
                self.progress.resumed_from = start.mid.raw
        except BaseException as error:
            self._abort(error)
            raise

    def _take_charge(self, now: float) -> None:
        """What watches the started workers: the supervisor (deadlines, deaths), who is
        ready, whether an iterable dataset's workers shard, the epoch's progress."""
        config = self._config
        self._run_ahead = self._pool.abilities.run_ahead
        book, tally = self._book, self._tally
        self._supervisor = Supervisor(config, book, self._pool, tally, now, self._specs)
        self._tally.pids = self._supervisor.pids
        self._deadlines = self._supervisor.deadlines
        self._streams = StreamCheck.wanted(config, self._history)  # iterable: do they shard?
        self.progress = self._new_progress()

    # --- the iterator protocol ----------------------------------------------------------
    def __iter__(self) -> MultiprocessIterator:
        return self

    def __len__(self) -> int:
        return len(self._config.index_sampler)

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        began = time.monotonic()  # the training loop waits from here until the batch
        try:
            batch = self._next_batch()
            self._tally.waited(began, time.monotonic())
            if self._pin_ahead is not None:
                self._pin_next()
        except StopIteration:
            self.progress.ended()
            self._book.skips.log_epoch_summary()
            if self._watch is not None:
                self._watch.ended(self.statistics())
            if not self._config.persistent_workers:
                self.close()
            elif self._pin_ahead is not None:
                self._pin_ahead.close()  # no thread idles between epochs (see .pin_ahead)
            raise
        except TaskError as wrapped:
            # Like torch: the failed batch is consumed, the next one follows.
            raise wrapped.error from None
        except BaseException as error:
            self._abort(error)
            raise
        warn_past_length(self._config, self._history, self.progress.yielded, stacklevel=2)
        self._supervisor.after_batch()  # num_workers="auto" decides here
        if self._watch is not None:
            self._watch.batch(self.statistics)
        return batch

    def close(self) -> None:
        """Stop the workers now (the loop ended, broke, or raised), whole: see ownership."""
        with interrupts_deferred():
            if not self.closed and hasattr(self, "_supervisor"):  # (none: a start cut short)
                self._history.last_statistics = self.statistics()
            self.closed = True
            self._ownership.close()

    _shutdown_workers = close  # torch's name for it (called on a persistent loader's _iterator)

    def _abort(self, error: BaseException) -> None:
        """The loop ends on ``error`` (a Ctrl-C is noted: the user wants out)."""
        if isinstance(error, KeyboardInterrupt):
            note_interrupt()
        self.close()

    def reset(self) -> None:
        """Start another epoch on the same (persistent) workers. What it starts with
        (set_epoch..., a DataPipe's seed) goes to each worker before its tasks, and into
        the spec its replacement starts from (an added worker's too: the autotuner's
        comes from the first)."""
        self.progress = self._new_progress(self.progress.worker_states)
        for message in self._news.at_epoch_start():
            for worker_id, spec in enumerate(self._specs):
                self._specs[worker_id] = spec.keeping(message)
                if not self._book.retired(worker_id):
                    self._pool.send(worker_id, message)
        self._start_epoch(None)

    def statistics(self) -> LoaderStatistics:
        return self._supervisor.statistics(skipped=len(self._history.skipped))

    @property
    def _workers(self) -> list[Any]:
        """The worker processes, as torch's iterator shows them (``pid``, ``is_alive()``...)."""
        handles = self._pool.abilities.handles
        return handles() if handles is not None else []

    def _new_progress(self, worker_states: list[WorkerState] | None = None) -> Progress:
        config, history = self._config, self._history
        progress = Progress(
            config, history, self._cursor, config.num_workers, self._base_seed,
            history.epochs_started, per_worker=self._per_worker,
            worker_states=list(worker_states or []),
        )  # fmt: skip
        progress.settle = weakref.WeakMethod(self._await_reports)
        return progress

    # --- epochs and dispatch ------------------------------------------------------------

    def _start_epoch(self, start: EpochStart | None) -> None:
        """The first epoch, where ``start`` says; or (None) the next on the same workers."""
        epoch = self._history.next_epoch()
        self.progress.epoch = epoch
        if start is not None:
            start.open_cursor()
        else:
            self._cursor.start()
        self.progress.start_from(start.mid if start is not None else None)
        at = start.position(self._config.num_workers) if start is not None else Position()
        abandoned = self._book.start_epoch(epoch, self._config.epoch_samples(), at)
        self._tally.start_epoch(now=time.monotonic(), usage=self._pool.abilities.usage)
        self._watch = Watch.of(self._config)
        self._deadlines.count_from(time.monotonic())
        decoded = self._pin_ahead.drop() if self._pin_ahead is not None else None
        for entry in abandoned:  # after a break: give back what came and was not handed out
            if entry.origin is not None and entry is not decoded:
                entry.origin.discard()
        self._top_up()

    def _top_up(self) -> None:
        """Send tasks while the book wants them: at the start, as batches come (the
        run-ahead) and as they are handed out."""
        while self._book.wants_task() and self._dispatch():
            pass

    def _dispatch(self) -> bool:
        """Send the sampler's next batch to the next worker; False if none was sent."""
        worker_id = self._book.next_worker()
        if worker_id is None:
            return False
        cursor = self._cursor
        task = None
        while task is None:  # None: handed out before the state was taken
            index = cursor.next()
            if index is END:
                self._book.sampler_ended()
                return False
            task = self._book.add(
                worker_id,
                index,
                time.monotonic(),
                first_sample=cursor.samples_before(cursor.drawn - 1),
                want_state=self._want_state,
                consecutive=self._consecutive,
                places=cursor.places(cursor.drawn - 1) if self._reseed_places else (),
            )
        self._pool.send(worker_id, task)
        return True

    def _await_ready(self) -> None:
        """Block until every worker has started (and reported its state). What keeps one
        from starting is raised here; a failure of a worker that did start (heard of
        before another worker's start, on a busy machine) comes at its place in the
        order, after the batches before it."""
        ledger = self._book.view
        while ledger.starting():
            self._receive()
        if ledger.start_failed() and ledger.fatal is not None:
            raise ledger.fatal

    def _await_reports(self) -> None:
        """``state_dict()`` needs each worker's state at the start of the epoch."""
        while self.progress.unreported and not self.closed and self._book.view.fatal is None:
            self._receive()

    # --- handing out --------------------------------------------------------------------

    def _next_batch(self) -> Any:
        self._deadlines.count_from(time.monotonic())  # timeout counts from the user's ask
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
        self.progress.reply_handed_out(entry.seq, entry.worker_id, reply)
        match reply:
            case BatchDone(payload=None) | IterationEnded():
                return _NOTHING  # every sample left out, or an iterator ended
            case BatchDone():
                return self._decode(entry, entry.origin)
            case TaskFailed():
                pid = self._pid(entry.worker_id)
                raise TaskError(failures.task_failed(reply, entry.worker_id, pid, entry.indices))
            case None:
                raise AssertionError("the book handed out a task without a reply")
            case _:
                assert_never(reply)

    def _decode(self, entry: Entry, handle: BatchHandle) -> Any:
        # It came another way, its worker's memory all in use: say why if the user can help.
        room = self._run_ahead(handle) if self._run_ahead is not None else None
        if room is not None and room.full and self._book.ahead.held(room):
            why = messages.slots_held(entry.worker_id, room.held_in_worker)
            warnings.warn(why, BatchesHeldWarning, stacklevel=4)
        pinned, batch = self._pin_ahead.take(entry) if self._pin_ahead else (False, None)
        tally, began = self._tally, time.monotonic()
        if not pinned:
            batch = self._rebuild(entry, handle)
        decoded = time.monotonic()
        if self._streams and (text := self._streams.batch(entry.worker_id, entry.reply, batch)):
            warnings.warn(text, DuplicateDataWarning, stacklevel=4)
        if not pinned and self._pin is not None:
            batch = self._pin(batch)
        pin_s = tally.main_work("pin", decoded, time.monotonic()) if self._pin else 0.0
        tally.delivered_from(entry, batch, tally.main_work("decode", began, decoded), pin_s)
        return batch

    def _pin_next(self) -> None:
        """Pin the next batch, if it came, while the user works on this one (pin_ahead)."""
        assert self._pin_ahead is not None
        entry = self._book.peek() if self._pin_ahead.idle else None
        handle = entry.origin if entry is not None else None
        if entry is not None and handle is not None:  # None: every sample left out
            self._pin_ahead.pin_next(entry, lambda: self._rebuild(entry, handle))

    def _rebuild(self, entry: Entry, handle: BatchHandle) -> Any:
        """The batch; a :class:`TaskError` naming it if it does not unpickle here."""
        try:
            return handle.open()
        except Exception as exc:
            pid, epoch = self._pid(entry.worker_id), self._book.epoch
            error = failures.undecodable(exc, entry.worker_id, pid, entry.indices, epoch, entry.seq)
            raise TaskError(error) from None

    def _pid(self, worker_id: int) -> int | None:
        return self._supervisor.pids()[worker_id]

    # --- waiting --------------------------------------------------------------------------

    def _receive(self) -> None:
        """Block until a worker answers or dies, or a deadline passes; act on what came."""
        events = self._pool.wait(self._supervisor.wake_in())
        if not events:
            self._supervisor.check()
            return
        for event in events:
            match event:
                case Received(worker_id=worker_id, message=message, batch=batch):
                    self._on_message(worker_id, message, batch)
                case Died():
                    self._supervisor.on_death(event)
                case _:
                    assert_never(event)

    def _on_message(self, worker_id: int, message: Any, batch: BatchHandle | None) -> None:
        match message:
            case Ready(state=state):
                self._book.on_ready(worker_id)
                self.progress.began(worker_id, state)
            case StartupFailed():
                pid, remote = self._pid(worker_id), not self._config.kind.local
                error = failures.startup_failed(worker_id, message, pid, remote=remote)
                self._book.on_startup_failed(worker_id, error)
            case BatchDone() | TaskFailed() | IterationEnded():
                if message.epoch_state is not None:  # the first of the epoch
                    self.progress.began(worker_id, message.epoch_state)
                ahead = self._run_ahead
                room = ahead(batch) if ahead is not None and batch is not None else None
                filed = self._book.on_reply(worker_id, message, batch, time.monotonic(), room)
                if filed == FILED and type(message) is BatchDone:
                    self._tally.worked(worker_id, message, batch)
                if filed != FILED:
                    # A batch of an epoch the user abandoned, or a suspect's verdict:
                    # just free its slot.
                    if batch is not None:
                        batch.discard()
                    if filed == SURVIVED:
                        self._supervisor.judge.survived(message.seq)
                    return
                self._top_up()  # a worker may have room again (run-ahead)
            case _:
                assert_never(message)


_NOTHING = object()  # a handed-out task with no batch to give the user
