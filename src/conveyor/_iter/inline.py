"""``num_workers=0``: run each task in the calling process."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from .._task import Collated, Exhausted, Failed, LeftOut, NothingLeft, TaskRunner
from ..config import LoaderConfig, LoaderHistory
from ..errors import add_note
from ..records import LoaderStatistics
from ..sampling import draw_base_seed
from .batches import batch_size_of
from .pinning import pin_batch, pinning_enabled
from .skips import SkipLedger, type_path


class InlineIterator:
    def __init__(self, config: LoaderConfig, history: LoaderHistory) -> None:
        self._config = config
        self._history = history
        self._sampler_iter: Iterator[Any] = iter(config.index_sampler)
        # Drawn as torch draws it, so the generator advances identically.
        draw_base_seed(config.generator)
        self._pin = pinning_enabled(config)
        self._num_yielded = 0
        self._samples_yielded = 0
        self.closed = False
        self._epoch = history.next_epoch()
        self._skips = SkipLedger(history.skipped, config.policy)
        self._skips.start_epoch(self._epoch, config.epoch_samples())
        self._runner = TaskRunner(
            config.dataset,
            iterable=config.iterable,
            auto_collation=config.auto_collation,
            collate_fn=config.collate_fn,
            drop_last=config.drop_last,
            skip_errors=config.policy.skipping,
        )

    def __iter__(self) -> InlineIterator:
        return self

    def __len__(self) -> int:
        return len(self._config.index_sampler)

    def __next__(self) -> Any:
        try:
            batch = self._next_batch()
        except StopIteration:
            self._end()
            raise
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

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
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
            outcome = self._runner.run(next(self._sampler_iter))
            match outcome:
                case Collated(batch=batch, left_out=left_out):
                    self._skip(left_out)
                    return batch
                case NothingLeft(left_out=left_out):
                    self._skip(left_out)
                case Failed(error=error):
                    raise error
                case Exhausted():
                    raise StopIteration

    def _skip(self, left_out: tuple[LeftOut, ...]) -> None:
        for item in left_out:
            error = item.error
            self._skips.record(item.index, None, item.stage.value, type_path(error), str(error))
            if self._skips.over_budget():
                raise add_note(error, self._skips.budget_note())
