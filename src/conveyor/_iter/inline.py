"""``num_workers=0``: run each task in the calling process."""

from __future__ import annotations

import time
from typing import Any

from .._datapipes import SharedSeeds, is_datapipe, is_iter_datapipe
from .._datapipes import shard as shard_pipe
from .._fetch import batch_indices
from .._reseed import Reseed, kept_global_rngs
from .._task import Collated, Exhausted, Failed, LeftOut, NothingLeft, TaskRunner
from ..config import LoaderConfig, LoaderHistory
from ..errors import Culprit, WorkerContext, add_note, attach_worker_context
from ..observe.watch import Watch
from ..records import LoaderStatistics
from .batches import batch_size_of
from .cursor import END
from .epoch import EpochStart, warn_past_length
from .pinning import pin_batch, pinning_enabled
from .progress import Progress
from .skips import SkipLedger, type_path
from .state import ResumePoint
from .tally import Tally


class InlineIterator:
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
        self._base_seed = base_seed = start.draw_base_seed(in_process=True)
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
        self._runner = TaskRunner(
            config.dataset,
            iterable=config.iterable,
            auto_collation=config.auto_collation,
            collate_fn=config.collate_fn,
            drop_last=config.drop_last,
            skip_errors=config.policy.skipping,
            resume=worker_state,
        )
        fetcher_error = getattr(self._runner.fetcher, "init_error", None)
        if fetcher_error is not None:
            raise fetcher_error  # iter(dataset) raised: at iter(), as torch raises it
        self.progress = Progress(
            config=config,
            history=history,
            cursor=cursor,
            num_workers=0,
            base_seed=base_seed,
            epoch=self._epoch,
            inline_state=self._runner.state,
        )
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
            outcome = self._run(index)
            match outcome:
                case Collated(batch=batch, left_out=left_out):
                    self._skip(left_out, seq, index)
                    return batch
                case NothingLeft(left_out=left_out):
                    self._skip(left_out, seq, index)
                    self.progress.handed_out(self._cursor.drawn - 1, -1, None, empty=True)
                case Failed(stage=stage, error=error, culprit=culprit):
                    # The user's own exception, with the note a worker's would have.
                    raise self._noted(error, stage.value, seq, index, culprit)
                case Exhausted():
                    raise StopIteration

    def _run(self, index: Any) -> Any:
        if self._config.options.reseed == "worker":
            return self._runner.run(index)
        cursor = self._cursor
        reseed = Reseed(
            self._config.options.reseed,
            self._base_seed,
            self._epoch,
            cursor.drawn - 1,
            cursor.samples_before(cursor.drawn - 1),
            places=cursor.places(cursor.drawn - 1)
            if self._config.options.reseed == "sample"
            else (),
        )
        with kept_global_rngs():
            return self._runner.run(index, reseed=reseed)

    def _skip(self, left_out: tuple[LeftOut, ...], seq: int, index: Any) -> None:
        for item in left_out:
            error = item.error
            self._skips.record(item.index, None, item.stage.value, type_path(error), str(error))
            if self._skips.over_budget():
                noted = self._noted(error, item.stage.value, seq, index, Culprit((item.index,)))
                raise add_note(noted, self._skips.budget_note())

    def _noted(
        self, error: BaseException, stage: str, seq: int, index: Any, culprit: Culprit | None
    ) -> BaseException:
        """``error`` with a note saying where it happened: the batch, the sample."""
        config = self._config
        indices = () if config.iterable else tuple(batch_indices(index, config.auto_collation))
        context = WorkerContext(
            worker_id=None,
            pid=None,
            stage=stage,
            indices=indices,
            epoch=self._epoch,
            seq=seq,
            culprit=culprit,
        )
        return attach_worker_context(error, context)
