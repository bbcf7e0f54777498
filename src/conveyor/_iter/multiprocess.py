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

import functools
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .._task.compat import assert_never
from .._task.dataset_state import WorkerState
from .._task.protocol import (
    BatchDone,
    IterationEnded,
    TaskFailed,
    TaskReply,
)
from .._workers.api import BatchHandle, PoolFactory
from .._workers.interrupts import interrupts_deferred, note_interrupt
from ..config import LoaderConfig, LoaderHistory
from ..errors import BatchesHeldWarning, DuplicateDataWarning
from ..observe.watch import Watch
from ..records import LoaderStatistics
from ..sampling._defaults import consecutive_batches
from . import failures, messages
from .book import TaskBook
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
from .receive import Receiving
from .state import ResumePoint
from .steps import EpochEnd, GiveUp, Wait
from .supervisor import Supervisor
from .tally import Tally


class MultiprocessIterator(IteratorFace, Receiving):
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
        count = self._supervisor.count  # num_workers="auto": it decides after each batch
        self._after_batch = count.after_batch if count is not None else None
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
        asked = time.monotonic()  # the training loop waits from here until the batch
        try:
            batch = self._next_batch(asked)
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
        if self._history.iterable_len is not None:
            warn_past_length(self._config, self._history, self.progress.yielded, stacklevel=2)
        if self._after_batch is not None:
            self._after_batch()
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
        # A plain weak reference: a WeakMethod's callback is Python, run as the iterator
        # dies, where a Ctrl-C would be raised and lost (see _transport/decoder._Watch).
        progress.settle = functools.partial(_await_reports_of, weakref.ref(self))
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
        now = time.monotonic()
        self._tally.start_epoch(now=now, usage=self._pool.abilities.usage)
        self._watch = Watch.of(self._config)
        self._deadlines.count_from(time.monotonic())
        decoded = self._pin_ahead.drop() if self._pin_ahead is not None else None
        for entry in abandoned:  # after a break: give back what came and was not handed out
            if entry.origin is not None and entry is not decoded:
                entry.origin.discard()
        self._top_up(now)

    def _top_up(self, now: float) -> None:
        """Send tasks while the book wants them: at the start, as batches come (the
        run-ahead) and as they are handed out (``now``: about when)."""
        book = self._book
        while (worker_id := book.worker_for_next_task()) is not None:
            if not self._dispatch(worker_id, now):
                return

    def _dispatch(self, worker_id: int, now: float) -> bool:
        """Send the sampler's next batch to ``worker_id``; False if the sampler ended."""
        cursor, book = self._cursor, self._book
        task = None
        while task is None:  # None: handed out before the state was taken
            index = cursor.next()
            if index is END:
                book.sampler_ended()
                return False
            task = book.add(
                worker_id,
                index,
                now,
                first_sample=cursor.last_first,
                want_state=self._want_state,
                consecutive=self._consecutive,
                places=cursor.places(cursor.drawn - 1) if self._reseed_places else (),
            )
        self._pool.send(worker_id, task)
        return True

    # --- handing out --------------------------------------------------------------------

    def _next_batch(self, asked: float = -1.0) -> Any:
        """The next batch, for the user who asked at ``asked`` (-1: the loop itself, as a
        resumed epoch replays what was handed out since the state's snapshot)."""
        self._deadlines.count_from(time.monotonic() if asked < 0 else asked)  # timeout
        book = self._book  # counts from the user's ask
        while True:
            step = book.next_step()
            if isinstance(step, Entry):  # (no match: once a batch, commonest first)
                # One more task per task handed out, as torch does.
                self._top_up(asked if asked >= 0 else time.monotonic())
                reply = step.reply
                if type(reply) is BatchDone and reply.state is None and step.origin is not None:
                    self.progress.handed_out(step.seq, step.worker_id, None)
                    return self._decode(step, step.origin, asked)
                batch = self._hand_out(step, reply, asked)
                if batch is not _NOTHING:
                    return batch
            elif isinstance(step, Wait):
                self._receive()
            elif isinstance(step, GiveUp):
                raise step.error
            elif isinstance(step, EpochEnd):
                raise StopIteration
            else:
                assert_never(step)

    def _hand_out(self, entry: Entry, reply: TaskReply | None, asked: float) -> Any:
        """Any other reply than a batch alone: with the dataset's state, an error, or
        nothing to give the user."""
        self.progress.reply_handed_out(entry.seq, entry.worker_id, reply)
        match reply:
            case BatchDone(payload=None):
                self._tally.worked(entry.worker_id, reply, None)
                return _NOTHING  # every sample left out
            case IterationEnded():
                return _NOTHING
            case BatchDone():
                return self._decode(entry, entry.origin, asked)
            case TaskFailed():
                pid = self._pid(entry.worker_id)
                raise TaskError(failures.task_failed(reply, entry.worker_id, pid, entry.indices))
            case None:
                raise AssertionError("the book handed out a task without a reply")
            case _:
                assert_never(reply)

    def _decode(self, entry: Entry, handle: BatchHandle, asked: float) -> Any:
        # It came another way, its worker's memory all in use: say why if the user can help.
        room = entry.room
        if room is not None and self._book.ahead.held(room):
            why = messages.slots_held(entry.worker_id, room.held_in_worker)
            warnings.warn(why, BatchesHeldWarning, stacklevel=4)
        pinned, batch = self._pin_ahead.take(entry) if self._pin_ahead else (False, None)
        began = time.monotonic()
        if not pinned:
            try:
                batch = handle.open()
            except Exception as exc:
                raise self._undecodable(entry, exc) from None
        decoded = ended = time.monotonic()
        if self._streams and (text := self._streams.batch(entry.worker_id, entry.reply, batch)):
            warnings.warn(text, DuplicateDataWarning, stacklevel=4)
        if not pinned and self._pin is not None:
            batch = self._pin(batch)
            ended = time.monotonic()
        times = (asked, began, decoded, ended)
        self._tally.handed_out(entry, batch, handle, times, self._pin is not None)
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
            raise self._undecodable(entry, exc) from None

    def _undecodable(self, entry: Entry, exc: Exception) -> TaskError:
        pid, epoch = self._pid(entry.worker_id), self._book.epoch
        error = failures.undecodable(exc, entry.worker_id, pid, entry.indices, epoch, entry.seq)
        return TaskError(error)

    def _pid(self, worker_id: int) -> int | None:
        return self._supervisor.pids()[worker_id]


_NOTHING = object()  # a handed-out task with no batch to give the user


def _await_reports_of(
    ref: weakref.ref[MultiprocessIterator],
) -> Callable[[], None] | None:
    """The iterator's wait for its workers' reports (Progress.settle), while it lives."""
    iterator = ref()
    return None if iterator is None else iterator._await_reports
