"""Turn one sampler output into samples, then into a batch.

Shared by the in-process iterator and the worker loop, so that both follow
torch's rules exactly: ``__getitems__`` when the dataset has it, iterable-style
datasets filling a batch until their iterator ends, and ``drop_last``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from conveyor.errors import Culprit

_WHOLE_BATCH = Culprit(whole_batch=True)
# Asked before each sample: has the worker been told to stop (truthy)? The loops ask
# it inline, not through a helper: on small samples a call a sample is the worker's
# largest cost after the dataset's own.
StopCheck = Callable[[], object]


class StopRequested(BaseException):
    """Raised between two samples when the worker was told to stop (the interpreter's
    exit, teardown): the batch it was building is abandoned. A BaseException, so that no
    ``except Exception`` of a fetch loop takes it for the dataset's own failure."""


class FetchError(Exception):
    """The dataset raised while fetching: its exception, and which sample it was
    fetching (a :class:`Culprit`). Never reaches the user: the runner unwraps it."""

    def __init__(self, error: Exception, culprit: Culprit) -> None:
        super().__init__(error, culprit)
        self.error = error
        self.culprit = culprit


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

    @property
    def batched(self) -> bool:
        """The dataset fetches a batch at once (``__getitems__``)."""
        return self._getitems is not None

    def fetch(self, index: Any, stop: StopCheck | None = None) -> Any:
        """The samples of ``index``; a :class:`FetchError` if the dataset raises, a
        :class:`StopRequested` if ``stop`` says so before one of them."""
        if not self.auto_collation:
            try:
                return self.dataset[index]
            except Exception as exc:
                raise FetchError(exc, Culprit((index,))) from None
        if self._getitems is not None:
            try:
                return self._getitems(index)
            except Exception as exc:
                raise FetchError(exc, _WHOLE_BATCH) from None
        dataset = self.dataset
        samples = []
        for i in index:  # one by one, so that a failure names its sample
            if stop is not None and stop():
                raise StopRequested
            try:
                samples.append(dataset[i])
            except Exception as exc:
                raise FetchError(exc, Culprit((i,))) from None
        return samples

    def fetch_each(
        self,
        index: list[Any],
        *,
        exclude: tuple[Any, ...] = (),
        tolerate: bool = False,
        on_position: Callable[[int], None] | None = None,
        stop: StopCheck | None = None,
    ) -> tuple[list[Any], list[Any], list[tuple[Any, Exception]]]:
        """Fetch sample by sample: slower, but says which one failed.

        Returns the samples, their dataset indices, and (with ``tolerate``)
        the ``(index, exception)`` of each sample that raised; without, the first
        one raises a :class:`FetchError`.
        """
        samples: list[Any] = []
        kept: list[Any] = []
        failed: list[tuple[Any, Exception]] = []
        for position, i in enumerate(index):
            if i in exclude:
                continue
            if stop is not None and stop():
                raise StopRequested
            if on_position is not None:
                on_position(position)
            try:
                sample = self._getitems([i])[0] if self._getitems else self.dataset[i]
            except Exception as exc:
                if not tolerate:
                    raise FetchError(exc, Culprit((i,))) from None
                failed.append((i, exc))
                continue
            samples.append(sample)
            kept.append(i)
        return samples, kept, failed


class IterableFetcher:
    """Pulls from one iterator of an iterable-style dataset.

    ``fetch`` raises StopIteration once the iterator can give no (complete,
    under ``drop_last``) batch any more, and keeps raising it after that; a
    :class:`FetchError` naming the item's position in the stream if the iterator
    raises.
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
        self.pulled = 0  # items the iterator gave since it started (or was resumed)
        self.resumed = False
        self.restart()

    def restart(self) -> None:
        self.ended = False
        self.init_error = None
        self.pulled, self.resumed = 0, False
        try:
            self.iterator = iter(self.dataset)
        except Exception as exc:  # raised by the first fetch, as torch's worker does
            self.iterator, self.init_error = iter(()), exc

    def fetch(self, index: Any, stop: StopCheck | None = None) -> Any:
        if self.init_error is not None:
            error, self.init_error = self.init_error, None
            self.ended = True
            raise error
        if self.ended:
            raise StopIteration
        wanted = len(index) if self.auto_collation else 1
        data: list[Any] = []
        iterator = self.iterator
        try:
            for _ in range(wanted):
                if stop is not None and stop():
                    raise StopRequested
                data.append(next(iterator))
        except StopIteration:
            self.ended = True
        except Exception as exc:
            item = self.pulled + len(data)
            raise FetchError(exc, Culprit(stream_item=item, resumed=self.resumed)) from None
        finally:
            self.pulled += len(data)
        if not self.auto_collation:
            if not data:
                raise StopIteration
            return data[0]
        if not data or (self.drop_last and len(data) < wanted):
            raise StopIteration
        return data


def stop_in_getitem(
    exc: StopIteration, indices: list[Any] | None, culprit: Culprit | None
) -> RuntimeError:
    """A map-style ``__getitem__`` raised StopIteration: raised as it is, it would end the
    epoch early without a word (torch's loop just stops), so it becomes an error, as
    Python does for a generator (PEP 479)."""
    where = f"dataset indices {indices}"
    if culprit is not None and len(culprit.indices) == 1 and indices != list(culprit.indices):
        where = f"dataset index {culprit.indices[0]!r} (in the batch of {where})"
    error = RuntimeError(
        f"The dataset raised StopIteration while fetching {where}. In a "
        "map-style dataset that would silently end the epoch early, so conveyor raises it "
        "instead. Fix: raise IndexError (or another exception) for a bad index, or make "
        "the dataset an IterableDataset if it is a stream."
    )
    error.__cause__ = exc
    return error
