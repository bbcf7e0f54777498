"""``num_workers=0``: the training thread runs each task itself, with a worker's core.

A shell around :class:`~conveyor._workers.core.WorkerCore` (``in_training_thread``): the
core reseeds, fetches, leaves failing samples out and collates as it does in every kind
of worker. The shell draws the sampler's positions (each a task, made as the task book
makes its tasks: ``Entry.task()``), keeps the training loop's own random streams around a
reseed, records what was left out against the skip budget as the book does, and raises
the user's exception as it was raised, with the note a worker's would have.
"""

from __future__ import annotations

import time
from typing import Any

from .._task.runner import Collated, Exhausted, Failed, LeftOut, NothingLeft
from .._torch.datapipes import SharedSeeds, is_datapipe, is_iter_datapipe
from .._torch.datapipes import shard as shard_pipe
from .._workers.core import WorkerCore
from .._workers.spec import UserObjects, WorkerSpec
from ..config import LoaderConfig, LoaderHistory
from ..observe.watch import Watch
from ..records import LoaderStatistics
from ..sampling._reseed import kept_global_rngs
from . import failures
from .batches import batch_size_of
from .cursor import END
from .epoch import EpochStart, warn_past_length
from .face import IteratorFace
from .ledger import BATCH, ITERABLE, SINGLE, Entry
from .pinning import pin_batch, pinning_enabled
from .progress import Progress
from .skips import SkipLedger, notes_here
from .state import ResumePoint
from .tally import Tally

_NO_WORKER = -1  # the training thread, as the worker its tasks are for


class InlineIterator(IteratorFace):
    def __init__(
        self, config: LoaderConfig, history: LoaderHistory, resume: ResumePoint | None = None
    ) -> None:
        self._config = config
        self._history = history
        start = EpochStart(config, history, resume, num_workers=0)
        mid = start.mid
        self._cursor = cursor = start.cursor
        if is_iter_datapipe(config.dataset):  # where torch draws its shared seed
            SharedSeeds().draw(config.generator, config.dataset)
        base_seed = start.draw_base_seed(in_process=True)
        if is_datapipe(config.dataset):
            shard_pipe(config.dataset)  # over the ranks
        self._handed_out_before = start.position(0).handed_out_before
        self._pin = pinning_enabled(config)
        self._tally = Tally(0, time.monotonic(), history)
        self._watch = Watch.of(config)
        self.closed = False
        self._epoch = history.next_epoch()
        self._skips = SkipLedger(history.skipped, config.policy)
        self._skips.start_epoch(self._epoch, config.epoch_samples())
        worker_state = mid.workers[0] if mid is not None and mid.num_workers == 0 else None
        spec = WorkerSpec.for_worker(config, _NO_WORKER, base_seed)
        user = UserObjects(config.dataset, config.collate_fn, None)
        self._core = WorkerCore.in_training_thread(spec, user, worker_state)
        self._runner = runner = self._core.runner
        assert runner is not None
        shape = ITERABLE if config.iterable else BATCH if config.auto_collation else SINGLE
        self._shape = shape
        self.progress = Progress(
            config=config, history=history, cursor=cursor, num_workers=0,
            base_seed=base_seed, epoch=self._epoch, inline_state=runner.state,
        )  # fmt: skip
        start.skip_handed_out()
        self.progress.start_from(mid)
        if mid is not None:  # batches handed out before, fetched again: count them

            def fetch() -> None:
                self._next_batch()
                self.progress.handed_out(cursor.drawn - 1, -1, None)

            self._tally.start_epoch(batches=mid.yielded - mid.replay + start.replay(fetch))

    def __iter__(self) -> InlineIterator:
        return self

    def __len__(self) -> int:
        return len(self._config.index_sampler)

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        began = time.monotonic()
        try:
            batch = self._next_batch()
        except StopIteration:
            self._end()
            raise
        except BaseException:
            self.progress.handed_out(self._cursor.drawn - 1, -1, None)  # consumed, as torch
            raise
        self.progress.handed_out(self._cursor.drawn - 1, -1, None)
        # Without workers the loop waits for the whole fetch and collate.
        fetched = time.monotonic()
        assert self._runner is not None
        self._tally.in_process(began, self._runner.fetch_s, self._runner.collate_s)
        if self._pin:
            batch = pin_batch(batch)
        ended = time.monotonic()
        pin_s = self._tally.main_work("pin", fetched, ended) if self._pin else 0.0
        self._tally.waited(began, ended)
        self._tally.delivered(None, batch_size_of(batch), pin_s=pin_s)
        warn_past_length(self._config, self._history, self.progress.yielded, stacklevel=2)
        if self._watch is not None:
            self._watch.batch(self.statistics)
        return batch

    def close(self) -> None:
        self.closed = True

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self.progress.ended()
            self._skips.log_epoch_summary()
            self._history.last_statistics = self.statistics()
            if self._watch is not None:
                self._watch.ended(self._history.last_statistics)

    def statistics(self) -> LoaderStatistics:
        skipped = len(self._skips.records)
        return self._tally.statistics(self._epoch, skipped=skipped, now=time.monotonic())

    def _next_batch(self) -> Any:
        while True:
            seq = self._cursor.drawn
            index = self._cursor.next()
            if index is END:
                raise StopIteration
            if seq in self._handed_out_before:
                continue  # handed out before the state was taken (in_order=False)
            entry = self._entry(seq, index)
            outcome = self._run(entry)
            match outcome:
                case Collated(batch=batch, left_out=left_out):
                    self._skip(left_out, entry)
                    return batch
                case NothingLeft(left_out=left_out):
                    self._skip(left_out, entry)
                    self.progress.handed_out(self._cursor.drawn - 1, -1, None, empty=True)
                case Failed(stage=stage, error=error, culprit=culprit):
                    raise failures.raised_here(
                        error, stage, entry.indices, self._epoch, seq, culprit
                    )
                case Exhausted():
                    raise StopIteration

    def _entry(self, seq: int, index: Any) -> Entry:
        """Output ``seq`` of the sampler as a task; where its samples sit in the epoch
        only matters to a reseed (and costs a look-up)."""
        entry = Entry(self._epoch, seq, _NO_WORKER, index, self._shape, 0.0)
        reseed = self._config.options.reseed
        if reseed != "worker":
            entry.first_sample = self._cursor.samples_before(seq)
            if reseed == "sample":
                entry.places = self._cursor.places(seq)
        return entry

    def _run(self, entry: Entry) -> Any:
        if self._config.options.reseed == "worker":
            return self._core.run_here(entry.task())
        # The training loop's own draws go on as if no task had reseeded anything.
        with kept_global_rngs():
            return self._core.run_here(entry.task())

    def _skip(self, left_out: tuple[LeftOut, ...], entry: Entry) -> None:
        if not left_out:
            return
        spent = self._skips.record_notes(notes_here(left_out), entry.seq, entry.indices)
        if spent is not None:
            raise spent
