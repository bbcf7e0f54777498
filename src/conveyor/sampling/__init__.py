"""Samplers, the batch sampler, and the seeds a loader hands to its workers.

The classes mirror ``torch.utils.data``'s samplers (torch 2.13): same
signatures, defaults, ``len`` and exception types. Two backends draw the
random numbers (``sampling/_rng_backends.py``):

* torch installed: torch's RNG, called in exactly the order torch's samplers
  call it, so a seed (``torch.manual_seed`` or a seeded ``torch.Generator``)
  gives the same indices as torch.
* otherwise, or when ``generator`` is a ``numpy.random.Generator`` or an int
  seed: NumPy. An int seed becomes one ``numpy.random.Generator`` when it is
  assigned, so successive epochs differ yet replay identically.
  ``generator=None`` means fresh OS entropy for every epoch.

Indices are always plain Python ints. The seeds (:func:`draw_base_seed`,
:func:`worker_seeds`) are ``sampling/_seeds.py``'s, re-exported here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar, cast

from conveyor import _torch
from conveyor.sampling import _rng_backends as _draws
from conveyor.sampling._seeds import WorkerSeeds, draw_base_seed, worker_seeds
from conveyor.stateful import is_stateful

# None without torch: then the samplers have no torch class to pass for (see _torch_twin).
torch: Any = _torch.load()

__all__ = [
    "BatchIterator",
    "BatchSampler",
    "InfiniteConstantSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "WorkerSeeds",
    "draw_base_seed",
    "worker_seeds",
]

_T_co = TypeVar("_T_co", covariant=True)

# RandomSampler with replacement draws its indices this many at a time, like torch.
_REPLACEMENT_CHUNK = 32


def _torch_twin(name: str) -> tuple[type, ...]:
    """torch's class of that name, as an extra base when torch is here: code that checks
    ``isinstance(sampler, torch.utils.data.RandomSampler)`` (Lightning deciding whether
    a loader shuffles, for one) sees conveyor's samplers as torch's. Nothing of it is
    inherited that conveyor does not define itself."""
    if torch is None:
        return ()
    return (getattr(torch.utils.data, name),)


# --- samplers ---------------------------------------------------------------


class Sampler(*_torch_twin("Sampler"), Generic[_T_co]):  # type: ignore[misc]
    """Base class: subclasses yield dataset indices (or batches of them) from ``__iter__``.

    ``__len__`` is deliberately not defined here, so that ``len()`` on a
    sampler without one raises ``TypeError`` and ``list()`` still works.
    """

    def __iter__(self) -> Iterator[_T_co]:
        raise NotImplementedError


class SequentialSampler(*_torch_twin("SequentialSampler"), Sampler[int]):  # type: ignore[misc]
    """Yields ``0, 1, ..., len(data_source) - 1``."""

    data_source: Sized  #: what is sampled (only its ``len()`` is used)

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(_draws.UsesGenerator, *_torch_twin("RandomSampler"), Sampler[int]):  # type: ignore[misc]
    """Yields indices of ``data_source`` in random order.

    Without replacement, ``num_samples`` indices are taken from successive
    permutations; with replacement, each index is drawn uniformly. With
    ``generator=None`` under torch, a seed for a private ``torch.Generator`` is
    drawn from torch's global RNG when iteration starts.
    """

    data_source: Sized  #: what is sampled (only its ``len()`` is used)
    replacement: bool  #: draw each index independently (an index may repeat)

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: Any = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                "num_samples should be a positive integer value, "
                f"but got num_samples={self.num_samples}"
            )

    @property
    def num_samples(self) -> int:
        """Indices an epoch yields: ``num_samples`` as given, else ``len(data_source)``."""
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        rng = self._rng if self._rng is not None else _draws.private_generator()
        total = self.num_samples
        if self.replacement:
            for _ in range(total // _REPLACEMENT_CHUNK):
                yield from _draws.randint(rng, n, _REPLACEMENT_CHUNK)
            yield from _draws.randint(rng, n, total % _REPLACEMENT_CHUNK)
        else:
            for _ in range(total // n):
                yield from _draws.permutation(rng, n)
            yield from _draws.permutation(rng, n)[: total % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(
    _draws.UsesGenerator,
    *_torch_twin("SubsetRandomSampler"),  # type: ignore[misc]
    Sampler[int],
):
    """Yields the elements of ``indices`` in random order."""

    indices: Sequence[int]  #: the indices to yield, shuffled

    def __init__(self, indices: Sequence[int], generator: Any = None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        for position in _draws.permutation(self._rng, len(self.indices)):
            yield self.indices[position]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(
    _draws.UsesGenerator,
    *_torch_twin("WeightedRandomSampler"),  # type: ignore[misc]
    Sampler[int],
):
    """Yields ``num_samples`` indices of ``weights``, each drawn with probability ∝ its weight.

    ``weights`` is kept as a float64 ``torch.Tensor`` when torch is installed
    (as torch does), else as a float64 NumPy array.
    """

    weights: Any  #: one weight per index, float64 (a tensor with torch, else an array)
    num_samples: int  #: indices an epoch yields
    replacement: bool  #: draw each index independently (an index may repeat)

    def __init__(
        self,
        weights: Sequence[float],
        num_samples: int,
        replacement: bool = True,
        generator: Any = None,
    ) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        as_array = _draws.as_weights(weights)
        if len(as_array.shape) != 1:
            raise ValueError(
                "weights should be a 1d sequence but given "
                f"weights have shape {tuple(as_array.shape)}"
            )
        self.weights = as_array
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        yield from _draws.multinomial(self._rng, self.weights, self.num_samples, self.replacement)

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(*_torch_twin("BatchSampler"), Sampler[list[int]]):  # type: ignore[misc]
    """Groups the indices of ``sampler`` (any iterable) into lists of ``batch_size``.

    The last, shorter batch is kept unless ``drop_last`` is True.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int],
        batch_size: int,
        drop_last: bool,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> BatchIterator:
        return BatchIterator(self)

    def __len__(self) -> int:
        size = len(cast(Sized, self.sampler))
        if self.drop_last:
            return size // self.batch_size
        return (size + self.batch_size - 1) // self.batch_size


