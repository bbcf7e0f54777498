"""Turn one sampler output into samples, then into a batch.

Shared by the in-process iterator and the worker loop, so that both follow
torch's rules exactly: ``__getitems__`` when the dataset has it, iterable-style
datasets filling a batch until their iterator ends, and ``drop_last``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def batch_indices(index: Any, auto_collation: bool) -> list[Any]:
    """A sampler's output as a list of dataset indices.

    With automatic batching the output is a batch, whatever sequence type the
    batch sampler yields (a tuple too); without it, it is one index, which may
    itself be a tuple (``batch_size=None``).
    """
    if not auto_collation:
        return [index]
    return index if type(index) is list else list(index)


class MapFetcher:
    def __init__(
        self, dataset: Any, auto_collation: bool, collate_fn: Callable[[Any], Any]
    ) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self._getitems = getattr(dataset, "__getitems__", None) or None

    def fetch(self, index: Any) -> Any:
        if not self.auto_collation:
            return self.dataset[index]
        if self._getitems is not None:
            return self._getitems(index)
        return [self.dataset[i] for i in index]

    def fetch_each(
        self,
        index: list[Any],
        *,
        exclude: tuple[Any, ...] = (),
        tolerate: bool = False,
        on_position: Callable[[int], None] | None = None,
    ) -> tuple[list[Any], list[Any], list[tuple[Any, Exception]]]:
        """Fetch sample by sample: slower, but says which one failed.

        Returns the samples, their dataset indices, and (with ``tolerate``)
        the ``(index, exception)`` of each sample that raised.
        """
        samples: list[Any] = []
        kept: list[Any] = []
        failed: list[tuple[Any, Exception]] = []
        for position, i in enumerate(index):
            if i in exclude:
                continue
            if on_position is not None:
                on_position(position)
            try:
                sample = self._getitems([i])[0] if self._getitems else self.dataset[i]
            except Exception as exc:
                if not tolerate:
                    raise
                failed.append((i, exc))
                continue
            samples.append(sample)
            kept.append(i)
        return samples, kept, failed


class IterableFetcher:
    """Pulls from one iterator of an iterable-style dataset.

    ``fetch`` raises StopIteration once the iterator can give no (complete,
    under ``drop_last``) batch any more, and keeps raising it after that.
    """

    def __init__(
        self,
        dataset: Any,
        auto_collation: bool,
        collate_fn: Callable[[Any], Any],
        drop_last: bool,
    ) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        # iter() now, as torch's fetcher does: a dataset's state taken right after the
        # loader's iter() already reflects it.
        self.iterator: Iterator[Any] = iter(())
        self.init_error: Exception | None = None
        self.restart()

    def restart(self) -> None:
        self.ended = False
        self.init_error = None
        try:
            self.iterator = iter(self.dataset)
        except Exception as exc:  # raised by the first fetch, as torch's worker does
            self.iterator, self.init_error = iter(()), exc

    def fetch(self, index: Any) -> Any:
        if self.init_error is not None:
            error, self.init_error = self.init_error, None
            self.ended = True
            raise error
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            try:
                return next(self.iterator)
            except StopIteration:
                self.ended = True
                raise
        data = []
        for _ in index:
            try:
                data.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return data
