"""The samplers a ``DataLoader`` makes for torch's arguments, and how the loop opens them.

With torch installed, a loader built from ``batch_size``/``shuffle`` holds what torch's
``DataLoader`` would hold for the same arguments, *exactly*: torch's own
``SequentialSampler``, ``RandomSampler``, ``BatchSampler`` and ``_InfiniteConstantSampler``
(not conveyor's subclasses of them). Frameworks test ``type(batch_sampler) is
BatchSampler`` (Lightning, before injecting its ``DistributedSampler``), so a subclass
would send them down the path meant for a user's custom batch sampler (DESIGN.md,
invariant 11). Without torch, conveyor's own classes stand in; a ``numpy.random.Generator``
or an int seed (conveyor's, which torch's sampler cannot draw from) gets conveyor's
``RandomSampler``, whose draws are the same as torch's for torch's generators.

What conveyor keeps of a batch sampler's pass (the samples yielded, the states of a
stateful sampler within) lives *beside* the sampler: the loop opens a plain batch sampler,
torch's or conveyor's, as a :class:`~conveyor.sampling.BatchIterator` (:func:`open_index`),
which yields the very batches torch's ``BatchSampler.__iter__`` yields.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor import _torch
from conveyor.sampling import (
    BatchIterator,
    BatchSampler,
    InfiniteConstantSampler,
    RandomSampler,
    SequentialSampler,
)

__all__ = [
    "RunBatches",
    "batches",
    "consecutive_batches",
    "endless",
    "open_index",
    "plain_batches",
    "sequential",
    "shuffled",
]

torch: Any = _torch.load()  # None without torch (or in a worker that defers it)


def _torch_data() -> Any:
    """``torch.utils.data``, or None without torch."""
    return torch.utils.data if torch is not None else None


def sequential(dataset: Any) -> Any:
    data = _torch_data()
    return (data.SequentialSampler if data is not None else SequentialSampler)(dataset)


def shuffled(dataset: Any, generator: Any) -> Any:
    """torch's ``RandomSampler`` for a generator torch draws from (None, a
    ``torch.Generator``); conveyor's for one it cannot (a NumPy generator, an int seed)."""
    data = _torch_data()
    if data is None or not (generator is None or isinstance(generator, torch.Generator)):
        return RandomSampler(dataset, generator=generator)
    return data.RandomSampler(dataset, generator=generator)


def batches(sampler: Any, batch_size: int, drop_last: bool) -> Any:
    data = _torch_data()
    return (data.BatchSampler if data is not None else BatchSampler)(sampler, batch_size, drop_last)


def endless() -> Any:
    """The index stream of an iterable-style dataset: torch's ``_InfiniteConstantSampler``."""
    kind = getattr(torch.utils.data.dataloader, "_InfiniteConstantSampler", None) if torch else None
    return (kind or InfiniteConstantSampler)()


def plain_batches(batch_sampler: Any) -> bool:
    """torch's or conveyor's own ``BatchSampler``, exactly (a subclass may batch otherwise)."""
    kind = type(batch_sampler)
    return kind is BatchSampler or (torch is not None and kind is torch.utils.data.BatchSampler)


def _plain_sequential(sampler: Any) -> bool:
    kind = type(sampler)
    return kind is SequentialSampler or (
        torch is not None and kind is torch.utils.data.SequentialSampler
    )


def consecutive_batches(index_sampler: Any) -> bool:
    """Whether every batch ``index_sampler`` yields is a run of consecutive ints: a plain
    ``BatchSampler`` over a plain ``SequentialSampler`` (the default without ``shuffle``),
    whose iterator draws from a ``range``."""
    return plain_batches(index_sampler) and _plain_sequential(index_sampler.sampler)


def open_index(index_sampler: Any) -> Iterator[Any]:
    """One pass of ``index_sampler``: a plain batch sampler as a resumable
    :class:`BatchIterator` (its state beside it; over a plain sequential sampler, as
    :class:`RunBatches`), anything else as its own iterator."""
    if consecutive_batches(index_sampler):
        return RunBatches(index_sampler)
    if plain_batches(index_sampler):
        return BatchIterator(index_sampler)
    return iter(index_sampler)


class RunBatches(BatchIterator):
    """A plain ``BatchSampler`` over a plain ``SequentialSampler``, drawn as ``range``
    objects: the very indices torch's yields, without their lists. Building a list of 256
    ints for each batch, and freeing it when the batch is handed out, cost the main
    process more than the rest of a batch's bookkeeping; a range crosses to a worker as
    its first value and length anyway, and becomes the list torch's sampler yields where a
    dataset sees it (``batch_indices``). Only the loop opens one: a user iterating the
    batch sampler gets its lists."""

    def __init__(self, batch_sampler: Any) -> None:
        super().__init__(batch_sampler)
        self._end: int | None = None

    def __next__(self) -> Any:
        end = self._end
        if end is None:  # at the first batch, as torch's sampler takes len() in iter()
            end = self._end = len(self._owner.sampler)  # type: ignore[arg-type]
        first = self.samples_yielded
        last = min(first + self._size, end)
        if last <= first or (self._drop_last and last - first < self._size):
            raise StopIteration
        self.samples_yielded = last
        return range(first, last)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the samples ``state`` says were yielded (a sequential sampler
        keeps no state of its own: nothing is drawn to skip them)."""
        self.samples_yielded = int(state["samples_yielded"])
        self._end = None
