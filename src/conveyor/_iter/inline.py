"""``num_workers=0``: fetch and collate in the calling process."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..sampling import draw_base_seed
from .fetch import IterableFetcher, MapFetcher
from .pinning import pin_batch

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
        from ..collate import collate_context

        index = next(self._sampler_iter)
        data = self._fetcher.fetch(index)
        with collate_context(None if self._loader._is_iterable else _as_list(index)):
            batch = self._fetcher.collate_fn(data)
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


def _as_list(index: Any) -> list[Any]:
    return index if isinstance(index, list) else [index]
