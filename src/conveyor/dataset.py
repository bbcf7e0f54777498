"""Dataset base classes for users without torch, and how we tell the kinds apart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T_co = TypeVar("T_co", covariant=True)

__all__ = ["Dataset", "IterableDataset", "is_iterable_dataset"]


class Dataset(Generic[T_co]):
    """A map-style dataset: ``__getitem__`` (and usually ``__len__``)."""

    def __getitem__(self, index: Any) -> T_co:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")


class IterableDataset(Generic[T_co]):
    """An iterable-style dataset: ``__iter__``; shard it with ``get_worker_info()``."""

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


def is_iterable_dataset(dataset: Any) -> bool:
    """Iterable-style, by torch's rule (an ``IterableDataset``) or ours.

    Objects that are not torch datasets count as iterable-style when they
    derive from our ``IterableDataset``, or iterate but cannot be indexed
    (a generator-backed object); lists and arrays stay map-style.
    """
    if isinstance(dataset, IterableDataset):
        return True
    try:
        from torch.utils.data import Dataset as TorchDataset
        from torch.utils.data import IterableDataset as TorchIterableDataset
    except ImportError:
        pass
    else:
        if isinstance(dataset, TorchIterableDataset):
            return True
        if isinstance(dataset, TorchDataset):
            return False
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")