class BatchIterator(Iterator[list[int]]):
    """One pass of a :class:`BatchSampler`; resumable (torchdata's ``Stateful``).

    ``state_dict()`` holds the samples yielded so far and, when the wrapped
    sampler or its iterator is stateful, their own states. ``load_state_dict``
    restores those, or else re-draws and skips the samples already yielded.
    """

    def __init__(self, batch_sampler: BatchSampler) -> None:
        self._owner = batch_sampler
        self._size = batch_sampler.batch_size
        self._drop_last = batch_sampler.drop_last
        # iter(sampler) when first needed, as torch's generator opens it at the first
        # batch: a sampler that draws in __iter__ draws after the loader's base seed.
        self._opened: Iterator[int] | None = None
        self.samples_yielded = 0

    @property
    def _indices(self) -> Iterator[int]:
        if self._opened is None:
            self._opened = iter(self._owner.sampler)
        return self._opened

    @property
    def inner_stateful(self) -> bool:
        """The wrapped sampler or its iterator keeps a state of its own (asking opens it)."""
        return is_stateful(self._owner.sampler) or is_stateful(self._indices)

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> list[int]:
        batch = list(itertools.islice(self._indices, self._size))
        if not batch or (self._drop_last and len(batch) < self._size):
            raise StopIteration
        self.samples_yielded += len(batch)
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The samples yielded so far, and the wrapped sampler's and iterator's states."""
        state: dict[str, Any] = {"samples_yielded": self.samples_yielded}
        if is_stateful(self._owner.sampler):
            state["sampler_state"] = cast(Any, self._owner.sampler).state_dict()
        if is_stateful(self._indices):
            state["sampler_iter_state"] = cast(Any, self._indices).state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the samples ``state`` says were yielded."""
        sampler = self._owner.sampler
        self.samples_yielded = int(state["samples_yielded"])
        if "sampler_state" in state and is_stateful(sampler):
            sampler.load_state_dict(state["sampler_state"])  # type: ignore[union-attr]
        self._opened = iter(sampler)
        if "sampler_iter_state" in state and is_stateful(self._indices):
            cast(Any, self._indices).load_state_dict(state["sampler_iter_state"])
        elif not (is_stateful(sampler) or is_stateful(self._indices)):
            # Nothing remembers where it was: draw again and skip what was yielded.
            for _ in itertools.islice(self._indices, self.samples_yielded):
                pass


class InfiniteConstantSampler(Sampler[None]):
    """Yields None forever: the index stream for iterable-style datasets."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)
