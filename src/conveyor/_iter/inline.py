"""``num_workers=0``: fetch and collate in the calling process."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..collate import collate_context
from ..errors import add_note
from ..sampling import draw_base_seed
from .fetch import IterableFetcher, MapFetcher, as_list
from .pinning import pin_batch
from .skips import SkipLedger, type_path

if TYPE_CHECKING:
    from ..loader import DataLoader


class InlineIterator:
    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        self._index_sampler = loader._index_sampler
        self._sampler_iter: Iterator[Any] = iter(self._index_sampler)
        # Drawn as torch draws it, so the generator advances identically.
        draw_base_seed(loader.generator)
        self._pin = loader._pin_memory_enabled()
        self._len_hint = loader._iterable_len_called
        self._num_yielded = 0
        self._skipping = loader._policy.on_error == "skip" and not loader._is_iterable
        self._skips = SkipLedger(loader._skipped_log, loader._policy)
        try:
            epoch_samples: int | None = len(loader.sampler)
        except TypeError:
            epoch_samples = None
        self._skips.start_epoch(loader._next_epoch(), epoch_samples)
        self._fetcher: MapFetcher | IterableFetcher
        if loader._is_iterable:
            self._fetcher = IterableFetcher(
                loader.dataset, loader._auto_collation, loader.collate_fn, loader.drop_last
            )
        else:
            self._fetcher = MapFetcher(loader.dataset, loader._auto_collation, loader.collate_fn)

    def __iter__(self) -> InlineIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self) -> Any:
        try:
            batch = self._next_batch()
        except StopIteration:
            self._skips.log_epoch_summary()
            raise
        self._num_yielded += 1
        if self._len_hint is not None and self._num_yielded > self._len_hint:
            warnings.warn(
                f"Length of IterableDataset {self._loader.dataset} was reported to be "
                f"{self._len_hint} (when accessing len(dataloader)), but {self._num_yielded} "
                "samples have been fetched.",
                UserWarning,
                stacklevel=2,
            )
        return pin_batch(batch) if self._pin else batch

    def _next_batch(self) -> Any:
        while True:
            index = next(self._sampler_iter)
            if not self._skipping:
                data = self._fetcher.fetch(index)
                return self._collate(data, None if self._loader._is_iterable else as_list(index))
            batch = self._fetch_and_collate_skipping(index)
            if batch is not _NOTHING_LEFT:
                return batch

    def _fetch_and_collate_skipping(self, index: Any) -> Any:
        """``on_error="skip"``: leave out samples (or a batch) that raise; record them."""
        assert isinstance(self._fetcher, MapFetcher)
        samples, kept, failed = self._fetcher.fetch_each(as_list(index), tolerate=True)
        for i, exc in failed:
            self._skip(i, "fetch", exc)
        if not samples:
            return _NOTHING_LEFT
        data = samples if self._loader._auto_collation else samples[0]
        try:
            return self._collate(data, kept)
        except Exception as exc:
            for i in kept:
                self._skip(i, "collate", exc)
            return _NOTHING_LEFT

    def _skip(self, index: Any, stage: str, exc: Exception) -> None:
        self._skips.record(index, None, stage, type_path(exc), str(exc))
        if self._skips.over_budget():
            raise add_note(exc, self._skips.budget_note())

    def _collate(self, data: Any, indices: list[Any] | None) -> Any:
        with collate_context(indices):
            return self._fetcher.collate_fn(data)


_NOTHING_LEFT = object()  # every sample of the batch was skipped
