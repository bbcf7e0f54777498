"""``num_workers=0``: run each task in the calling process."""

from __future__ import annotations

import warnings
from typing import Any

from .._datapipes import SharedSeeds, is_datapipe, is_iter_datapipe
from .._datapipes import shard as shard_pipe
from .._reseed import Reseed, kept_global_rngs
from .._task import Collated, Exhausted, Failed, LeftOut, NothingLeft, TaskRunner
from ..config import LoaderConfig, LoaderHistory
from ..errors import add_note
from ..records import LoaderStatistics
from ..sampling import draw_base_seed
from ..stateful import load_into
from .batches import batch_size_of
from .cursor import END, SamplerCursor
from .pinning import pin_batch, pinning_enabled
from .progress import Progress, per_worker_why
from .rng import replayed_draw
from .skips import SkipLedger, type_path
from .state import ResumePoint


class InlineIterator:
    def __init__(
        self, config: LoaderConfig, history: LoaderHistory, resume: ResumePoint | None = None
    ) -> None:
        self._config = config
        self._history = history
        if resume is not None:
            resume.check_workers(
                0,
                per_worker=config.iterable or config.dataset_keeps_state,
                why=per_worker_why(config),
            )
            history.skipped[:] = resume.skipped
        finished = resume is not None and resume.finished
        mid = resume if resume is not None and not finished else None
        self._cursor = SamplerCursor(config)
        if is_iter_datapipe(config.dataset):  # where torch draws its shared seed
            SharedSeeds().draw(config.generator, config.dataset)
        base_seed = self._open_epoch(resume)
        if is_datapipe(config.dataset):
            shard_pipe(config.dataset)  # over the ranks
        if resume is not None and resume.epoch is not None:
            history.epochs_started = resume.epoch + (1 if finished else 0)
        self._base_seed = base_seed
        self._done_before = mid.beyond if mid is not None else frozenset()
        self._pin = pinning_enabled(config)
        self._num_yielded = 0
        self._samples_yielded = 0
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
        cursor = self._cursor
        self.progress = Progress(
            config=config,
            history=history,
            cursor=cursor,
            num_workers=0,
            base_seed=base_seed,
            epoch=self._epoch,
            inline_state=self._runner.state,
        )
        if mid is not None:
            cursor.advance(mid.main, mid.delivered, mid.samples)
            self._num_yielded = mid.yielded - mid.replay
            self.progress.start_from(mid)
            for _ in range(mid.replay):  # batches handed out before, fetched again
                try:
                    self._next_batch()
                except StopIteration:
                    break
                self._num_yielded += 1
                self.progress.handed_out(cursor.drawn - 1, -1, None)
        else:
            self.progress.start_from(None)

    def _open_epoch(self, resume: ResumePoint | None) -> int:
        """Open the sampler and draw the base seed in torch's order (its iterator, then
        the seed: a generator they share is consumed identically); returns the seed.

        Resuming mid-epoch restores the random streams after the seed is drawn, and
        keeps the saved seed. After a state taken at an epoch's end, the next epoch
        draws from the generators and torch's global RNG as the epoch left them, and
        the dataset is as it was then.
        """
        config, cursor = self._config, self._cursor
        finished = resume is not None and resume.finished
        if resume is not None and finished:
            if resume.rng_after:
                cursor.streams.restore(resume.rng_after)
            if resume.workers:
                load_into(config.dataset, resume.workers[0].dataset_state)
        if resume is not None and not finished:
            cursor.reopen(resume.main)
        else:
            cursor.start()
        saved_global = resume.global_after if resume is not None and finished else None
        base_seed, after = replayed_draw(
            cursor.streams, saved_global, lambda: draw_base_seed(config.generator)
        )
        if resume is None or finished:
            cursor.replay_first_draw(after)
            return int(base_seed)
        cursor.restore_streams()
        return resume.base_seed if resume.base_seed is not None else int(base_seed)

    def __iter__(self) -> InlineIterator:
        return self

    def __len__(self) -> int:
        return len(self._config.index_sampler)

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        try:
            batch = self._next_batch()
        except StopIteration:
            self._end()
            raise
        except BaseException:
            self.progress.handed_out(self._cursor.drawn - 1, -1, None)  # consumed, as torch
            raise
        self.progress.handed_out(self._cursor.drawn - 1, -1, None)
        self._num_yielded += 1
        self._samples_yielded += batch_size_of(batch)
        len_hint = self._history.iterable_len
        if len_hint is not None and self._num_yielded > len_hint:
            warnings.warn(
                f"Length of IterableDataset {self._config.dataset} was reported to be "
                f"{len_hint} (when accessing len(dataloader)), but {self._num_yielded} "
                "samples have been fetched.",
                UserWarning,
                stacklevel=2,
            )
        return pin_batch(batch) if self._pin else batch

    def close(self) -> None:
        self.closed = True

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self.progress.ended()
            self._skips.log_epoch_summary()
            self._history.last_statistics = self.statistics()

    def statistics(self) -> LoaderStatistics:
        return LoaderStatistics(
            epoch=self._epoch,
            batches=self._num_yielded,
            samples=self._samples_yielded,
            worker_restarts=0,
            tasks_retried=0,
            samples_skipped=len(self._skips.records),
            in_flight=(),
            workers=(),
        )

    def _next_batch(self) -> Any:
        while True:
            seq = self._cursor.drawn
            index = self._cursor.next()
            if index is END:
                raise StopIteration
            if seq in self._done_before:
                continue  # handed out before the state was taken (in_order=False)
            outcome = self._run(index)
            match outcome:
                case Collated(batch=batch, left_out=left_out):
                    self._skip(left_out)
                    return batch
                case NothingLeft(left_out=left_out):
                    self._skip(left_out)
                    self.progress.handed_out(self._cursor.drawn - 1, -1, None, empty=True)
                case Failed(error=error):
                    raise error
                case Exhausted():
                    raise StopIteration

    def _run(self, index: Any) -> Any:
        if self._config.reseed == "worker":
            return self._runner.run(index)
        cursor = self._cursor
        reseed = Reseed(
            self._config.reseed,
            self._base_seed,
            self._epoch,
            cursor.drawn - 1,
            cursor.samples_before(cursor.drawn - 1),
        )
        with kept_global_rngs():
            return self._runner.run(index, reseed=reseed)

    def _skip(self, left_out: tuple[LeftOut, ...]) -> None:
        for item in left_out:
            error = item.error
            self._skips.record(item.index, None, item.stage.value, type_path(error), str(error))
            if self._skips.over_budget():
                raise add_note(error, self._skips.budget_note())
