"""torch's own rules for a DataLoader's arguments: what each combination means, and the
exceptions it raises for those it refuses, in torch's words and types (tests compare
them). ``LoaderConfig.from_torch_args`` applies them in torch's order."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any

from conveyor.diagnostics import environment
from conveyor.sampling import _defaults

__all__ = ["Sampling", "sampling", "start_context", "too_many_workers", "worker_arguments"]


def worker_arguments(
    num_workers: int, timeout: float, prefetch_factor: int | None, persistent_workers: bool
) -> int | None:
    """The ``prefetch_factor`` to use (torch's default of 2 with workers), or torch's
    ``ValueError`` for a combination it refuses."""
    if num_workers < 0:
        raise ValueError(
            "num_workers option should be non-negative; "
            "use num_workers=0 to disable multiprocessing."
        )
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(
            "prefetch_factor option could only be specified in multiprocessing. "
            "Let num_workers > 0 to enable multiprocessing, otherwise set "
            "prefetch_factor to None."
        )
    if num_workers > 0 and prefetch_factor is None:
        prefetch_factor = 2
    elif prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    return prefetch_factor


def too_many_workers(num_workers: int) -> str | None:
    """torch's warning when worker processes outnumber the usable CPUs (None: they don't)."""
    cpus = environment.affinity()  # torch counts the affinity mask too
    if num_workers <= cpus:
        return None
    return (
        f"This DataLoader will create {num_workers} worker processes in total. "
        f"Our suggested max number of worker in current system is {cpus}, which is "
        "smaller than what this DataLoader is going to create. Please be aware that "
        "excessive worker creation might get DataLoader running slow or even freeze, "
        "lower the worker number to avoid potential slowness/freeze if necessary."
    )


def start_context(value: str | BaseContext | None, num_workers: int) -> BaseContext | None:
    """``multiprocessing_context`` as torch keeps it (a context object, or None)."""
    if value is None:
        return None
    if num_workers == 0:
        raise ValueError(
            "multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={num_workers}"
        )
    if isinstance(value, str):
        methods = multiprocessing.get_all_start_methods()
        if value not in methods:
            raise ValueError(
                "multiprocessing_context option should specify a valid start method "
                f"in {methods!r}, but got multiprocessing_context={value!r}"
            )
        value = multiprocessing.get_context(value)
    if not isinstance(value, BaseContext):
        raise TypeError(
            "multiprocessing_context option should be a valid context object or a "
            f"string specifying the start method, but got multiprocessing_context={value}"
        )
    return value


@dataclass(frozen=True)
class Sampling:
    """What a loader draws from, as torch's rules leave it."""

    sampler: Any
    batch_sampler: Any  # None without automatic batching
    batch_size: int | None
    drop_last: bool


def sampling(
    dataset: Any,
    *,
    iterable: bool,
    datapipe: bool,
    batch_size: int | None,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
    generator: Any,
) -> Sampling:
    """The sampler and batch sampler torch would make (``datapipe``: an IterDataPipe,
    which shuffles itself), or the ValueError it raises for arguments that exclude
    each other."""
    if iterable:
        _no_sampling_for_iterables(shuffle if not datapipe else None, sampler, batch_sampler)
    else:
        shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                "sampler, and drop_last"
            )
        batch_size, drop_last = None, False
    elif batch_size is None and drop_last:
        raise ValueError(
            "batch_size=None option disables auto-batching and is mutually exclusive with drop_last"
        )
    if sampler is None:  # torch's own classes, as torch's loader makes them (_defaults)
        if iterable:
            sampler = _defaults.endless()
        elif shuffle:
            sampler = _defaults.shuffled(dataset, generator)
        else:
            sampler = _defaults.sequential(dataset)
    if batch_size is not None and batch_sampler is None:
        batch_sampler = _defaults.batches(sampler, batch_size, drop_last)
    return Sampling(sampler, batch_sampler, batch_size, drop_last)


def _no_sampling_for_iterables(shuffle: bool | None, sampler: Any, batch_sampler: Any) -> None:
    """An iterable-style dataset orders itself: torch refuses what would order it."""
    if shuffle not in {False, None}:
        raise ValueError(
            "DataLoader with IterableDataset: expected unspecified shuffle option, "
            f"but got shuffle={shuffle}"
        )
    if sampler is not None:
        raise ValueError(
            "DataLoader with IterableDataset: expected unspecified sampler option, "
            f"but got sampler={sampler}"
        )
    if batch_sampler is not None:
        raise ValueError(
            "DataLoader with IterableDataset: expected unspecified batch_sampler "
            f"option, but got batch_sampler={batch_sampler}"
        )
